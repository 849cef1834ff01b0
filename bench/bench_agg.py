"""Aggregations: does a cycle of agg_by cost what the change costs, not the table?

A keyed table of 10,000,000 rows in 100,000 groups (1,000,000 rows in 10,000 groups with --quick)
and one of 10,000 rows whose group keys come from the same key space (so about as many groups as
rows, and a 1,000-row change touches about as many groups in both) get the same traffic: each cycle
changes 1,000 rows — 400 existing rows get new values (a quarter of them move to another group),
300 new rows arrive and 300 rows are deleted. Two aggregations follow each table, grouped by `g`:
one of the linear kinds (sum, avg, count) and one of the ordered kinds (min, max, median). The
per-cycle cost of each is the time it spends following its parent's update (`cycle_seconds`,
median over the measured cycles after warm-up); the two tables live in one process and their cycles
alternate, so the machine's drift weighs on both alike. Prints both costs and their ratio (target
<= 1.2), and the build time of each aggregation on the large table.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph.ops import Agg

SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.int64()), ("px", pa.float64()), ("qty", pa.int64())])
LINEAR = [Agg("sum", "qty", "Qty"), Agg("avg", "px", "AvgPx"), Agg("count", name="N")]
ORDERED = [Agg("min", "px", "Lo"), Agg("max", "px", "Hi"), Agg("median", "qty", "MedQty")]


def rows(ids: np.ndarray, groups: int, rng: np.random.Generator) -> pa.Table:
    n = ids.size
    return pa.table({"id": ids, "g": rng.integers(0, groups, n), "px": rng.random(n) * 100,
                     "qty": rng.integers(0, 1000, n)}, schema=SCHEMA)


class Setup:
    def __init__(self, table_rows: int, groups: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.groups = groups
        self.engine = engine = Engine()  # stepped here with run_cycle()
        self.t = t = engine.create(TableSpec("k", "keyed", SCHEMA, keys=("id",)))
        # each id's group, kept here: the table's row keys are not its ids once deleted keys are reused
        self.group_of = np.zeros(table_rows, dtype=np.int64)
        chunk = 1_000_000
        for start in range(0, table_rows, chunk):
            ids = np.arange(start, min(table_rows, start + chunk), dtype=np.int64)
            batch = rows(ids, groups, self.rng)
            self.group_of[ids] = batch["g"].to_numpy()
            engine.write(t, batch, wait=False)
            engine.run_cycle()
        self.live = np.arange(table_rows, dtype=np.int64)
        self.next_id = table_rows
        self.build = {}
        t0 = time.perf_counter()
        self.linear = t.agg_by(LINEAR, "g")
        self.build["linear"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.ordered = t.agg_by(ORDERED, "g")
        self.build["ordered"] = time.perf_counter() - t0
        self.stats: dict[str, list[float]] = {"linear": [], "ordered": []}

    def cycle(self, record: bool) -> None:
        rng = self.rng
        pick = rng.choice(self.live.size, 700, replace=False)
        changed, gone = self.live[pick[:400]], self.live[pick[400:]]
        new = np.arange(self.next_id, self.next_id + 300, dtype=np.int64)
        self.next_id += 300
        upd = rows(changed, self.groups, rng)
        keep_group = rng.random(400) < 0.75  # three quarters stay in their group
        upd = upd.set_column(1, "g", pa.array(np.where(keep_group, self.group_of[changed], upd["g"].to_numpy())))
        added = rows(new, self.groups, rng)
        if self.next_id > self.group_of.size:
            self.group_of = np.concatenate((self.group_of, np.zeros(self.group_of.size, dtype=np.int64)))
        self.group_of[changed] = upd["g"].to_numpy()
        self.group_of[new] = added["g"].to_numpy()
        with self.engine.writes(wait=False) as w:
            w.write(self.t, pa.concat_tables([upd, added]))
            w.write(self.t, delete=pa.table({"id": gone}))
        mask = np.ones(self.live.size, dtype=bool)
        mask[pick[400:]] = False
        self.live = np.concatenate((self.live[mask], new))
        n_lin, n_ord = len(self.linear.cycle_seconds), len(self.ordered.cycle_seconds)
        self.engine.run_cycle()
        if record:
            if len(self.linear.cycle_seconds) > n_lin:
                self.stats["linear"].append(self.linear.cycle_seconds[-1])
            if len(self.ordered.cycle_seconds) > n_ord:
                self.stats["ordered"].append(self.ordered.cycle_seconds[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1M rows in 10k groups instead of 10M in 100k")
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    big_rows, big_groups = (1_000_000, 10_000) if args.quick else (10_000_000, 100_000)
    t0 = time.perf_counter()
    big = Setup(big_rows, big_groups, 1)
    small = Setup(10_000, big_groups, 2)
    print(f"set up in {time.perf_counter() - t0:.1f} s; agg_by build on {big_rows:,} rows: "
          f"linear {big.build['linear']:.2f} s, ordered {big.build['ordered']:.2f} s")
    for i in range(args.warmup + args.cycles):
        for s in (small, big):
            s.cycle(record=i >= args.warmup)
    for kind, what in (("linear", "sum/avg/count"), ("ordered", "min/max/median")):
        sm = statistics.median(small.stats[kind])
        bg = statistics.median(big.stats[kind])
        print(f"{what}: 1,000-row change per cycle (median): {sm * 1e3:.2f} ms on 10,000 rows, "
              f"{bg * 1e3:.2f} ms on {big_rows:,} rows / {big_groups:,} groups; ratio {bg / sm:.2f} (target <= 1.2)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
