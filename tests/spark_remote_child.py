"""The processes tests/test_spark_remote.py starts: Spark streaming queries writing into a tickwire
server that runs in another process, and (for the fault tests) such a server.

    python tests/spark_remote_child.py run SPEC.json
    python tests/spark_remote_child.py serve --port P --data-dir DIR

`run` starts one SparkSession (classic, with `spark_session`, or Spark Connect with
`"connect": true`), registers the "tickwire" data source and the test-only "tickwire_faulty"
one (below), starts every query of the spec at once and waits for each to end (they read a
directory of Parquet files one file per micro-batch with the available-now trigger, so they
end by themselves). A query's sink is either the data source (`"sink": "remote"`: the server
in the other process) or tickwire's in-process `foreachBatch` sinks (`"sink": "local"`: an
engine in this process), the reference the remote tables are compared with; the local
tables, and every update each of them had (`Recorder`), are written to the spec's `local_out`
as JSON. A query with "then" (another query) that fails is followed by that one, started in
the same session, as a user restarts a query in a long-lived Spark application. A query with
"stop_on" (a path) is stopped with `StreamingQuery.stop()` once that file exists (it says
"STOPPED <name>"); with "go_on_stop" (a path) too, that file is made once the query is marked
stopped, while its stop waits for it (for a commit held until then: a stop waits for the
driver's Python calls, which an interrupt does not cut short). After the queries, the spec's
"log_error" (a message), if any, is logged at ERROR through Spark's JVM logger
org.apache.spark.util.Utils, and each of "log_lines" ([logger, message] pairs) through its logger.

Lines on stdout (flushed; the parent reads them): "SPARK <version> <module of the session's
class>" once the session is up, "STARTED <name>" for each query, then "DONE <name>",
"FAILED <name> <JSON string: the query's exception>" or "STOPPED <name>", and "ALL-DONE" last.

The "tickwire_faulty" data source is tickwire's with faults the tests ask for in its "fault"
option (JSON); it is defined in this script, so Spark pickles it by value to its workers:
- "kill": [{"batch": b, "partition": p, "when": "mid" | "staged"}]: the first attempt of
  that task dies by SIGKILL (its Python worker), either in the middle of its upload ("mid":
  once part of its rows reached the server, which the worker sees in the server's staging
  status, once the parts listed in its "after" are staged) or once its part is staged, before
  its commit message reaches the driver ("staged"); each kill appends a JSON line to the "log"
  file first;
- "hold": {"batch": b, "when": "before" | "after", "marker": path, "go": path or null}: the
  driver's commit of batch b writes `marker` (the commit messages' parts, as JSON) before or
  after committing on the server, then waits until the file `go` exists (when null, until the
  parent kills the process; ten minutes at most either way);
- "stall": {"batch": b, "marker": path}: each task of batch b uploads half of its rows, writes
  `marker` and waits with its upload open until it is killed (ten minutes at most).

`serve` runs a TickwireServer with a data directory on a fixed port, prints "READY <port>" and
serves until its stdin closes.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tickwire.server.engine import Engine, EngineConfig

FAULTY = "tickwire_faulty"


def say(*parts) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------------
# what the tables of an engine did (used here for the in-process sinks and by the test for the server)
# ------------------------------------------------------------------------------------------------

class Recorder:
    """Every engine cycle's update of the tables `names`: the rows added (their values), the number
    of rows removed and modified, and the modified columns, one entry per cycle.

    The tables are made later (by a sink's first batch, by a commit), so each is listened to from
    the end of the first cycle that finds it. Tables are made between cycles, so when that cycle is
    also the one of the table's first change (a table made and written between two cycles, as the
    sinks and commits do), the table was empty before it: that update is read from the table, all
    its rows added and nothing removed or modified."""

    def __init__(self, engine, names):
        self.engine = engine
        self.names = set(names)
        self.lock = threading.Lock()
        self.updates: dict[str, list[dict]] = {n: [] for n in self.names}
        self.watched: set[str] = set()
        with engine.reading():
            self._watch(None)  # the tables there are already
            engine.add_cycle_listener(self._watch)

    def _record(self, name: str, step: int, added: list, removed: int, modified: int, columns: list) -> None:
        entry = {"step": step, "added": added, "removed": removed, "modified": modified, "modified_columns": columns}
        with self.lock:
            self.updates[name].append(entry)

    def _on_update(self, table, u, step: int) -> None:
        self._record(table.name, step, table.gather(None, u.added).to_pylist(), int(u.removed.size),
                     int(u.modified.size), sorted(u.modified_columns))

    def _watch(self, step: int | None) -> None:
        """At a cycle boundary (the end of cycle `step`): listens to the tables made since the last one."""
        for name in sorted(self.names - self.watched):
            table = self.engine.resolve(name, hidden=True)
            if table is None:
                continue
            if step is not None and table.last_step == step:  # made and first changed since the last cycle
                self._record(name, step, table.gather().to_pylist(), 0, 0, [])
            table.add_listener(self._on_update)
            self.watched.add(name)

    def table(self, name: str) -> dict:
        """The table now: its row keys, rows (in row-key order) and column types."""
        t = self.engine.resolve(name, hidden=True)
        with self.engine.reading():
            data = t.gather_with_keys(key_column="__key")
        return {"keys": data.column("__key").to_pylist(), "rows": data.drop_columns(["__key"]).to_pylist(),
                "schema": [[f.name, str(f.type)] for f in t.schema], "kind": type(t).__name__}

    def dump(self) -> dict:
        with self.lock:
            return {n: {"updates": list(self.updates[n]), **self.table(n)} for n in self.names
                    if self.engine.resolve(n, hidden=True) is not None}


# ------------------------------------------------------------------------------------------------
# the data source with faults
# ------------------------------------------------------------------------------------------------

def faulty_source():
    """The "tickwire_faulty" data source class (see the module documentation)."""
    from tickwire.clients.spark.datasource import BATCH_ID_PROPERTY, TickwireDataSource, TickwireStreamWriter

    class FaultyWriter(TickwireStreamWriter):
        def __init__(self, options, spark_schema):
            super().__init__(options, spark_schema)
            opts = {str(k).lower(): v for k, v in options.items()}
            self.fault = json.loads(opts.get("fault") or "{}")

        def staging_status(self) -> dict:
            """The server's `tickwire.staging` action, with the writer's address and credentials."""
            import pyarrow.flight as fl

            from tickwire.clients.spark import datasource

            client = fl.FlightClient(self.uri, **({"tls_root_certs": self.root_certs} if self.root_certs else {}))
            auth = f"{datasource.PSK_AUTH} {self.psk}" if self.psk else "Anonymous"
            options = fl.FlightCallOptions(headers=[(b"authorization", auth.encode())], timeout=30)
            try:
                (res,) = list(client.do_action(fl.Action("tickwire.staging", b""), options=options))
            finally:
                client.close()
            return json.loads(res.body.to_pybytes())

        def _log(self, **what) -> None:
            if self.fault.get("log"):
                with open(self.fault["log"], "a") as f:
                    f.write(json.dumps(what) + "\n")

        def write(self, iterator):
            from pyspark import TaskContext

            from tickwire.clients.spark import datasource

            tc = TaskContext.get()
            batch, partition = int(tc.getLocalProperty(BATCH_ID_PROPERTY)), tc.partitionId()
            stall = self.fault.get("stall")
            if stall is not None and int(stall["batch"]) == batch:
                return super().write(self._stalled(iterator, stall["marker"]))
            kill = next((k for k in self.fault.get("kill", []) if k["batch"] == batch and
                         k["partition"] == partition), None)
            if kill is None or tc.attemptNumber() != 0:
                return super().write(iterator)
            what = dict(kill, attempt=str(tc.taskAttemptId()), pid=os.getpid())
            if kill["when"] == "staged":
                msg = super().write(iterator)
                self._log(**what, rows=msg.rows, part=msg.part)
                os.kill(os.getpid(), signal.SIGKILL)
            # "mid": the upload gets the first half of the rows; asked for more, the worker waits
            # until the server holds some of them, then dies with the stream open
            import pyarrow as pa

            data = pa.Table.from_batches(list(iterator)).combine_chunks()
            if data.num_rows < 2:
                raise RuntimeError(f"batch {batch} partition {partition}: too few rows to cut an upload")
            half = data.num_rows // 2
            producer = self.producer or tc.getLocalProperty(datasource.QUERY_ID_PROPERTY)

            def rows():
                yield from data.slice(0, half).to_batches()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    # once the other parts named in "after" are staged, the bytes the server holds
                    # for this producer beyond its staged parts are this upload's
                    status = self.staging_status()
                    mine = [p for b in status["batches"] if b["producer"] == producer for p in b["parts"]]
                    others = {p["part"] for b in status["batches"] if b["producer"] == producer and
                              b["batch"] == batch for p in b["parts"]}
                    in_flight = status["producers"].get(producer, 0) - sum(p["bytes"] for p in mine)
                    if in_flight > 0 and others >= set(kill.get("after", [])):
                        self._log(**what, rows=half, in_flight_bytes=in_flight)
                        os.kill(os.getpid(), signal.SIGKILL)
                    time.sleep(0.02)
                raise RuntimeError("the server never showed the first rows of the upload as received")

            return super().write(rows())

        @staticmethod
        def _stalled(iterator, marker: str):
            """Half of the rows, then a wait (the upload open) until the task is killed."""
            import pyarrow as pa

            data = pa.Table.from_batches(list(iterator)).combine_chunks()
            yield from data.slice(0, max(1, data.num_rows // 2)).to_batches()
            Path(marker).write_text(str(os.getpid()))
            time.sleep(600)
            raise RuntimeError("stalled for 600 s: the task was never killed")

        def commit(self, messages, batchId):
            hold = self.fault.get("hold")
            holding = hold is not None and int(hold["batch"]) == int(batchId)
            if holding and hold["when"] == "before":
                self._hold(hold, messages)
            super().commit(messages, batchId)
            if holding and hold["when"] == "after":
                self._hold(hold, messages)

        @staticmethod
        def _hold(hold, messages) -> None:
            parts = [[m.part, m.attempt, m.rows] for m in messages if m is not None and m.part is not None]
            producer = next((m.producer for m in messages if m is not None), None)
            tmp = hold["marker"] + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"producer": producer, "parts": parts, "pid": os.getpid()}, f)
            os.replace(tmp, hold["marker"])
            deadline = time.monotonic() + 600  # the parent kills this process or lets it go long before
            while hold.get("go") is None or not os.path.exists(hold["go"]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"held the commit for 600 s: no {hold.get('go')}")
                time.sleep(0.05)

    class FaultySource(TickwireDataSource):
        @classmethod
        def name(cls) -> str:
            return FAULTY

        def streamWriter(self, schema, overwrite: bool):
            return FaultyWriter(dict(self.options), schema)

    return FaultySource


# ------------------------------------------------------------------------------------------------
# queries
# ------------------------------------------------------------------------------------------------

def shaped(df, shape: str):
    """The query's rows: "raw" (the input, hash-partitioned in two by Seq, so batches have two
    parts), "keyed" (the input, hash-partitioned by Sym: the rows of a Sym stay in one partition,
    in input order), "totals" (running totals per Sym, with a Closed flag: an update-mode
    aggregation), "replace" (totals per Sym below a limit, whole: a complete-mode aggregation)."""
    from pyspark.sql import functions as F

    if shape == "raw":
        return df.repartition(2, "Seq")
    if shape == "keyed":
        return df.repartition(2, "Sym")
    if shape == "totals":
        return df.groupBy("Sym").agg(F.sum("Size").alias("Total"), F.count("*").alias("N"),
                                     F.max("Seq").alias("Last"), F.bool_or("Closed").alias("Closed"))
    if shape == "replace":
        return df.groupBy("Sym").agg(F.sum("Size").alias("Total"), F.max("Seq").alias("Last")) \
            .where(F.col("Total") < 12)
    raise SystemExit(f"unknown shape {shape!r}")


def start_query(spark, q: dict, engine):
    df = (spark.readStream.schema(q["ddl"]).option("maxFilesPerTrigger", 1).parquet(q["input"]))
    w = shaped(df, q["shape"]).writeStream.outputMode(q.get("output_mode", "append")) \
        .option("checkpointLocation", q["checkpoint"]).trigger(availableNow=True).queryName(q["name"])
    if q["sink"] == "remote":
        w = w.format(q.get("format", "tickwire"))
        for k, v in q["options"].items():
            w = w.option(k, v if isinstance(v, str) else json.dumps(v))
        return w.start()
    from tickwire.server.adapters.spark import fan_out, sink

    sinks = [sink(engine, t["table"], t.get("mode", "append"), keys=t.get("keys"),
                  delete_column=t.get("delete_column"), max_rows=t.get("max_rows")) for t in q["tables"]]
    return w.foreachBatch(fan_out(*sinks)).start()


def wait(query):
    """The query's exception once it ended (None when it ended well)."""
    try:
        query.awaitTermination()
        return query.exception()
    except Exception as exc:  # noqa: BLE001 - a failed query: reported to the parent
        return exc


def run(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if spec.get("connect"):
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.remote(spec.get("master", "local[2]"))
                 .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
                 .config("spark.sql.execution.arrow.useLargeVarTypes", "false").getOrCreate())
    else:
        from tickwire.server.adapters.spark import spark_session

        spark = spark_session("tickwire-remote-child", master=spec.get("master", "local[2]"))
    from tickwire.clients.spark.datasource import register

    register(spark)
    spark.dataSource.register(faulty_source())
    say("SPARK", spark.version, type(spark).__module__)

    engine = recorder = None
    local = [q for q in spec["queries"] if q["sink"] == "local"]
    if local:
        engine = Engine(interval_ms=20).start()
        recorder = Recorder(engine, [t["table"] for q in local for t in q["tables"]])
    queries = {}
    for q in spec["queries"]:
        queries[q["name"]] = (q, start_query(spark, q, engine))
        say("STARTED", q["name"])
    for name, (q, query) in queries.items():
        if q.get("stop_on"):
            deadline = time.monotonic() + 600
            while not os.path.exists(q["stop_on"]) and query.isActive and time.monotonic() < deadline:
                time.sleep(0.05)
            stopping = threading.Thread(target=query.stop)
            stopping.start()
            if q.get("go_on_stop"):
                while query.isActive and stopping.is_alive():
                    time.sleep(0.01)
                Path(q["go_on_stop"]).touch()
            stopping.join()
            say("STOPPED", name)
            continue
        while True:
            error = wait(query)
            if error is None:
                say("DONE", name)
            else:
                say("FAILED", name, json.dumps(str(error)))
            if error is None or "then" not in q:
                break
            # a failed query with a "then" is started again in this session (its Spark
            # application, executors and Python workers), as the "then" query
            q = q["then"]
            name = q["name"]
            query = start_query(spark, q, engine)
            say("STARTED", name)
    if recorder is not None:
        Path(spec["local_out"]).write_text(json.dumps(recorder.dump()))
        engine.stop()
    lines = [["org.apache.spark.util.Utils", spec["log_error"]]] if spec.get("log_error") else []
    for logger, message in lines + spec.get("log_lines", []):
        jvm = spark._jvm  # noqa: SLF001 - the only way to Spark's own (log4j) loggers from Python
        jvm.org.apache.logging.log4j.LogManager.getLogger(logger).error(message)
    say("ALL-DONE")
    spark.stop()


def serve(port: int, data_dir: str) -> None:
    from tickwire.server.app import TickwireServer

    engine = Engine(EngineConfig(interval_ms=20, data_dir=data_dir))  # the server opens it at its start
    server = TickwireServer(engine, port=port, web=False).start()
    say("READY", server.port)
    sys.stdin.read()
    server.stop()
    engine.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("spec")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--data-dir", required=True)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.spec)
    else:
        serve(args.port, args.data_dir)


if __name__ == "__main__":
    main()
