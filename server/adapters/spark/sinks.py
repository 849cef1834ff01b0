"""Spark Structured Streaming `foreachBatch` sinks: each micro-batch becomes one update of a
tickwire table, exactly once.

    spark = spark_session("prices")
    server = TickwireServer(Engine(interval_ms=100), port=10000).start()
    q = (stream.groupBy("Sym").agg(...).writeStream.outputMode("update")
         .foreachBatch(sink(server, "latest", mode="upsert", keys=["Sym"]))
         .option("checkpointLocation", "/tmp/ck/latest").start())

Modes:
- "append": rows are appended (an append-only table; a ring table of the last `max_rows` rows
  when `max_rows` is given). For `append` output mode.
- "upsert" (needs `keys`): rows replace the row with the same key or are added; with
  `delete_column` (a boolean column, not part of the table), rows where it is true delete their
  key instead. Within a batch the last row of a key wins. For `update` output mode.
- "replace" (needs `keys`): the batch is the whole new table (`complete` output mode). It is
  compared with the table's current contents by key, in bulk: only keys that appeared are added,
  keys that disappeared removed, and keys whose values changed modified (with only the changed
  columns marked); unchanged rows are not touched. The sink must be the table's only writer.
- "blink": each batch replaces the previous one entirely (a blink table: a batch's rows are
  visible for one update-graph cycle).

The table is created from the first batch's schema (types mapped by `tickwire.clients.spark.types`)
unless it exists; an existing table must be of the mode's kind, with the same keys and columns.
Each batch is written with `Engine.write` to a `Destination` (tickwire.server.engine.ingest): the
modes, the table checks and the replace diff are the ones the remote Spark data source's commits
(`tickwire.server.engine.staging`) use too.

Exactly once: a batch is queued under the id ("spark", query id, batch id), the query id being
the one Spark keeps in the checkpoint, so a batch that Spark replays after a failure (same query,
same batch id) is recognised by the table and changes nothing, while different queries never
collide. The whole batch is queued with one call, so it is applied in one update-graph cycle.
With `wait=True` (default) and the graph's cycle thread running, the callback returns once the
cycle that applies the batch has finished: Spark commits a batch only after it is in the table,
and consecutive batches are never merged into one update.

Rows travel as Arrow end to end (`collect_arrow`: Spark's Arrow collection, no Python rows),
then numpy/pyarrow.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Optional, Protocol, Sequence, cast

import pyarrow as pa

from tickwire.clients.spark.types import SparkSinkError, arrow_schema_for_spark, conform_arrow
from tickwire.server.engine import Destination, Engine, ModeError, Table, WriteTimeout
from tickwire.server.engine.ingest import MODES, diff_by_key, last_per_key

__all__ = ["sink", "fan_out", "TickwireSink", "MODES", "diff_by_key", "last_per_key", "collect_arrow"]

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"


def collect_arrow(batch_df) -> Optional[pa.Table]:
    """The rows of a DataFrame as Arrow (None when there are none), without Python rows.

    Classic PySpark's `_collect_as_arrow` is what `DataFrame.toArrow()` runs, less a
    configuration round trip to the JVM, a schema conversion and a cast of the whole table (the
    sink conforms the types itself): about 7 ms less per batch for small batches, the same for
    large ones. `toArrow()` is the fallback where it is missing or its signature differs."""
    collect = getattr(batch_df, "_collect_as_arrow", None)
    if collect is not None:
        try:
            batches = collect(empty_list_if_zero_records=True)
        except TypeError:  # another signature: use the public method
            pass
        else:
            return pa.Table.from_batches(batches) if batches else None
    data = batch_df.toArrow()
    return data if data.num_rows else None


# ------------------------------------------------------------------------------------------------
# the sink
# ------------------------------------------------------------------------------------------------

def _engine_of(target) -> Engine:
    """The engine of an Engine or of a TickwireServer."""
    if isinstance(target, Engine):
        return target
    engine = getattr(target, "engine", None)
    if isinstance(engine, Engine):
        return engine
    raise TypeError(f"expected an Engine or a TickwireServer, got {type(target).__name__}")


class TickwireSink:
    """A `foreachBatch` function writing each micro-batch into one tickwire table; see the module
    documentation. `write(arrow_table, batch_id, scope)` is the same without Spark."""

    def __init__(self, target, table: str, mode: str = "append", keys: Optional[Sequence[str]] = None,
                 delete_column: Optional[str] = None, max_rows: Optional[int] = None, *, wait: bool = True,
                 wait_timeout: float = 60.0, scope: Optional[str] = None):
        self.engine = _engine_of(target)
        keys = [keys] if isinstance(keys, str) else keys
        try:
            self.dest = d = Destination(table, mode, tuple(keys) if keys is not None else None, delete_column,
                                        max_rows)
        except ModeError as exc:
            raise SparkSinkError(str(exc)) from None
        self.name, self.mode, self.keys = d.name, d.mode, list(d.keys) if d.keys else None
        self.delete_column, self.max_rows = d.delete_column, d.max_rows
        self.wait = wait
        self.wait_timeout = float(wait_timeout)
        self.scope = scope
        self._own_scope = f"sink-{uuid.uuid4().hex}"  # when the query id is unknown
        self._lock = threading.Lock()
        self._table: Optional[Table] = None
        self._checked_spark_schema = None
        self._schema: Optional[pa.Schema] = None
        # per batch: rows, seconds converting, queuing and waiting; whether it was a replay
        self.batches = 0
        self.replays = 0
        self.rows = 0
        self.last: dict = {}

    def __repr__(self) -> str:
        return f"TickwireSink({self.name!r}, mode={self.mode!r}, batches={self.batches}, rows={self.rows})"

    @property
    def table(self):
        """The tickwire table (None until the first batch, unless it already existed)."""
        if self._table is None:
            self._table = self.engine.resolve(self.name)
        return self._table

    # -- Spark -----------------------------------------------------------------------------------
    def __call__(self, batch_df, batch_id) -> None:
        _write_spark_batch((self,), batch_df, batch_id)

    def batch_key(self, batch_id, scope: Optional[str]) -> tuple:
        """The id a batch is applied under: ("spark", scope, batch id)."""
        return ("spark", scope or self.scope or self._own_scope, int(batch_id))

    def is_replay(self, key) -> bool:
        table = self.table
        if table is not None and table.has_batch(key):
            self.note(key, None, accepted=False, timing={})
            log.info("table %r: Spark batch %s of query %s was already applied; ignored", self.name, key[2], key[1])
            return True
        return False

    def schema_for(self, spark_schema) -> pa.Schema:
        if self._checked_spark_schema is not None and spark_schema == self._checked_spark_schema:
            return self._schema
        exclude = [self.delete_column] if self.delete_column else []
        if self.delete_column is not None:
            names = [f.name for f in spark_schema.fields]
            if self.delete_column not in names:
                raise SparkSinkError(f"tickwire sink into table {self.name!r}: the batch has no delete column "
                                     f"{self.delete_column!r}")
            from pyspark.sql.types import BooleanType
            dt = spark_schema[self.delete_column].dataType
            if not isinstance(dt, BooleanType):
                raise SparkSinkError(f"tickwire sink into table {self.name!r}: delete column "
                                     f"{self.delete_column!r} must be boolean, not {dt.simpleString()}")
        schema = arrow_schema_for_spark(spark_schema, self.name, exclude=exclude)
        self._ensure_table(schema)
        self._checked_spark_schema, self._schema = spark_schema, schema
        return schema

    # -- Arrow -----------------------------------------------------------------------------------
    def write(self, data, batch_id, scope: Optional[str] = None) -> bool:
        """Writes one batch given as Arrow (a Table or RecordBatch with the table's columns, plus the
        delete column in upsert mode). Returns False, changing nothing, for a batch id already
        applied in this scope (default: the sink's `scope`, else one of its own)."""
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        key = self.batch_key(batch_id, scope)
        if self.is_replay(key):
            return False
        schema = self._schema
        if schema is None:
            schema = pa.schema([f for f in data.schema if f.name != self.delete_column])
            self._ensure_table(schema)
        t0 = time.perf_counter()
        timing: dict = {}
        data = self.prepare_batch(data, schema, timing)
        (accepted,) = _queue_all([(self, data, key, timing)])
        timing["write_s"] = time.perf_counter() - t0
        self.note(key, timing.get("rows"), accepted, timing)
        return accepted

    def prepare_batch(self, data: Optional[pa.Table], schema: pa.Schema, timing: dict) -> pa.Table:
        """The batch in the table's types (plus the delete column in upsert mode)."""
        t0 = time.perf_counter()
        data = conform_arrow(data, schema, self.name, self.dest.extra_schema)
        timing["prepare_s"] = time.perf_counter() - t0
        return data

    def note(self, key, rows: Optional[int], accepted: bool, timing: dict) -> None:
        with self._lock:
            if accepted:
                self.batches += 1
                self.rows += rows or 0
            else:
                self.replays += 1
            self.last = {"batch_id": key[2], "scope": key[1], "replay": not accepted, **timing}

    # -- the table -------------------------------------------------------------------------------
    def _ensure_table(self, schema: pa.Schema) -> None:
        try:
            self._table = self.engine.destination_table(self.dest, schema)
        except ModeError as exc:
            raise SparkSinkError(str(exc)) from None


def _queue_all(items) -> list[bool]:
    """Writes each `(sink, data, batch id, timing)`. Sinks that wait and whose engine's cycle
    thread runs queue them as the engine's writes of one cycle, then wait once for that cycle."""
    results = [False] * len(items)
    by_engine: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        by_engine.setdefault(id(item[0].engine), []).append(i)
    for idx in by_engine.values():
        engine = items[idx[0]][0].engine
        waiting = [i for i in idx if items[i][0].wait] if engine.running else []
        if not waiting:
            for i in idx:
                s, data, key, timing = items[i]
                results[i] = engine.write(s.dest, data, batch_id=key, wait=False, timing=timing)
                timing["queued_at"] = time.perf_counter()
            continue
        timeout = max(items[i][0].wait_timeout for i in waiting)
        queued = None
        try:
            # no cycle starts inside: the next one takes every batch, and leaving waits for it
            with engine.writes(timeout=timeout) as writes:
                for i in idx:
                    s, data, key, timing = items[i]
                    results[i] = writes.write(s.dest, data, batch_id=key, timing=timing)
                queued = time.perf_counter()
        except WriteTimeout:
            log.warning("tables %s: the update graph did not apply a Spark batch within %.0f s",
                        [items[i][0].name for i in waiting], timeout)
        applied = time.perf_counter()
        for i in idx:
            items[i][3]["queued_at"] = queued
            if i in waiting:
                items[i][3]["applied_at"] = applied
        for i in waiting:  # a table whose storage refused the cycle's input did not apply the batch
            sink = items[i][0]
            refusal = getattr(sink.table, "refusal", None)
            if refusal is not None and results[i]:
                raise SparkSinkError(f"tickwire sink into table {sink.name!r}: the batch was not applied: {refusal}")
    return results


def _query_id(batch_df) -> Optional[str]:
    """The streaming query's id (kept in its checkpoint): Spark sets it as a local property of the
    thread that runs the batch."""
    try:
        return batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # noqa: BLE001 - not classic PySpark: each sink falls back to its own scope
        return None


def _write_spark_batch(sinks: Sequence[TickwireSink], batch_df, batch_id) -> None:
    """One micro-batch into every sink that does not have it yet, collected from Spark once."""
    t0 = time.perf_counter()
    query = _query_id(batch_df)
    # a sink's own `scope` (when given) wins over the query's id
    todo = [(s, s.batch_key(batch_id, s.scope or query)) for s in sinks]
    todo = [(s, key) for s, key in todo if not s.is_replay(key)]
    if not todo:
        return
    schemas = [s.schema_for(batch_df.schema) for s, _ in todo]
    data = collect_arrow(batch_df)
    convert = time.perf_counter() - t0
    items = []
    for (s, key), schema in zip(todo, schemas):
        timing: dict[str, Any] = {"convert_s": convert}
        items.append((s, s.prepare_batch(data, schema, timing), key, timing))
    results = _queue_all(items)
    for (s, key), (_s, _data, _key, timing), accepted in zip(todo, items, results):
        timing["write_s"] = time.perf_counter() - t0 - convert
        s.note(key, timing.get("rows"), accepted, timing)


class FanOut(Protocol):
    """What `fan_out` returns: a `foreachBatch` function that carries its sinks."""

    sinks: tuple[TickwireSink, ...]

    def __call__(self, batch_df: Any, batch_id: int) -> None: ...


def fan_out(*sinks: TickwireSink) -> FanOut:
    """A `foreachBatch` function writing each micro-batch into several tables (e.g. the same rows
    appended to one table, into a ring table and into a blink table), collecting it from Spark
    once. Each table applies each batch exactly once on its own; sinks that wait are queued
    together, so the batch reaches every table of a graph in the same cycle."""
    if not sinks or not all(isinstance(s, TickwireSink) for s in sinks):
        raise TypeError("fan_out takes one or more TickwireSink (from sink(...))")

    def write(batch_df: Any, batch_id: int) -> None:
        _write_spark_batch(sinks, batch_df, batch_id)

    fn = cast(FanOut, write)  # a function with an attribute
    fn.sinks = sinks
    return fn


def sink(target, table: str, mode: str = "append", keys: Optional[Sequence[str]] = None,
         delete_column: Optional[str] = None, max_rows: Optional[int] = None, **options) -> TickwireSink:
    """A `foreachBatch` function `(batch_df, batch_id) -> None` writing each micro-batch of a
    Spark streaming query into table `table` of `target` (an Engine or a TickwireServer).
    Options: `wait` (default True), `wait_timeout` (seconds, default 60), `scope` (the batch-id
    scope; default the query's id)."""
    return TickwireSink(target, table, mode=mode, keys=keys, delete_column=delete_column, max_rows=max_rows,
                        **options)
