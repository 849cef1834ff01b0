"""Update-graph costs: does a cycle's cost follow the change rather than the table?

1. Per-cycle cost of a 1,000-row upsert (half new keys, half modifications) into a keyed table of
   10k rows and of 10M rows (1M with --quick), measured in the same run; prints the ratio
   (target <= 1.2).
2. Append throughput: rows/s appended through an append-only table in 100k-row batches
   (target >= 1M rows/s), with the same rows' Arrow concatenation as the reference; then in
   1,000-row inputs with one cycle each, and from a producer thread while the engine runs its
   cycles on its own thread at 100 ms.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec

SCHEMA = pa.schema([("id", pa.int64()), ("px", pa.float64()), ("qty", pa.int64()), ("sym", pa.string())])


def rows(ids: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = ids.size
    return pa.table({"id": pa.array(ids), "px": pa.array(rng.random(n)), "qty": pa.array(rng.integers(0, 100, n)),
                     "sym": pa.array(np.char.add("S", (ids % 500).astype(str)).astype(object))}, schema=SCHEMA)


def upsert_cycle_cost(table_rows: int, cycles: int, rng) -> float:
    engine = Engine()  # stepped here with run_cycle()
    t = engine.create(TableSpec("k", "keyed", SCHEMA, keys=("id",)))
    chunk = 1_000_000
    for start in range(0, table_rows, chunk):
        engine.write(t, rows(np.arange(start, min(table_rows, start + chunk), dtype=np.int64), rng), wait=False)
        engine.run_cycle()
    next_id = table_rows
    times = []
    for _ in range(cycles):
        existing = rng.choice(table_rows, 500, replace=False).astype(np.int64)
        new = np.arange(next_id, next_id + 500, dtype=np.int64)
        next_id += 500
        batch = rows(np.concatenate((existing, new)), rng)
        t0 = time.perf_counter()
        engine.write(t, batch, wait=False)
        up = engine.run_cycle()["k"]
        times.append(time.perf_counter() - t0)
        assert len(up.added) == 500 and len(up.modified) == 500
    return statistics.median(times)


def append_rate(total: int, batch: int, rng) -> tuple[float, float]:
    engine = Engine()  # stepped here with run_cycle()
    t = engine.create(TableSpec("a", "append", SCHEMA))
    data = rows(np.arange(batch, dtype=np.int64), rng)
    t0 = time.perf_counter()
    for _ in range(total // batch):
        engine.write(t, data, wait=False)
        engine.run_cycle()
    tw = time.perf_counter() - t0
    t0 = time.perf_counter()
    pa.concat_tables([data] * (total // batch)).combine_chunks()
    tr = time.perf_counter() - t0
    assert t.size == total
    return total / tw, total / tr


def threaded_append_rate(total: int, batch: int, rng) -> float:
    """Rows/s applied while a producer thread adds `total` rows in `batch`-row inputs as fast as
    it can (keeping at most 1M rows queued) and the engine runs its cycles on its own thread at the
    default 100 ms interval; timed until the last row is in the table."""
    import threading
    engine = Engine(interval_ms=100)
    t = engine.create(TableSpec("a", "append", SCHEMA))
    data = rows(np.arange(batch, dtype=np.int64), rng)

    def produce():
        sent = 0
        while sent < total:
            if t.pending_rows() < 1_000_000:
                engine.write(t, data, wait=False)  # queued: the producer does not wait for the cycle
                sent += batch
            else:
                time.sleep(0.001)

    engine.start()
    th = threading.Thread(target=produce)
    t0 = time.perf_counter()
    th.start()
    th.join()
    while t.size < total:
        time.sleep(0.001)
    elapsed = time.perf_counter() - t0
    engine.stop()
    return total / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    big = 1_000_000 if args.quick else 10_000_000
    small_cost = upsert_cycle_cost(10_000, 30, rng)
    big_cost = upsert_cycle_cost(big, 30, rng)
    print(f"1,000-row upsert cycle: {small_cost * 1e3:.2f} ms on 10k rows, {big_cost * 1e3:.2f} ms on {big:,} rows; "
          f"ratio {big_cost / small_cost:.2f} (target <= 1.2)")
    rate, ref = append_rate(2_000_000, 100_000, rng)
    print(f"append: {rate / 1e6:.2f} M rows/s (target >= 1.0); reference Arrow concatenation {ref / 1e6:.1f} M rows/s; "
          f"ratio {rate / ref:.3f}")
    small, _ = append_rate(1_000_000, 1_000, rng)
    print(f"append in 1,000-row inputs, one cycle each: {small / 1e6:.2f} M rows/s")
    threaded = threaded_append_rate(10_000_000, 10_000, rng)
    print(f"append from a producer thread (10,000-row inputs) with the graph on its thread at 100 ms: "
          f"{threaded / 1e6:.2f} M rows/s applied")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
