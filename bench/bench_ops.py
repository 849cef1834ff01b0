"""Derived tables: does a cycle of sort and of where cost what the change costs, not the table?

A keyed table of 10k rows and one of 10M rows (1M with --quick) get the same traffic: each cycle
upserts 1,000 rows (500 existing keys with a new price, 500 new keys). A sort on the price and a
where on the price follow each table; the per-cycle cost of each operation is the time it spends
following its parent's update (`cycle_seconds`, median and mean over the measured cycles, after
warm-up cycles). The two tables live in one process and their cycles alternate, so the machine's
drift weighs on both alike. Prints both costs and their ratio (target <= 1.2), with what the
updates held; `--read-rowset` also measures the where when its row set is read after every cycle.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine import Engine, TableSpec

SCHEMA = pa.schema([("id", pa.int64()), ("px", pa.float64()), ("qty", pa.int64())])


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = ids.size
    return pa.table({"id": pa.array(ids), "px": pa.array(rng.random(n)), "qty": pa.array(rng.integers(0, 100, n))},
                    schema=SCHEMA)


class Setup:
    """One keyed table of `table_rows` rows with a sort and a where on the price."""

    def __init__(self, table_rows: int, seed: int, read_rowset: bool):
        self.rng = np.random.default_rng(seed)
        self.read_rowset = read_rowset
        self.engine = engine = Engine()  # stepped here with run_cycle()
        self.t = t = engine.create(TableSpec("k", "keyed", SCHEMA, keys=("id",)))
        chunk = 1_000_000
        for start in range(0, table_rows, chunk):
            engine.write(t, rows(np.arange(start, min(table_rows, start + chunk), dtype=np.int64), self.rng),
                         wait=False)
            engine.run_cycle()
        t0 = time.perf_counter()
        self.by_px = t.sort("px")
        self.build_sort = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.cheap = t.where(pc.field("px") < 0.5)
        self.build_where = time.perf_counter() - t0
        self.moved = []
        self.by_px.add_listener(
            lambda tab, up, step: self.moved.append(0 if tab._moves is None else tab._moves[0].size))
        self.stats = {"sort": [], "where": [], "cycle": []}
        self.held = dict.fromkeys(("sort_added", "sort_removed", "sort_modified", "sort_shift_ranges",
                                   "sort_shifted_rows", "where_added", "where_removed", "where_modified"), 0)
        self.next_id = table_rows
        self.cycles = 0

    def cycle(self, record: bool) -> None:
        rng, t = self.rng, self.t
        existing = rng.choice(self.next_id, 500, replace=False).astype(np.int64)
        new = np.arange(self.next_id, self.next_id + 500, dtype=np.int64)
        self.next_id += 500
        self.engine.write(t, rows(np.concatenate((existing, new)), rng), wait=False)
        t0 = time.perf_counter()
        ups = self.engine.run_cycle()
        elapsed = time.perf_counter() - t0
        t1 = time.perf_counter()
        if self.read_rowset:
            self.cheap._fold()  # what the first read of its row set in a cycle does
        fold = time.perf_counter() - t1
        assert len(ups["k"].added) == 500 and len(ups["k"].modified) == 500
        if not record:
            return
        self.cycles += 1
        st, held = self.stats, self.held
        st["cycle"].append(elapsed)
        st["sort"].append(self.by_px.cycle_seconds[-1])
        st["where"].append(self.cheap.cycle_seconds[-1] + fold)
        us, uw = ups[self.by_px.name], ups.get(self.cheap.name)
        held["sort_added"] += len(us.added)
        held["sort_removed"] += len(us.removed)
        held["sort_modified"] += len(us.modified)
        held["sort_shift_ranges"] += len(us.shifted)
        held["sort_shifted_rows"] += self.moved[-1]
        if uw is not None:
            held["where_added"] += len(uw.added)
            held["where_removed"] += len(uw.removed)
            held["where_modified"] += len(uw.modified)

    def result(self) -> dict:
        out = {k: statistics.median(v) for k, v in self.stats.items()}
        out.update({f"{k}_mean": statistics.fmean(v) for k, v in self.stats.items()})
        out.update({k: v / self.cycles for k, v in self.held.items()})
        out.update(build_sort=self.build_sort, build_where=self.build_where, rows=self.by_px.size)
        return out


def measure_pair(big: int, cycles: int, warmup: int, read_rowset: bool = False) -> tuple[dict, dict]:
    """Both tables in one process, cycles interleaved (small, big, small, ...), so whatever the
    machine does meanwhile weighs on both alike."""
    small_s, big_s = Setup(10_000, 1, read_rowset), Setup(big, 1, read_rowset)
    for i in range(warmup + cycles):
        for s in (small_s, big_s):
            s.cycle(record=i >= warmup)
    return small_s.result(), big_s.result()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1M rows instead of 10M")
    ap.add_argument("--cycles", type=int, default=150)
    ap.add_argument("--read-rowset", action="store_true",
                    help="also measure the where with its row set read after every cycle")
    args = ap.parse_args()
    big = 1_000_000 if args.quick else 10_000_000
    small_r, big_r = measure_pair(big, args.cycles, 10)
    for op in ("sort", "where"):
        s, b = small_r[op], big_r[op]
        sm, bm = small_r[f"{op}_mean"], big_r[f"{op}_mean"]
        print(f"{op}: 1,000-row change per cycle (median): {s * 1e3:.3f} ms on 10k rows, {b * 1e3:.3f} ms on "
              f"{big:,} rows; ratio {b / s:.2f} (target <= 1.2); mean {sm * 1e3:.3f} / {bm * 1e3:.3f} ms, "
              f"ratio {bm / sm:.2f}")
    print(f"whole cycle (keyed source + sort + where): {small_r['cycle'] * 1e3:.2f} ms on 10k rows, "
          f"{big_r['cycle'] * 1e3:.2f} ms on {big:,} rows")
    for name, r in (("10k", small_r), (f"{big:,}", big_r)):
        print(f"per cycle on {name} rows: sort +{r['sort_added']:.0f} -{r['sort_removed']:.0f} "
              f"~{r['sort_modified']:.0f}, {r['sort_shift_ranges']:.1f} shift ranges moving "
              f"{r['sort_shifted_rows']:.1f} rows; where +{r['where_added']:.0f} -{r['where_removed']:.0f} "
              f"~{r['where_modified']:.0f}; built sort in {r['build_sort']:.2f} s, where in {r['build_where']:.2f} s")
    if args.read_rowset:
        s_r, b_r = measure_pair(big, args.cycles, 10, read_rowset=True)
        s, b = s_r["where"], b_r["where"]
        print(f"where with its row set read after every cycle (median): {s * 1e3:.3f} ms on 10k rows, "
              f"{b * 1e3:.3f} ms on {big:,} rows; ratio {b / s:.2f}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
