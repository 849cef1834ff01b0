"""Derived tables: does a cycle of sort and of where cost what the change costs, not the table?

A keyed table of 10k rows and one of 10M rows (1M with --quick) get the same traffic: each cycle
upserts 1,000 rows (500 existing keys with a new price, 500 new keys). A sort on the price and a
where on the price follow each table; the per-cycle cost of each operation is the time it spends
following its parent's update (`cycle_seconds`, median over the measured cycles, after warm-up
cycles). Prints both costs and their ratio (target <= 1.2), with what the updates held.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.graph import UpdateGraph

SCHEMA = pa.schema([("id", pa.int64()), ("px", pa.float64()), ("qty", pa.int64())])


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = ids.size
    return pa.table({"id": pa.array(ids), "px": pa.array(rng.random(n)), "qty": pa.array(rng.integers(0, 100, n))},
                    schema=SCHEMA)


def measure(table_rows: int, cycles: int, warmup: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    g = UpdateGraph()
    t = g.keyed_table("k", SCHEMA, ["id"])
    chunk = 1_000_000
    for start in range(0, table_rows, chunk):
        t.add(rows(np.arange(start, min(table_rows, start + chunk), dtype=np.int64), rng))
        g.run_cycle()
    t0 = time.perf_counter()
    by_px = t.sort("px")
    build_sort = time.perf_counter() - t0
    t0 = time.perf_counter()
    cheap = t.where(pc.field("px") < 0.5)
    build_where = time.perf_counter() - t0
    moved = []
    by_px.add_listener(lambda tab, up, step: moved.append(0 if tab._moves is None else tab._moves[0].size))
    stats = {"sort": [], "where": [], "cycle": []}
    held = {"sort_added": 0, "sort_removed": 0, "sort_modified": 0, "sort_shift_ranges": 0, "sort_shifted_rows": 0,
            "where_added": 0, "where_removed": 0, "where_modified": 0}
    next_id = table_rows
    for i in range(warmup + cycles):
        existing = rng.choice(next_id, 500, replace=False).astype(np.int64)
        new = np.arange(next_id, next_id + 500, dtype=np.int64)
        next_id += 500
        t.add(rows(np.concatenate((existing, new)), rng))
        t0 = time.perf_counter()
        ups = g.run_cycle()
        elapsed = time.perf_counter() - t0
        assert len(ups["k"].added) == 500 and len(ups["k"].modified) == 500
        if i < warmup:
            continue
        stats["cycle"].append(elapsed)
        stats["sort"].append(by_px.cycle_seconds[-1])
        stats["where"].append(cheap.cycle_seconds[-1])
        us, uw = ups[by_px.name], ups.get(cheap.name)
        held["sort_added"] += len(us.added)
        held["sort_removed"] += len(us.removed)
        held["sort_modified"] += len(us.modified)
        held["sort_shift_ranges"] += len(us.shifted)
        held["sort_shifted_rows"] += moved[-1]
        if uw is not None:
            held["where_added"] += len(uw.added)
            held["where_removed"] += len(uw.removed)
            held["where_modified"] += len(uw.modified)
    out = {k: statistics.median(v) for k, v in stats.items()}
    out.update({k: v / cycles for k, v in held.items()})
    out.update(build_sort=build_sort, build_where=build_where, rows=by_px.size)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1M rows instead of 10M")
    ap.add_argument("--cycles", type=int, default=40)
    args = ap.parse_args()
    big = 1_000_000 if args.quick else 10_000_000
    small_r = measure(10_000, args.cycles, 10, seed=1)
    big_r = measure(big, args.cycles, 10, seed=1)
    for op in ("sort", "where"):
        s, b = small_r[op], big_r[op]
        print(f"{op}: 1,000-row change per cycle: {s * 1e3:.3f} ms on 10k rows, {b * 1e3:.3f} ms on {big:,} rows; "
              f"ratio {b / s:.2f} (target <= 1.2)")
    print(f"whole cycle (keyed source + sort + where): {small_r['cycle'] * 1e3:.2f} ms on 10k rows, "
          f"{big_r['cycle'] * 1e3:.2f} ms on {big:,} rows")
    for name, r in (("10k", small_r), (f"{big:,}", big_r)):
        print(f"per cycle on {name} rows: sort +{r['sort_added']:.0f} -{r['sort_removed']:.0f} "
              f"~{r['sort_modified']:.0f}, {r['sort_shift_ranges']:.1f} shift ranges moving "
              f"{r['sort_shifted_rows']:.1f} rows; where +{r['where_added']:.0f} -{r['where_removed']:.0f} "
              f"~{r['where_modified']:.0f}; built sort in {r['build_sort']:.2f} s, where in {r['build_where']:.2f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
