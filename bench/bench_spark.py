"""Spark Structured Streaming into tickwire tables (tickwire.server.adapters.spark), on a local[2] session.

1. Micro-batch floor: median time between consecutive micro-batches of a `rate-micro-batch`
   stream (10 rows a batch, checkpointed) with a do-nothing `foreachBatch`, and with a tickwire
   sink, in a fresh JVM (after a warm-up query) with Spark's stock local filesystem and in
   another with tickwire's non-forking one; prints stock / non-forking as a ratio (target:
   <= 25 ms with it).
2. Arrow conversion inside `foreachBatch`: `DataFrame.toArrow()` against `_collect_as_arrow`
   (what the sink uses), the `__arrow_c_stream__` interface (mapInArrow + toLocalIterator) and
   `toPandas()` (reference), 1k, 100k and 1M rows of 4 columns (7, 5 and 3 rounds, order rotated).
3. Throughput: rows/s from Spark into an append-only table for 10k, 100k and 1M-row batches
   (wall time over consecutive batches, Spark's own work included; the engine runs its cycles on
   its thread at 20 ms and the sink waits for each batch's cycle), with the sink's share.
4. Latency: a Barrage subscriber (tickwire's client) on a served table fed 1,000-row batches;
   p50/p99 from the sink queuing a batch (what Spark commits) to the client's callback for that
   update, and from the end of the cycle that applied it; Spark's batch time separately.

`--quick` skips 1 and 2. A default run takes 1.5 to 2 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def trades_stream(spark, rows_per_batch: int):
    from pyspark.sql import functions as F

    return (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", rows_per_batch)
            .option("numPartitions", 2).load()
            .select(F.concat(F.lit("SYM"), (F.col("value") % 20).cast("string")).alias("Sym"),
                    (F.col("value") * 0.01).alias("Price"), (F.col("value") % 1000).cast("int").alias("Size"),
                    F.col("value").alias("Seq"), F.col("timestamp").alias("Ts")))


def run_batches(df, fn, count: int, checkpoint: Path, timeout: float = 120.0) -> list[float]:
    """Runs `fn` on `count` consecutive micro-batches; returns each callback's start time."""
    starts: list[float] = []
    done = threading.Event()

    def cb(batch_df, batch_id):
        if done.is_set():
            return
        starts.append(time.perf_counter())
        fn(batch_df, batch_id)
        if len(starts) >= count:
            done.set()

    q = df.writeStream.foreachBatch(cb).option("checkpointLocation", str(checkpoint)).start()
    ok = done.wait(timeout)
    q.stop()
    if not ok:
        raise RuntimeError(f"only {len(starts)} of {count} micro-batches in {timeout:.0f} s")
    return starts


# ------------------------------------------------------------------------------------------------
# 1. floor (child processes: the filesystem is fixed when the JVM starts)
# ------------------------------------------------------------------------------------------------

def floor_child(filesystem: str) -> None:
    from tickwire.server.adapters.spark import sink, spark_session
    from tickwire.server.engine import Engine

    spark = spark_session("bench-floor", filesystem=filesystem)
    tmp = Path(tempfile.mkdtemp(prefix="tickwire-floor-"))
    df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    out = {"filesystem": spark.conf.get("spark.tickwire.filesystem")}
    run_batches(df, lambda d, i: None, 40, tmp / "warm-up")  # JIT: a JVM's first query runs slower
    for name, fn in (("noop", lambda d, i: None),
                     ("sink", sink(Engine(), "floor", "append", wait=False))):
        starts = run_batches(df, fn, 60, tmp / name)
        out[name] = statistics.median(np.diff(starts[10:]))
    spark.stop()
    print(json.dumps(out))


def floors() -> dict:
    res = {}
    for fs in ("stock", "nofork"):
        done = subprocess.run([sys.executable, __file__, "--floor-child", fs], capture_output=True, text=True,
                              check=False, timeout=300)
        line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        if done.returncode != 0 or not line.startswith("{"):
            raise RuntimeError(f"floor run ({fs}) failed:\n{done.stderr[-3000:]}")
        res[fs] = json.loads(line)
    return res


# ------------------------------------------------------------------------------------------------
# 2. conversions
# ------------------------------------------------------------------------------------------------

def conversions(spark, tmp: Path) -> dict:
    results: dict = {}

    def cb(df, batch_id):
        df = df.drop("Ts")  # __arrow_c_stream__ fails on timestamp columns in pyspark 4.3
        methods = {
            "toArrow": lambda: df.toArrow(),
            "_collect_as_arrow": lambda: pa.Table.from_batches(df._collect_as_arrow(empty_list_if_zero_records=False)),
            "__arrow_c_stream__": lambda: pa.table(df),
            "toPandas": lambda: df.toPandas(),
        }
        names = list(methods)
        times: dict = {n: [] for n in names}
        rows = None
        for r in range(rounds[0]):
            for n in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                out = methods[n]()
                times[n].append(time.perf_counter() - t0)
                rows = len(out)
        results[rows] = {n: (statistics.median(v), min(v)) for n, v in times.items()}

    rounds = [5]
    for rows, r in ((1_000, 7), (100_000, 5), (1_000_000, 3)):
        rounds[0] = r
        run_batches(trades_stream(spark, rows), cb, 1, tmp / f"conv-{rows}")
    return results


# ------------------------------------------------------------------------------------------------
# 3. throughput
# ------------------------------------------------------------------------------------------------

def throughput(spark, tmp: Path, rows: int, count: int) -> dict:
    from tickwire.server.adapters.spark import sink
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=20).start()
    s = sink(engine, "trades", "append")
    sink_s = []

    def fn(df, batch_id):
        t0 = time.perf_counter()
        s(df, batch_id)
        sink_s.append((time.perf_counter() - t0, s.last.get("convert_s", 0.0)))

    warm = 1 if rows >= 1_000_000 else 2  # first batches pay for plan compilation
    starts = run_batches(trades_stream(spark, rows), fn, count + warm, tmp / f"tp-{rows}")
    end = starts[-1] + sink_s[-1][0]
    measured = count
    wall = end - starts[warm]
    engine.stop()
    assert engine.resolve("trades").size == rows * (count + warm)
    return {"rows": rows, "batches": measured, "rows_per_s": rows * measured / wall,
            "batch_ms": 1e3 * wall / measured,
            "sink_ms": 1e3 * statistics.median(x[0] for x in sink_s[warm:]),
            "to_arrow_ms": 1e3 * statistics.median(x[1] for x in sink_s[warm:])}


# ------------------------------------------------------------------------------------------------
# 4. latency
# ------------------------------------------------------------------------------------------------

def latency(spark, tmp: Path, rows: int, count: int, interval_ms: float) -> dict:
    from tickwire.clients.client import BarrageClient
    from tickwire.server.adapters.spark import sink
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=interval_ms)
    server = TickwireServer(engine, port=0).start()
    s = sink(server, "live", "append")
    timings: dict[int, dict] = {}
    received: dict[int, float] = {}
    spark_ms = []
    last_end = [None]

    def fn(df, batch_id):
        t0 = time.perf_counter()
        if last_end[0] is not None:
            spark_ms.append(1e3 * (t0 - last_end[0]))  # Spark's work between two callbacks
        s(df, batch_id)
        timings[batch_id] = dict(s.last)
        last_end[0] = time.perf_counter()

    def on_update(u):
        now = time.perf_counter()
        if u.is_snapshot or u.added.num_rows == 0:
            return
        first = int(u.added.column("Seq")[0].as_py())
        received[first // rows] = now

    # the table exists before the subscription: create it from one batch's schema
    df = trades_stream(spark, rows)
    with BarrageClient(server.target) as client:
        run_batches(df, fn, 1, tmp / "lat-warm")
        sub = client.subscribe("live", on_update=on_update)
        sub.wait_for(lambda x: x.update_count >= 1, 30)
        timings.clear()
        spark_ms.clear()
        last_end[0] = None
        run_batches(df, fn, count, tmp / "lat")
        sub.wait_for(lambda x: x.size == rows * (count + 1), 30)
        sub.close()
    server.stop()
    engine.stop()
    pairs = [(received[b] - t["queued_at"], received[b] - t["applied_at"], t["convert_s"])
             for b, t in timings.items() if b in received and "applied_at" in t]
    q = np.array([p[0] for p in pairs]) * 1e3
    a = np.array([p[1] for p in pairs]) * 1e3
    conv = np.array([p[2] for p in pairs]) * 1e3
    return {"batches": len(pairs), "of": count, "queued_p50": pct(q, 50), "queued_p99": pct(q, 99),
            "applied_p50": pct(a, 50), "applied_p99": pct(a, 99), "spark_p50": pct(spark_ms, 50),
            "spark_p99": pct(spark_ms, 99), "convert_p50": pct(conv, 50)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the floor and conversion measurements")
    ap.add_argument("--floor-child", choices=("stock", "nofork", "raw"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_child:
        floor_child(args.floor_child)
        return
    t_start = time.perf_counter()
    if not args.quick:
        f = floors()
        st, nf = f["stock"], f["nofork"]
        print(f"micro-batch floor, do-nothing foreachBatch: stock filesystem {st['noop'] * 1e3:.1f} ms, "
              f"non-forking ({nf['filesystem']}) {nf['noop'] * 1e3:.1f} ms (target <= 25); "
              f"ratio stock/non-forking {st['noop'] / nf['noop']:.2f}")
        print(f"micro-batch floor, tickwire sink (10 rows, Arrow collection included): "
              f"stock {st['sink'] * 1e3:.1f} ms, non-forking {nf['sink'] * 1e3:.1f} ms; "
              f"ratio {st['sink'] / nf['sink']:.2f}")

    from tickwire.server.adapters.spark import spark_session

    t0 = time.perf_counter()
    spark = spark_session("bench-spark")
    print(f"SparkSession start: {time.perf_counter() - t0:.1f} s (filesystem "
          f"{spark.conf.get('spark.tickwire.filesystem')})")
    tmp = Path(tempfile.mkdtemp(prefix="tickwire-bench-spark-"))
    if not args.quick:
        conv = conversions(spark, tmp)
        for rows, res in sorted(conv.items()):
            ref = res["toPandas"][0]
            parts = ", ".join(f"{n} {med * 1e3:.0f} ms (min {low * 1e3:.0f}; {ref / med:.2f}x)"
                              for n, (med, low) in res.items())
            print(f"conversion of {rows:,} rows, median of rounds (speed vs toPandas): {parts}")
    for rows, count in ((10_000, 20), (100_000, 8), (1_000_000, 3)):
        r = throughput(spark, tmp, rows, count)
        print(f"throughput, {rows:>9,}-row batches: {r['rows_per_s'] / 1e6:.2f} M rows/s "
              f"({r['batch_ms']:.0f} ms a batch over {r['batches']} batches; sink {r['sink_ms']:.0f} ms of it, "
              f"of which Arrow collection {r['to_arrow_ms']:.0f} ms)")
    lat = latency(spark, tmp, rows=1_000, count=60, interval_ms=20)
    print(f"latency, 1,000-row batches, graph cycle 20 ms ({lat['batches']} of {lat['of']} batches matched): "
          f"sink queued -> client p50 {lat['queued_p50']:.1f} ms, p99 {lat['queued_p99']:.1f} ms; "
          f"cycle done -> client p50 {lat['applied_p50']:.1f} ms, p99 {lat['applied_p99']:.1f} ms; "
          f"Spark between batches p50 {lat['spark_p50']:.0f} ms, p99 {lat['spark_p99']:.0f} ms; "
          f"Arrow collection p50 {lat['convert_p50']:.0f} ms")
    spark.stop()
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
