"""`writeStream.format("tickwire")`: Spark streaming into a tickwire server running elsewhere, exactly once.

    from tickwire.clients.spark.datasource import register
    register(spark)                     # spark.dataSource.register(TickwireDataSource)
    (df.writeStream.format("tickwire")
       .option("uri", "grpc://host:10000").option("table", "prices")
       .option("mode", "upsert").option("keys", "Sym")
       .option("checkpointLocation", "/ck/prices").start())

It is a Spark Python data source (pyspark.sql.datasource, Spark 4.1 or later), so it works from a
cluster and from Spark Connect as well as from a local session: executors stream their partitions
of each micro-batch to the server with Flight DoPut, staged (not visible) under (query id, batch
id, partition, task attempt); once every task succeeded, the driver's `commit(batchId)` publishes
the staged parts of the batch in one update-graph cycle with the `tickwire.commit` action, and
`abort` discards them (protocol/txn.py, tickwire.server.engine.staging). The batch id the table
remembers is ("txn", query id, batch id); the query id is the one Spark keeps in the checkpoint,
so a batch Spark runs again after a failure of the driver, an executor or the server is
acknowledged and not applied twice. A failed commit (the server lost the staged parts in a
restart, the table refused the rows) fails the batch with the server's message: the query stops
and, restarted from its checkpoint, writes the batch again.

Options (strings, as Spark passes them):
- `uri` (required): grpc://host:port or grpc+tls://host:port;
- `table` (required); `mode`: append (default), upsert, replace or blink; `keys`: comma-separated
  key columns (upsert, replace); `delete_column` (upsert: a boolean column whose true rows delete
  their key); `max_rows` (append: a ring table of the last max_rows rows);
- `psk`: the server's pre-shared key; `tls` (true/false, also implied by grpc+tls://),
  `tls_root_certs`: a PEM file of the certificates to trust (read on the driver);
- `producer`: the name batches are remembered under (default: the streaming query's id);
- `timeout`: seconds for each call (default 120).

Output modes: Spark gives Python data sources the append and complete modes only (update mode
fails at the query's start: "tickwire does not support Update mode"). A stateless query upserts
with append output mode; an aggregation's results go whole into mode "replace" with complete
output mode, or through the in-process `foreachBatch` sinks (tickwire.server.adapters.spark.sinks).

Types are mapped as the in-process sinks map them (`tickwire.clients.spark.types`), and the
server checks and applies batches through the same `Destination` (`Engine.write`), so the same query gives the same
table either way.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

import pyarrow as pa
import pyarrow.flight as fl

from tickwire.clients.spark.types import SparkSinkError, arrow_schema_for_spark, conform_arrow
from tickwire.protocol.txn import ACTION_ABORT, ACTION_COMMIT, MODES, AbortRequest, CommitRequest, Transaction

try:  # Spark's Python data source API (pyspark 4.1+); the module stays importable without it
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage
except ImportError:  # pragma: no cover - pyspark missing or too old
    if not TYPE_CHECKING:  # the type checker reads pyspark's classes
        DataSource = DataSourceStreamArrowWriter = WriterCommitMessage = object

__all__ = ["TickwireDataSource", "TickwireStreamWriter", "PartCommit", "register", "NAME"]

log = logging.getLogger(__name__)

NAME = "tickwire"
PSK_AUTH = "io.deephaven.authentication.psk.PskAuthenticationHandler"
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def register(spark) -> None:
    """Registers the data source with a SparkSession (classic or Spark Connect) as "tickwire"."""
    spark.dataSource.register(TickwireDataSource)


@dataclass
class PartCommit(WriterCommitMessage):
    """What a task tells the driver: the part it staged (None when its partition was empty)."""

    producer: str
    batch: int
    part: Optional[str]
    attempt: Optional[str]
    rows: int


class TickwireDataSource(DataSource):
    """The "tickwire" data source: a streaming sink (see the module documentation)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def streamWriter(self, schema, overwrite: bool) -> "TickwireStreamWriter":
        return TickwireStreamWriter(dict(self.options), schema)


class TickwireStreamWriter(DataSourceStreamArrowWriter):
    """Made on the driver from the query's options and schema (which are checked here, so a bad
    option or an unsupported column fails the query at its start); pickled to the executors."""

    def __init__(self, options: dict, spark_schema):
        opts = {str(k).lower(): v for k, v in options.items()}
        self.uri = _required(opts, "uri")
        self.table = _required(opts, "table")
        where = f"tickwire sink into table {self.table!r}"
        self.mode = opts.get("mode", "append")
        if self.mode not in MODES:
            raise SparkSinkError(f"{where}: mode must be one of {MODES}, got {self.mode!r}")
        self.keys = tuple(k.strip() for k in opts.get("keys", "").split(",") if k.strip())
        self.delete_column = opts.get("delete_column") or None
        self.max_rows = int(opts["max_rows"]) if opts.get("max_rows") else None
        self.producer = opts.get("producer") or None
        self.psk = opts.get("psk") or None
        self.timeout = float(opts.get("timeout", 120))
        tls = str(opts.get("tls", "false")).lower() in ("1", "true", "yes")
        scheme = self.uri.partition("://")[0].lower()
        if scheme not in ("grpc", "grpc+tcp", "grpc+tls"):
            raise SparkSinkError(f"{where}: uri must be grpc://host:port or grpc+tls://host:port, got {self.uri!r}")
        if tls and scheme != "grpc+tls":
            self.uri = "grpc+tls://" + self.uri.partition("://")[2]
        certs = opts.get("tls_root_certs")
        self.root_certs = open(certs, "rb").read() if certs else None
        if self.delete_column is not None:
            names = [f.name for f in spark_schema.fields]
            if self.delete_column not in names:
                raise SparkSinkError(f"{where}: the batch has no delete column {self.delete_column!r}")
            dt = spark_schema[self.delete_column].dataType
            if dt.typeName() != "boolean":
                raise SparkSinkError(f"{where}: delete column {self.delete_column!r} must be boolean, not "
                                     f"{dt.simpleString()}")
        exclude = [self.delete_column] if self.delete_column else []
        self.schema = arrow_schema_for_spark(spark_schema, self.table, exclude=exclude)
        self.extra = pa.schema([pa.field(self.delete_column, pa.bool_())]) if self.delete_column else None
        self.upload_schema = pa.schema(list(self.schema) + (list(self.extra) if self.extra is not None else []))

    # -- executors ---------------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartCommit:
        from pyspark import TaskContext

        tc = TaskContext.get()
        assert tc is not None  # write() runs in a Spark task
        producer = self.producer or tc.getLocalProperty(QUERY_ID_PROPERTY)
        batch_property = tc.getLocalProperty(BATCH_ID_PROPERTY)
        if not producer or batch_property is None:
            raise SparkSinkError(f"tickwire sink into table {self.table!r}: no streaming query id or batch id in "
                                 f"the task (the tickwire data source is a streaming sink)")
        batch = int(batch_property)
        part, attempt = str(tc.partitionId()), str(tc.taskAttemptId())
        first = None
        for rb in iterator:
            if rb.num_rows:
                first = rb
                break
        if first is None:
            return PartCommit(producer, batch, None, None, 0)
        txn = Transaction(producer=producer, batch=batch, part=part, attempt=attempt, commit=False, mode=self.mode,
                          keys=self.keys, delete_column=self.delete_column, max_rows=self.max_rows)
        rows = 0

        def batches():
            nonlocal rows
            for rb in _chain(first, iterator):
                if rb.num_rows:
                    t = conform_arrow(pa.Table.from_batches([rb]), self.schema, self.table, self.extra)
                    rows += t.num_rows
                    yield t

        _connection(self).put(self.table, self.upload_schema, txn.to_json(), batches())
        return PartCommit(producer, batch, part, attempt, rows)

    # -- the driver --------------------------------------------------------------------------------
    def commit(self, messages, batchId: int) -> None:
        msgs = [m for m in messages if m is not None]
        producer = self.producer or next((m.producer for m in msgs), None)
        if producer is None:
            if self.mode != "replace":
                return  # no partitions at all: nothing to publish
            raise SparkSinkError(f"tickwire sink into table {self.table!r}: batch {batchId} has no partitions, so "
                                 f"its query id is unknown; set the 'producer' option")
        parts = tuple((m.part, m.attempt) for m in msgs if m.part is not None)
        req = CommitRequest(producer=producer, batch=int(batchId), table=self.table, mode=self.mode,
                            keys=self.keys, delete_column=self.delete_column, max_rows=self.max_rows, parts=parts)
        _connection(self).action(ACTION_COMMIT, req.to_json())

    def abort(self, messages, batchId: int) -> None:
        producer = self.producer or next((m.producer for m in messages if m is not None), None)
        if producer is None:
            return  # nothing was staged that we can name; staged parts expire on the server
        try:
            _connection(self).action(ACTION_ABORT, AbortRequest(producer, int(batchId)).to_json())
        except Exception as exc:  # noqa: BLE001 - the batch failed already; its staged parts also expire
            log.warning("tickwire sink into table %r: abort of batch %s not delivered (%s); its staged parts "
                        "expire on the server", self.table, batchId, exc)


def _required(opts: dict, name: str) -> str:
    v = opts.get(name)
    if not v:
        raise SparkSinkError(f"the tickwire data source needs option {name!r}")
    return v


def _chain(first, rest):
    yield first
    yield from rest


# -- connections: one Flight client per process and server, with the server's session token -----------

class _Connection:
    # a session token unused for this long may have expired on the server (its default idle
    # lifetime is 5 minutes): the next call logs in again rather than fail
    STALE_S = 60.0

    def __init__(self, uri: str, psk: Optional[str], root_certs: Optional[bytes], timeout: float):
        self.timeout = timeout
        self.initial = f"{PSK_AUTH} {psk}" if psk else "Anonymous"
        self.bearer: Optional[str] = None
        self.used = 0.0
        self.lock = threading.Lock()
        kwargs = {"tls_root_certs": root_certs} if root_certs else {}
        self.client = fl.FlightClient(uri, middleware=[_AuthMiddlewareFactory(self)], **kwargs)

    def _options(self):
        now = time.monotonic()
        with self.lock:
            if self.bearer is not None and now - self.used > self.STALE_S:
                self.bearer = None
            self.used = now
        return fl.FlightCallOptions(timeout=self.timeout)

    def _retrying(self, call):
        """Runs `call()`; once more with fresh credentials when the session token expired."""
        try:
            return call()
        except fl.FlightUnauthenticatedError:
            with self.lock:
                if self.bearer is None:
                    raise
                self.bearer = None
            return call()

    def put(self, table: str, schema: pa.Schema, txn: bytes, tables) -> dict:
        """Uploads `tables`. A session token the server refuses (it restarted, or the session
        expired) is dropped; the upload starts again with fresh credentials when the refusal came
        before a second table was taken from `tables`, else the task fails (its retry logs in)."""
        tables = iter(tables)
        first = next(tables, None)
        taken = []

        def rest():
            for t in tables:
                taken.append(1)
                yield t

        head = [first] if first is not None else []
        try:
            return self._put(table, schema, txn, head, rest())
        except fl.FlightUnauthenticatedError:
            with self.lock:
                stale, self.bearer = self.bearer is not None, None
            if not stale or taken:
                raise
            return self._put(table, schema, txn, head, rest())

    def _put(self, table: str, schema: pa.Schema, txn: bytes, first: list, tables) -> dict:
        writer, reader = self.client.do_put(fl.FlightDescriptor.for_path("scope", table), schema,
                                            options=self._options())
        result: dict = {}
        try:
            writer.write_metadata(txn)
            for t in itertools.chain(first, tables):
                writer.write_table(t, max_chunksize=65536)
            writer.done_writing()
            while True:
                buf = reader.read()
                if buf is None:
                    break
                if buf.size:
                    result = json.loads(buf.to_pybytes())
        finally:
            writer.close()
        return result

    def action(self, kind: str, body: bytes) -> dict:
        def call():
            out = list(self.client.do_action(fl.Action(kind, body), options=self._options()))
            return json.loads(out[0].body.to_pybytes()) if out else {}

        return self._retrying(call)


class _AuthMiddlewareFactory(fl.ClientMiddlewareFactory):
    def __init__(self, conn: _Connection):
        self.conn = conn

    def start_call(self, info):
        return _AuthMiddleware(self.conn)


class _AuthMiddleware(fl.ClientMiddleware):
    """Sends the session's bearer token once the server gave one (else the initial credentials),
    and learns it from the response headers, so one process keeps one session."""

    def __init__(self, conn: _Connection):
        self.conn = conn

    def sending_headers(self):
        with self.conn.lock:
            return {"authorization": self.conn.bearer or self.conn.initial}

    def received_headers(self, headers):
        for v in headers.get("authorization", ()):
            v = v.decode() if isinstance(v, bytes) else v
            if v.startswith("Bearer "):
                with self.conn.lock:
                    self.conn.bearer = v

    def call_completed(self, exception):
        pass


_connections: dict = {}
_connections_lock = threading.Lock()


def _connection(w: TickwireStreamWriter) -> _Connection:
    key = (os.getpid(), w.uri, w.psk, w.root_certs, w.timeout)
    with _connections_lock:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = _Connection(w.uri, w.psk, w.root_certs, w.timeout)
        return conn
