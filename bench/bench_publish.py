"""The publisher's share of a fan-out cycle, in process, without sockets.

bench_fanout's table and subscribers (a keyed table of --keys rows, --rows-per-tick upserts a
cycle, --full full and --viewport viewport subscribers on --pages pages of --window rows),
with cycles run by hand: the cycle (the table's update and the publisher queueing every
subscriber's message, under the graph's lock) and then what the subscribers' writers do on the
event loop before gRPC (take each message, encode it once per distinct message, iterate its
payloads). Each is timed by the thread's CPU clock, and the median cycle is reported.

The reference is the same cycle with a single full subscriber, built beside it and stepped
alternately with it in the same run (the same machine state for both); printed are both medians,
their ratio, and the cost per subscriber past the first. What the gRPC sends then cost is
bench_fanout's to measure.

    python bench/bench_publish.py [--cycles 200 | --quick]
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pyarrow as pa
from bench_fanout import page_viewports

from tickwire.protocol.barrage import SubscriptionOptions
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph import RowSet
from tickwire.server.engine.publishing import View

SCHEMA = pa.schema([("Key", pa.int64()), ("Value", pa.float64()), ("Ts", pa.int64())])


class Setup:
    """An engine stepped by hand, its table, and subscribers that never block."""

    def __init__(self, keys: int, full: int, viewports: list[tuple[int, int]], seed: int):
        self.keys = keys
        self.rng = np.random.default_rng(seed)
        self.engine = Engine(interval_ms=10_000)
        self.table = self.engine.create(TableSpec("fanout", "keyed", SCHEMA, keys=("Key",)))
        self._write(np.arange(keys, dtype=np.int64), 0)
        self.engine.run_cycle()
        registry = self.engine.publishers()
        opts = SubscriptionOptions()
        self.subs = [registry.subscribe(self.table, View((0, 1, 2)), opts, lambda: None) for _ in range(full)]
        self.subs += [registry.subscribe(self.table, View((0, 1, 2), viewport=RowSet(lo, hi)), opts, lambda: None)
                      for lo, hi in viewports]
        self.drain()  # the initial snapshots

    def _write(self, k: np.ndarray, ts: int) -> None:
        self.engine.write(self.table, pa.table({"Key": k, "Value": self.rng.random(k.size),
                                                "Ts": np.full(k.size, ts, dtype=np.int64)}, schema=SCHEMA), wait=False)

    def drain(self) -> int:
        """What the writers do before gRPC: take every message and iterate its payloads."""
        n = 0
        for s in self.subs:
            while (m := s.take()) is not None:
                for _p in m.payloads(s.encode):
                    n += 1
        return n

    def step(self, rows: int, i: int) -> tuple[float, float, int]:
        """One cycle of `rows` upserts: (cycle CPU s, writers' CPU s, payloads)."""
        self._write(self.rng.choice(self.keys, rows, replace=False).astype(np.int64), i)
        t0 = time.thread_time()
        self.engine.run_cycle()
        t1 = time.thread_time()
        n = self.drain()
        return t1 - t0, time.thread_time() - t1, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rows-per-tick", type=int, default=500)
    ap.add_argument("--full", type=int, default=100)
    ap.add_argument("--viewport", type=int, default=1000)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="40 cycles")
    args = ap.parse_args()
    if args.quick:
        args.cycles = 40

    viewports = page_viewports(args.keys, args.window, args.pages, args.viewport)  # bench_fanout's
    fan = Setup(args.keys, args.full, viewports, seed=1)
    one = Setup(args.keys, 1, [], seed=1)
    costs: dict[str, list[tuple[float, float, int]]] = {"fan": [], "one": []}
    for i in range(1, args.cycles + 1):  # alternately: both see the same machine
        costs["fan"].append(fan.step(args.rows_per_tick, i))
        costs["one"].append(one.step(args.rows_per_tick, i))

    def med(k: str, j: int) -> float:
        return statistics.median(c[j] for c in costs[k])

    subs = args.full + args.viewport
    total_fan, total_one = med("fan", 0) + med("fan", 1), med("one", 0) + med("one", 1)
    print(f"table: {args.keys:,} keyed rows, {args.rows_per_tick} upserts per cycle, {args.cycles} cycles; "
          f"median CPU per cycle")
    print(f"  {args.full} full + {args.viewport} viewport subscribers: cycle {med('fan', 0) * 1e3:.2f} ms, "
          f"writers before gRPC {med('fan', 1) * 1e3:.2f} ms ({statistics.median(c[2] for c in costs['fan']):.0f} "
          f"payloads)")
    print(f"  reference, one full subscriber: cycle {med('one', 0) * 1e3:.2f} ms, "
          f"writers before gRPC {med('one', 1) * 1e3:.2f} ms")
    print(f"  ratio {subs:,} subscribers / one: {total_fan / total_one:.1f}; "
          f"{(total_fan - total_one) / max(1, subs - 1) * 1e6:.1f} us per further subscriber")


if __name__ == "__main__":
    main()
