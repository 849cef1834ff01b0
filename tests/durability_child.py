"""The process tests/test_durability_crash.py kills: a SparkSession and a TickwireServer with a
data directory in one process, one streaming query from a rate source writing an append table
and a keyed table (upserts with deletes), as a user would run them.

    python tests/durability_child.py DATA_DIR SPARK_CHECKPOINT --rows N [--rows-per-batch R]
                                     [--checkpoint-cycles C] [--pause-checkpoint tmp|renamed SECONDS]

Rows depend only on the rate source's `value` (0, 1, 2, ...), so every run of the query, however
often it is killed and resumed, must end with the same tables:
- `appended` (append): one row per value < N, in value order: (value, k = value % 50);
- `latest` (keyed on k): upserts of (k, value); a value divisible by 7 deletes its key instead.

Each batch is sorted by value before it is written, so an uninterrupted run gives row key i to
value i in `appended`. The query stops once `appended` holds N rows; the child then prints
"DONE <port>" and keeps serving until its stdin closes, and exits cleanly.

Lines on stdout (flushed; the parent reads them): "READY <port>" once the server serves,
"BATCH <batch id> <rows of appended> <replays> <replays>" after each batch's foreachBatch
returned (the batch is on disk and applied; replays: batches each sink found already applied),
"CKPT-TMP <path>" while a checkpoint's temporary file is written, and
"CKPT-RENAMED <path>" after its rename, before the journal it covers is deleted.
`--pause-checkpoint tmp|renamed S` holds the checkpoint thread S seconds at that point (only
the checkpoint's background thread: cycles and Spark go on), so that the parent's SIGKILL lands
there for certain.
"""
from __future__ import annotations

import argparse
import os
import stat
import sys
import threading
import time
from pathlib import Path


def say(*parts) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def pause_checkpoints(where: str, seconds: float) -> None:
    """Holds checkpoint writes at `where` (test instrumentation of this process only)."""
    import pyarrow.parquet as real_pq

    from tickwire.server.engine.storage import store

    # the checkpoint thread writes the temporary file with a store.pq.ParquetWriter (closed on
    # leaving its `with`), renames it, then syncs the folder ("checkpoints": the only folder of
    # that name synced) with os.fsync before deleting the journal it covers
    if not hasattr(store, "pq"):
        raise SystemExit("tickwire.server.engine.storage.store no longer has pq: update --pause-checkpoint")
    if where == "tmp":
        class SlowWriter(real_pq.ParquetWriter):
            def __init__(self, where_to, schema, **kw):
                super().__init__(where_to, schema, **kw)
                self.where_to = where_to

            def __exit__(self, *exc):
                out = super().__exit__(*exc)
                say("CKPT-TMP", self.where_to)
                time.sleep(seconds)
                return out

        class SlowParquet:
            ParquetWriter = SlowWriter

            def __getattr__(self, name):
                return getattr(real_pq, name)

        store.pq = SlowParquet()
    elif where == "renamed":
        real_fsync = os.fsync

        def slow_fsync(fd):
            real_fsync(fd)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                path = Path(os.readlink(f"/proc/self/fd/{fd}"))
                if path.name == "checkpoints":  # right after the rename, before the journal goes
                    say("CKPT-RENAMED", path)
                    time.sleep(seconds)

        os.fsync = slow_fsync
    else:
        raise SystemExit(f"--pause-checkpoint: tmp or renamed, not {where!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("spark_checkpoint")
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--rows-per-batch", type=int, default=20)
    ap.add_argument("--checkpoint-cycles", type=int, default=5)
    ap.add_argument("--pause-checkpoint", nargs=2, metavar=("WHERE", "SECONDS"))
    args = ap.parse_args()
    n_rows = args.rows

    from tickwire.server.adapters.spark import spark_session

    # the SparkSession first: starting its JVM forks, which must not happen beside gRPC's threads
    spark = spark_session("tickwire-durability-crash")

    from pyspark.sql import functions as F

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Durability, Engine, EngineConfig

    if args.pause_checkpoint:
        pause_checkpoints(args.pause_checkpoint[0], float(args.pause_checkpoint[1]))

    engine = Engine(EngineConfig(interval_ms=20, data_dir=args.data_dir,
                                 durability=Durability(checkpoint_cycles=args.checkpoint_cycles)))
    server = TickwireServer(engine, port=0, web=False).start()  # brings back the data directory's tables first
    say("READY", server.port)

    appended = server.sink("appended", mode="append")
    latest = server.sink("latest", mode="upsert", keys=["k"], delete_column="del")

    finished = threading.Event()

    def write(batch_df, batch_id):
        df = (batch_df.where(F.col("value") < n_rows).orderBy("value")
              .select("value", (F.col("value") % 50).alias("k"), (F.col("value") % 7 == 0).alias("del")))
        df.persist()
        try:
            appended(df.select("value", "k"), batch_id)  # one cycle ...
            latest(df, batch_id)  # ... and the next: a kill may fall between the two tables
        finally:
            df.unpersist()
        table = engine.resolve("appended")
        rows = len(table.rowset) if table is not None else 0
        say("BATCH", batch_id, rows, appended.replays, latest.replays)
        if rows >= n_rows:
            finished.set()  # both tables have every batch: a stop now interrupts nothing

    query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.rows_per_batch)
             .option("numPartitions", 1).load()
             .writeStream.foreachBatch(write).option("checkpointLocation", args.spark_checkpoint).start())

    while not finished.wait(0.05):
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
    query.stop()
    say("DONE", server.port)
    stdin_closed = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stdin_closed.set()), daemon=True).start()
    stdin_closed.wait()
    server.stop()
    engine.stop()
    spark.stop()


if __name__ == "__main__":
    main()
