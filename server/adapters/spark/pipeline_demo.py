"""Demo tables fed by Spark Structured Streaming through the tickwire sinks.

Three streaming queries over Spark's `rate-micro-batch` source (synthetic trades over 300 symbols,
no external system) on a local SparkSession with the non-forking checkpoint filesystem:

- `spark_trades` (append), `spark_recent` (the last 1,000 trades, a ring table) and `spark_ticks`
  (blink: each batch's trades): one query, its batches collected once and fanned out;
- `spark_latest` (upsert by Sym, an `update`-mode aggregation): last price, volume, VWAP, trade
  count and time of the last trade per symbol;
- `spark_totals` (replace by Sym, a `complete`-mode aggregation): volume-weighted average price
  and volume per symbol; only the symbols whose values changed are reported modified.

Checkpoints go to a temporary directory removed on `stop()`: the tables live in memory, so a new
process starts its queries afresh.

Stopping: `StreamingQuery.stop()` marks the query stopped, cancels the Spark jobs of its thread
and interrupts that thread. Whatever the thread does then is cut short, and Spark logs it at
ERROR: the collection of a batch (a shuffle fetch; the Arrow collection, whose allocator then
reports "Memory was leaked by query" with a stack) or the planning of the next one (a broadcast).
So `stop()` ends each query at the start of a batch: its next batch waits there (the query's
thread is parked in the `foreachBatch` call, past its planning) while the query is marked
stopped, then runs to its end in a thread of its own (`_Runner`), whose jobs the stop neither
cancels nor interrupts; the query's thread then finds itself stopped and ends without another
batch. The queries end before the SparkSession.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Optional

from tickwire.server.adapters.spark.sinks import QUERY_ID_PROPERTY, fan_out, sink

__all__ = ["SparkDemo", "start_spark_demo", "spark_available", "stop_active_spark"]

log = logging.getLogger(__name__)


def spark_available() -> Optional[str]:
    """None when pyspark and a Java runtime are present, else why not."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'tickwire[spark]')"
    if shutil.which("java") is None:
        return "no Java runtime on PATH (Spark needs a JDK 17)"
    return None


class _Runner:
    """A query's `foreachBatch` function, run so that the query can be stopped between batches
    (see the module documentation). Each batch's work (its Spark jobs and its writes) runs in a
    thread of the runner's, the query's thread waiting for it; that thread's jobs carry the
    query's id (the sinks' exactly-once scope) and none of the query's job group. While
    `holding`, a new batch waits at its start until `release`."""

    def __init__(self, fn, name: str):
        self.fn = fn
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tickwire-{name}")
        self._cond = threading.Condition()
        self._holding = False
        self._held = False

    def __call__(self, batch_df, batch_id) -> None:
        query_id = batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        with self._cond:
            if self._holding:
                self._held = True
                self._cond.notify_all()
                self._cond.wait_for(lambda: not self._holding)
                self._held = False
        self.pool.submit(self._run, batch_df, batch_id, query_id).result()

    def _run(self, batch_df, batch_id, query_id) -> None:
        batch_df.sparkSession.sparkContext.setLocalProperty(QUERY_ID_PROPERTY, query_id)
        self.fn(batch_df, batch_id)

    def hold(self) -> None:
        with self._cond:
            self._holding = True

    def wait_held(self, until: float, query) -> bool:
        """True once a batch waits at its start; False once `query` (the runner's) ended, or at
        `until` (time.monotonic())."""
        while True:
            with self._cond:
                if self._cond.wait_for(lambda: self._held, 0.1):
                    return True
            if not query.isActive or time.monotonic() >= until:
                return False

    def release(self) -> None:
        with self._cond:
            self._holding = False
            self._cond.notify_all()

    def close(self) -> None:
        self.release()
        self.pool.shutdown(wait=True)


class SparkDemo:
    """The Spark-fed demo tables of `target` (an Engine or a TickwireServer)."""

    def __init__(self, target, *, spark=None, prefix: str = "spark_", rows_per_batch: int = 10,
                 trigger_ms: int = 200, agg_trigger_ms: int = 1000, checkpoint_dir: Optional[str | Path] = None,
                 quiet: bool = True, append_rows: Optional[int] = None):
        self.target = target
        self.spark = spark
        self.quiet = quiet  # for the session made here: spark_session(quiet=...)
        self._own_spark = spark is None
        self.prefix = prefix
        self.rows_per_batch = int(rows_per_batch)
        self.trigger_ms = int(trigger_ms)
        self.agg_trigger_ms = int(agg_trigger_ms)
        self.append_rows = append_rows   # trades keeps its last rows only (a ring table)
        self._own_dir = checkpoint_dir is None
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.queries: list = []
        self.sinks: dict = {}
        self._runners: list[_Runner] = []
        self._start_ms = int(time.time() * 1000)

    def _trades(self):
        from pyspark.sql import functions as F

        v = F.col("value")
        return (self.spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", self.rows_per_batch).option("numPartitions", 1)
                .option("advanceMillisPerBatch", self.trigger_ms).option("startTimestamp", self._start_ms).load()
                .select(F.col("timestamp").alias("Timestamp"),
                        F.concat(F.lit("SYM"), F.lpad(((v * 7919) % 300).cast("string"), 3, "0")).alias("Sym"),
                        F.round(100 + 5 * F.sin(v / 50.0) + ((v * 37) % 11) / 10.0, 2).alias("Price"),
                        (((v * 13) % 999) + 1).cast("int").alias("Size"),
                        v.alias("Seq")))

    def start(self) -> "SparkDemo":
        from pyspark.sql import functions as F

        if self.spark is None:
            from tickwire.server.adapters.spark.launch import spark_session

            self.spark = spark_session("tickwire-demo", quiet=self.quiet)
        if self.checkpoint_dir is None:
            self.checkpoint_dir = Path(tempfile.mkdtemp(prefix="tickwire-spark-demo-"))
        self._start_ms = int(time.time() * 1000)  # the trades' timestamps start now
        p, t = self.prefix, self.target
        self.sinks = {
            "trades": sink(t, p + "trades", "append", max_rows=self.append_rows),
            "recent": sink(t, p + "recent", "append", max_rows=1000),
            "ticks": sink(t, p + "ticks", "blink"),
            "latest": sink(t, p + "latest", "upsert", keys=["Sym"]),
            "totals": sink(t, p + "totals", "replace", keys=["Sym"]),
        }
        s = self.sinks

        def run(df, fn, name, mode, trigger_ms):
            runner = _Runner(fn, p + name)
            self._runners.append(runner)
            q = (df.writeStream.queryName(p + name).outputMode(mode).foreachBatch(runner)
                 .option("checkpointLocation", str(self.checkpoint_dir / name))
                 .trigger(processingTime=f"{trigger_ms} milliseconds").start())
            self.queries.append(q)

        trades = self._trades()
        run(trades, fan_out(s["trades"], s["recent"], s["ticks"]), "trades", "append", self.trigger_ms)
        latest = trades.groupBy("Sym").agg(F.max_by("Price", "Seq").alias("Last"), F.sum("Size").alias("Volume"),
                                           (F.sum(F.col("Price") * F.col("Size")) / F.sum("Size")).alias("VWAP"),
                                           F.count("*").alias("Trades"), F.max("Timestamp").alias("Updated"))
        run(latest, s["latest"], "latest", "update", self.agg_trigger_ms)
        totals = trades.groupBy("Sym").agg((F.sum(F.col("Price") * F.col("Size")) / F.sum("Size")).alias("VWAP"),
                                           F.sum("Size").alias("Volume"))
        run(totals, s["totals"], "totals", "complete", self.agg_trigger_ms)
        return self

    @staticmethod
    def _stop_query(q) -> None:
        try:
            q.stop()  # returns once the query's thread ended
        except Exception:  # a query that failed already is stopped
            log.debug("stopping %s", q.name, exc_info=True)

    def status(self) -> str:
        """One line: batches and rows per sink, and any failed query."""
        parts = [f"{s.name}: {s.batches} batches" for s in self.sinks.values()]
        failed = [q.name for q in self.queries if q.exception() is not None]
        return "spark " + ", ".join(parts) + (f"; FAILED: {', '.join(failed)}" if failed else "")

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stops the queries, each at the start of a batch, which runs to its end (see the module
        documentation), then the SparkSession when it is the demo's own. A query that reaches no
        batch start within `timeout_s` (or takes longer to be marked stopped) is stopped where it
        is. The update graph must still run: a batch waits for it to apply its rows."""
        pairs = list(zip(self.queries, self._runners))
        for _q, runner in pairs:
            runner.hold()
        stoppers = []
        try:
            until = time.monotonic() + timeout_s
            for q, runner in pairs:
                runner.wait_held(until, q)
            for q, _runner in pairs:  # stop() marks the query stopped, then interrupts it and waits for it
                t = threading.Thread(target=self._stop_query, args=(q,), name=f"stop {q.name}", daemon=True)
                t.start()
                stoppers.append(t)
            for q, _runner in pairs:
                while q.isActive and time.monotonic() < until:
                    time.sleep(0.01)
        finally:
            for _q, runner in pairs:
                runner.release()  # the held batches run; their queries end after them
        for t in stoppers:
            t.join()
        self.queries = []
        for runner in self._runners:
            runner.close()
        self._runners = []
        if self._own_spark and self.spark is not None:
            self.spark.stop()
            self.spark = None
        if self._own_dir and self.checkpoint_dir is not None:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
            self.checkpoint_dir = None


def start_spark_demo(target, out: Callable[[str], None] = print, **options) -> Optional[SparkDemo]:
    """Starts the Spark-fed demo tables, or says why it cannot (returns None)."""
    why = spark_available()
    if why is not None:
        out(f"tickwire demo: no Spark tables ({why})")
        return None
    demo = SparkDemo(target, **options).start()
    out(f"tickwire demo: Spark tables {', '.join(s.name for s in demo.sinks.values())} "
        f"(filesystem {demo.spark.conf.get('spark.tickwire.filesystem')})")
    return demo


def stop_active_spark() -> None:
    """Stops the process's active SparkSession, if any (after an interrupted start)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return
    session = SparkSession.getActiveSession()
    if session is not None:
        for q in session.streams.active:
            q.stop()
        session.stop()
