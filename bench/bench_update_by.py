"""update_by: does appending to a huge bucketed table cost what the append costs?

An append table of 10,000,000 rows (1,000,000 with --quick) and one of 10,000 rows, each spread over
10,000 buckets (`Sym`), carry three update_by tables each: `cum_sum`, `ema_tick(10)` and
`rolling_avg_tick(rev_ticks=100)`, by `Sym`. Each cycle appends 1,000 rows (random buckets) to both
tables. The per-cycle cost of an update_by is the time it spends following its parent's update
(`cycle_seconds`, median over the measured cycles after warm-up); both tables live in one process
and their cycles alternate, so the machine's drift weighs on both alike. Prints both costs and
their ratio per operation (target <= 1.2), and the build time of each on the large table.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine import updateby as U

BUCKETS = 10_000
APPEND = 1_000
SCHEMA = pa.schema([("Sym", pa.int64()), ("Px", pa.float64())])
OPS = {"cum_sum": lambda: U.cum_sum("Total=Px"), "ema_tick": lambda: U.ema_tick(10, "Ema=Px"),
       "rolling_avg_tick": lambda: U.rolling_avg_tick("Avg=Px", rev_ticks=100)}


def rows(rng: np.random.Generator, n: int) -> pa.Table:
    return pa.table({"Sym": rng.integers(0, BUCKETS, n), "Px": rng.random(n) * 100}, schema=SCHEMA)


class Setup:
    def __init__(self, table_rows: int, seed: int):
        self.rng = rng = np.random.default_rng(seed)
        self.engine = engine = Engine()  # stepped here with run_cycle()
        self.src = engine.create(TableSpec("src", "append", SCHEMA))
        chunk = 1_000_000
        for start in range(0, table_rows, chunk):
            engine.write(self.src, rows(rng, min(chunk, table_rows - start)), wait=False)
            engine.run_cycle()
        self.build: dict[str, float] = {}
        self.tables = {}
        for name, make in OPS.items():
            t0 = time.perf_counter()
            self.tables[name] = self.src.update_by([make()], "Sym", name=name)
            self.build[name] = time.perf_counter() - t0
        self.stats: dict[str, list[float]] = {name: [] for name in OPS}

    def cycle(self, record: bool) -> None:
        self.engine.write(self.src, rows(self.rng, APPEND), wait=False)
        before = {n: len(t.cycle_seconds) for n, t in self.tables.items()}
        self.engine.run_cycle()
        if record:
            for n, t in self.tables.items():
                if len(t.cycle_seconds) > before[n]:
                    self.stats[n].append(t.cycle_seconds[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a table of 1M rows instead of 10M")
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    big_rows = 1_000_000 if args.quick else 10_000_000
    t0 = time.perf_counter()
    big = Setup(big_rows, 1)
    small = Setup(10_000, 2)
    print(f"set up in {time.perf_counter() - t0:.1f} s; build on {big_rows:,} rows: " +
          ", ".join(f"{n} {s:.2f} s" for n, s in big.build.items()))
    for i in range(args.warmup + args.cycles):
        for s in (small, big):
            s.cycle(record=i >= args.warmup)
    for n in OPS:
        sm, bg = statistics.median(small.stats[n]), statistics.median(big.stats[n])
        print(f"{n} append {APPEND:,} rows: big {bg * 1e3:.2f} ms, small {sm * 1e3:.2f} ms, ratio {bg / sm:.2f} "
              f"(target <= 1.2; {big_rows:,} vs 10,000 rows, {BUCKETS:,} buckets)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
