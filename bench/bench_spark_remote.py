"""Spark into a tickwire server in another process (`writeStream.format("tickwire")`,
tickwire.clients.spark.datasource) against the in-process `foreachBatch` sink
(tickwire.server.adapters.spark.sink) as the reference, both measured in the same run.

Same input for both: bench_spark's trades stream (`rate-micro-batch`, 2 partitions; Sym, Price,
Size, Seq, Ts) on local[2], one fresh checkpoint per query, into an append table. Same server
settings: `TickwireServer(Engine(interval_ms=20), port=0)` with its defaults. The reference
server runs in the Spark driver's Python process (where users of the `foreachBatch` sink have
it), the remote one in a child process (where users of the data source have it). The machine
may have 2 cores only: Spark (JVM and Python workers), the servers and the subscriber share them,
and the report says how many there are.

1. Throughput: rows/s over consecutive micro-batches run back to back (default trigger), after
   warm-up batches, for 10k and 1M-row batches. Both paths return a batch to Spark only once the
   engine's cycle applied it (the sink waits for it; the `tickwire.commit` action waits for
   it), and both are timed the same way, from Spark's progress reports: from the trigger start of
   the first measured batch to the end of the last (its start + `triggerExecution`). Spark's time
   inside the sink (`addBatch`) is shown too: the in-process sink's collection to the driver,
   queuing and cycle; the data source's tasks (conversion and DoPut by the executors) and the
   driver's commit with its cycle. A third query runs Spark's Python data source with a writer
   that only reads its partitions and a commit that does nothing: what the data source path
   costs in Spark before tickwire does anything; remote / that ratio shows what tickwire adds.
2. Latency: a Barrage subscriber (tickwire's BarrageClient, in the driver's Python process for
   both paths) on the table; per micro-batch, from the batch's trigger start to the subscriber's
   callback that completes the batch's rows (rows are told apart by `Seq // rows per batch`),
   p50/p99, for 10k and 1M-row batches, with a processing-time trigger (the same for both paths)
   so that each batch is measured on its own rather than behind the previous one's delivery.

   Why the trigger start: the two paths take the rows at different stages. The `foreachBatch`
   sink is called on the driver with a DataFrame and runs the Spark job itself (collection);
   the data source's executors run the job and upload as they go, and the driver's commit comes
   after the job. A point inside either sink (the sink's queue time, the commit call) would leave
   out different work on each side (the executors' uploads would fall outside the remote
   measurement entirely). The trigger start is the last point before the two paths differ, and
   Spark records it for both in the same way: the progress report's `timestamp` (the driver's
   wall clock, in ms, before the batch's rows exist: rate-micro-batch makes them in the batch's
   tasks). The end is the client's wall clock (`time.time()`, the same host clock). The part
   before the sink (offsets, write-ahead log, planning: identical work for both paths) is shown
   separately, as is `addBatch`.

p99 is over 40 batches of 10k rows, 8 of 1M (12 and 3 with `--quick`): for 1M rows it is close to
the largest. `--quick` runs fewer batches (about 80 s); a default run takes about 2.5 minutes.
`--json PATH` also writes the results as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_spark import pct, trades_stream  # noqa: E402 - the same input as bench_spark
from procstat import cpu_seconds  # noqa: E402

INTERVAL_MS = 20  # the engine cycle of both servers


# ------------------------------------------------------------------------------------------------
# the servers
# ------------------------------------------------------------------------------------------------

def server_child(interval_ms: float) -> None:
    """The remote server: prints its target, serves until its stdin closes."""
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=interval_ms)
    server = TickwireServer(engine, port=0).start()
    print(json.dumps({"target": server.target, "pid": os.getpid()}), flush=True)
    sys.stdin.read()
    server.stop()
    engine.stop()


class RemoteServer:
    def __init__(self, interval_ms: float):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, __file__, "--server-child", str(interval_ms)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("{"):
            self.log.seek(0)
            raise RuntimeError(f"the remote server did not start:\n{self.log.read()[-3000:]}")
        self.target = json.loads(line)["target"]

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process so far."""
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def floor_source():
    """A data source like "tickwire" whose tasks only read their partitions (nothing is sent) and
    whose commit does nothing: the cost of Spark's Python data source path itself."""
    from tickwire.clients.spark.datasource import PartCommit, TickwireDataSource, TickwireStreamWriter

    class FloorWriter(TickwireStreamWriter):
        def write(self, iterator):
            return PartCommit("floor", 0, None, None, sum(rb.num_rows for rb in iterator))

        def commit(self, messages, batchId):
            pass

    class FloorSource(TickwireDataSource):
        @classmethod
        def name(cls):
            return FLOOR

        def streamWriter(self, schema, overwrite):
            return FloorWriter(dict(self.options), schema)

    return FloorSource


FLOOR = "tickwire_floor"


class Paths:
    """Starts the same query into one of the paths: "in-process" (foreachBatch sink into the server
    of this process), "remote" (the tickwire data source into the child's server) or "floor" (see
    `floor_source`)."""

    def __init__(self, spark, local_server, remote: RemoteServer, tmp: Path):
        self.spark, self.local, self.remote, self.tmp = spark, local_server, remote, tmp

    def target(self, path: str) -> str:
        return self.local.target if path == "in-process" else self.remote.target

    def start(self, path: str, rows: int, table: str, trigger_ms=None):
        from tickwire.server.adapters.spark import sink

        w = trades_stream(self.spark, rows).writeStream
        w = w.option("checkpointLocation", str(self.tmp / f"{path}-{table}"))
        if trigger_ms:
            w = w.trigger(processingTime=f"{int(trigger_ms)} milliseconds")
        if path == "in-process":
            return w.foreachBatch(sink(self.local, table, "append")).start()  # waits for the cycle
        w = w.format(FLOOR if path == "floor" else "tickwire").option("uri", f"grpc://{self.remote.target}")
        return w.option("table", table).start()


def run_until(q, batches: int, timeout: float) -> list:
    """Lets query `q` run until its batch `batches - 1` reported progress, then stops it; returns the
    progress reports of its batches with input, by batch id. The last batches are watched closely,
    so that the stop comes while the next batch is still being planned: tasks killed in flight
    would take their Python workers with them, and the next query would wait for new ones."""
    from pyspark import SparkContext

    deadline = time.monotonic() + timeout
    sc = SparkContext.getOrCreate()
    try:
        while True:
            last = q.lastProgress
            done = -1 if last is None else last["batchId"]
            if done >= batches - 1:
                break
            if not q.isActive:
                raise RuntimeError(f"the query ended: {q.exception()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {done + 1} of {batches} micro-batches in {timeout:.0f} s")
            time.sleep(0.01 if done >= batches - 2 else 0.1)
    finally:
        # a batch cut short logs its cancelled tasks at ERROR level: not an error here
        sc.setLogLevel("OFF")
        try:
            q.stop()
        finally:
            sc.setLogLevel("ERROR")
    prog = {p["batchId"]: p for p in q.recentProgress if p["numInputRows"]}
    return [prog[b] for b in sorted(prog)]


def quiet_accumulator_eof(sc) -> None:
    """When a query is stopped mid-batch (as the bench stops them), PySpark's accumulator server in
    this process may read an end of file on a connection and print the EOFError with its
    traceback: not printed here; other errors are."""
    server = getattr(sc, "_accumulatorServer", None)
    if server is None:
        return
    default = server.handle_error

    def handle_error(request, client_address):
        if not isinstance(sys.exc_info()[1], EOFError):
            default(request, client_address)

    server.handle_error = handle_error


def started(p) -> float:
    """A progress report's trigger start, seconds since the epoch."""
    return datetime.strptime(p["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def before_sink_ms(p) -> float:
    d = p["durationMs"]
    return float(sum(d.get(k, 0) for k in ("latestOffset", "walCommit", "getBatch", "queryPlanning")))


def table_rows(target: str, table: str) -> int:
    from tickwire.clients.client import BarrageClient

    with BarrageClient(target) as client:
        return client.snapshot(table, columns=["Seq"]).num_rows


# ------------------------------------------------------------------------------------------------
# 1. throughput
# ------------------------------------------------------------------------------------------------

def throughput(paths: Paths, path: str, rows: int, count: int, warm: int) -> dict:
    table = f"tp_{rows}"
    cpu0, t0 = paths.remote.cpu_s(), time.monotonic()
    prog = run_until(paths.start(path, rows, table), count + warm, timeout=60 + count * rows / 100_000)
    cpu = (paths.remote.cpu_s() - cpu0) / (time.monotonic() - t0)
    measured = prog[warm:warm + count]
    if len(measured) < count:
        raise RuntimeError(f"{path}: {len(measured)} of {count} batches reported")
    wall = started(measured[-1]) + measured[-1]["durationMs"]["triggerExecution"] / 1e3 - started(measured[0])
    size = rows * len(prog) if path == "floor" else table_rows(paths.target(path), table)
    if size < rows * len(prog) or size % rows:
        raise RuntimeError(f"{path}: table {table} has {size} rows after {len(prog)} batches of {rows}")
    return {"rows": rows, "batches": count, "rows_per_s": rows * count / wall, "batch_ms": 1e3 * wall / count,
            "add_batch_ms": statistics.median(p["durationMs"]["addBatch"] for p in measured),
            "remote_server_cpu": cpu}


# ------------------------------------------------------------------------------------------------
# 2. latency
# ------------------------------------------------------------------------------------------------

class Arrivals:
    """A subscriber callback: when each batch's last row arrived (wall clock)."""

    def __init__(self, rows: int):
        self.rows = rows
        self.count: dict[int, int] = {}
        self.done: dict[int, float] = {}
        self.lock = threading.Lock()

    def __call__(self, u) -> None:
        now = time.time()
        if u.is_snapshot or u.added.num_rows == 0:
            return
        b = u.added.column("Seq").to_numpy() // self.rows
        lo = int(b.min())
        with self.lock:
            for i, c in enumerate(np.bincount(b - lo)):
                if c:
                    n = self.count[lo + i] = self.count.get(lo + i, 0) + int(c)
                    if n >= self.rows and lo + i not in self.done:
                        self.done[lo + i] = now


def latency(paths: Paths, path: str, rows: int, count: int, warm: int, trigger_ms: float) -> dict:
    from tickwire.clients.client import BarrageClient

    table = f"live_{rows}"
    arrivals = Arrivals(rows)
    q = paths.start(path, rows, table, trigger_ms=trigger_ms)
    deadline = time.monotonic() + 120
    while q.lastProgress is None:  # the table exists once the first batch is committed
        if not q.isActive or time.monotonic() > deadline:
            q.stop()
            raise RuntimeError(f"{path}: no first batch: {q.exception()}")
        time.sleep(0.05)
    with BarrageClient(paths.target(path)) as client:
        sub = client.subscribe(table, on_update=arrivals)
        try:
            sub.wait_for(lambda x: x.update_count >= 1, 60)
            first = q.lastProgress["batchId"] + 1  # every later batch reaches the client as an update
            total = first + warm + count
            prog = run_until(q, total, timeout=60 + total * trigger_ms / 1e3 * 3)
            sub.wait_for(lambda x: x.size >= rows * total, 60)
        finally:
            sub.close()
    lat, before, add = [], [], []
    for p in prog:
        b = p["batchId"]
        if first + warm <= b < total and b in arrivals.done:
            lat.append(1e3 * (arrivals.done[b] - started(p)))
            before.append(before_sink_ms(p))
            add.append(p["durationMs"]["addBatch"])
    if len(lat) < count * 0.8:
        raise RuntimeError(f"{path}: {len(lat)} of {count} batches matched")
    return {"rows": rows, "batches": len(lat), "of": count, "trigger_ms": trigger_ms, "p50_ms": pct(lat, 50),
            "p99_ms": pct(lat, 99), "before_sink_ms": statistics.median(before),
            "add_batch_ms": statistics.median(add)}


# ------------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer micro-batches")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--server-child", type=float, metavar="INTERVAL_MS", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.server_child is not None:
        server_child(args.server_child)
        return
    t_start = time.perf_counter()
    # (rows a batch, measured batches, warm-up batches, latency batches, latency trigger ms)
    sizes = ([(10_000, 10, 2, 12, 300), (1_000_000, 3, 2, 3, 3000)] if args.quick else
             [(10_000, 30, 3, 40, 300), (1_000_000, 5, 2, 8, 3000)])

    from tickwire.clients.spark.datasource import register
    from tickwire.server.adapters.spark import spark_session
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    spark = spark_session("bench-spark-remote")  # (before any gRPC thread of this process: it forks)
    remote = RemoteServer(INTERVAL_MS)
    engine = Engine(interval_ms=INTERVAL_MS)
    local = TickwireServer(engine, port=0).start()
    register(spark)
    spark.dataSource.register(floor_source())
    quiet_accumulator_eof(spark.sparkContext)
    tmp = Path(tempfile.mkdtemp(prefix="tickwire-bench-spark-remote-"))
    paths = Paths(spark, local, remote, tmp)
    load = os.getloadavg()[0]
    print(f"local[2], {os.cpu_count()} core(s) shared by Spark, both servers and the subscriber; graph cycle "
          f"{INTERVAL_MS} ms; in-process server in the driver's Python process, remote server in process "
          f"{remote.proc.pid} at {remote.target}; load average {load:.2f} at start", flush=True)
    results: dict = {"cores": os.cpu_count(), "interval_ms": INTERVAL_MS, "load_start": load,
                     "throughput": [], "latency": []}
    names = ("in-process", "remote")
    loads: list[float] = []
    sampling = threading.Event()

    def sample_load():  # other work on a shared machine shows here
        while not sampling.wait(2.0):
            loads.append(os.getloadavg()[0])

    threading.Thread(target=sample_load, daemon=True).start()
    try:
        for path in names:  # JIT, Python workers, connections
            run_until(paths.start(path, 10_000, "warm"), 4, timeout=120)
        for rows, count, warm, _n, _t in sizes:
            r = {p: throughput(paths, p, rows, count, warm) for p in (*names, "floor")}
            ip, rm, fl = r["in-process"], r["remote"], r["floor"]
            results["throughput"].append(r)
            print(f"throughput, {rows:>9,}-row batches over {count} batches: in-process "
                  f"{ip['rows_per_s'] / 1e6:.2f} M rows/s ({ip['batch_ms']:.0f} ms a batch, sink "
                  f"{ip['add_batch_ms']:.0f} ms), remote {rm['rows_per_s'] / 1e6:.2f} M rows/s "
                  f"({rm['batch_ms']:.0f} ms a batch, sink {rm['add_batch_ms']:.0f} ms; server process "
                  f"{100 * rm['remote_server_cpu']:.0f}% of a core); "
                  f"ratio remote/in-process {rm['rows_per_s'] / ip['rows_per_s']:.2f}; Spark's Python data source "
                  f"with a writer that only reads its partitions {fl['rows_per_s'] / 1e6:.2f} M rows/s "
                  f"({fl['batch_ms']:.0f} ms a batch), remote/that {rm['rows_per_s'] / fl['rows_per_s']:.2f}",
                  flush=True)
        for rows, _c, _w, count, trigger_ms in sizes:
            warm = 2 if rows < 1_000_000 else 1
            r = {p: latency(paths, p, rows, count, warm, trigger_ms) for p in names}
            ip, rm = r["in-process"], r["remote"]
            results["latency"].append(r)
            print(f"latency, {rows:>9,}-row batches, trigger {trigger_ms} ms, batch start -> client "
                  f"({ip['batches']}/{rm['batches']} of {count} batches): in-process p50 {ip['p50_ms']:.0f} ms, "
                  f"p99 {ip['p99_ms']:.0f} ms; remote p50 {rm['p50_ms']:.0f} ms, p99 {rm['p99_ms']:.0f} ms; "
                  f"ratios remote/in-process p50 {rm['p50_ms'] / ip['p50_ms']:.2f}, p99 "
                  f"{rm['p99_ms'] / ip['p99_ms']:.2f} (Spark before the sink {ip['before_sink_ms']:.0f}/"
                  f"{rm['before_sink_ms']:.0f} ms, sink {ip['add_batch_ms']:.0f}/{rm['add_batch_ms']:.0f} ms)",
                  flush=True)
    finally:
        spark.stop()
        local.stop()
        engine.stop()
        remote.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        sampling.set()
    results["load_end"] = os.getloadavg()[0]
    results["load_mean"] = statistics.mean(loads) if loads else results["load_end"]
    results["load_max"] = max(loads, default=results["load_end"])
    results["total_s"] = time.perf_counter() - t_start
    print(f"load average (1 min) during the run: mean {results['load_mean']:.2f}, max {results['load_max']:.2f}, "
          f"{results['load_end']:.2f} at the end; total "
          f"{results['total_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
