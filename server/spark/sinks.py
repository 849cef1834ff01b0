"""Spark Structured Streaming `foreachBatch` sinks: each micro-batch becomes one update of a
tickwire table, exactly once.

    spark = spark_session("prices")
    graph = UpdateGraph(interval_ms=100)
    server = TickwireServer(graph, port=10000).start()
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

The table is created from the first batch's schema (types mapped by `tickwire.server.spark.types`)
unless it exists; an existing table must be of the mode's kind, with the same keys and columns.

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
import weakref
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine import CatalogError, IngestError, TableSpec, engine_of
from tickwire.server.graph import (
    AppendOnlyTable,
    BlinkTable,
    KeyedTable,
    KeyIndex,
    RingTable,
    UpdateGraph,
    equal_mask,
    hash_columns,
)
from tickwire.server.spark.types import SparkSinkError, arrow_schema_for_spark, conform_arrow

__all__ = ["sink", "fan_out", "TickwireSink", "MODES", "diff_by_key", "last_per_key", "collect_arrow"]

log = logging.getLogger(__name__)

MODES = ("append", "upsert", "replace", "blink")
QUERY_ID_PROPERTY = "sql.streaming.queryId"

_create_lock = threading.Lock()


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
# bulk helpers
# ------------------------------------------------------------------------------------------------

def _key_arrays(t: pa.Table, keys: Sequence[str]) -> list[pa.Array]:
    return [t.column(k).combine_chunks() for k in keys]


class KeyHashes:
    """The key hashes of a table's rows, sorted (`sorted`, with `order` mapping them back to rows);
    `unique` tells whether no two rows share a hash (then no two rows share a key)."""

    __slots__ = ("order", "sorted", "unique")

    def __init__(self, t: pa.Table, keys: Sequence[str]):
        h = hash_columns(_key_arrays(t, keys)) if t.num_rows else np.zeros(0, dtype=np.uint64)
        self.order = np.argsort(h, kind="stable")
        self.sorted = h[self.order]
        self.unique = not bool(np.any(self.sorted[1:] == self.sorted[:-1]))


def last_per_key(t: pa.Table, keys: Sequence[str], hashes: Optional[KeyHashes] = None) -> pa.Table:
    """The last row of each key, in the order of those last rows."""
    n = t.num_rows
    if n < 2:
        return t
    if (hashes or KeyHashes(t, keys)).unique:
        return t  # distinct hashes: distinct keys
    pos = pa.array(np.arange(n, dtype=np.int64))
    last = t.select(list(keys)).append_column("__tickwire_pos", pos).group_by(list(keys), use_threads=False) \
        .aggregate([("__tickwire_pos", "max")]).column("__tickwire_pos_max").to_numpy()
    return t.take(pa.array(np.sort(last)))


def _match(old: pa.Table, old_h: KeyHashes, new: pa.Table, new_h: KeyHashes, keys: Sequence[str]) -> np.ndarray:
    """For each row of `new` (one row per key), the row of `old` (one row per key) with the same
    key, or -1."""
    old_keys, new_keys = _key_arrays(old, keys), _key_arrays(new, keys)

    def same_key(qi: np.ndarray, rows: np.ndarray) -> np.ndarray:
        ok = np.ones(qi.size, dtype=bool)
        qa, ra = pa.array(qi, pa.int64()), pa.array(rows, pa.int64())
        for o, n in zip(old_keys, new_keys):
            ok &= equal_mask(o.take(ra), n.take(qa))
        return ok

    if old_h.unique:
        # one candidate per new row: a binary search in the sorted hashes, then the keys compared
        h_new = np.empty(new.num_rows, dtype=np.uint64)
        h_new[new_h.order] = new_h.sorted
        at = np.minimum(np.searchsorted(old_h.sorted, h_new), old_h.sorted.size - 1)
        hit = np.flatnonzero(old_h.sorted[at] == h_new)
        match = np.full(new.num_rows, -1, dtype=np.int64)
        rows = old_h.order[at[hit]]
        ok = same_key(hit, rows)
        match[hit[ok]] = rows[ok]
        return match
    # two old keys share a hash (vanishingly rare): a hash index that probes past collisions
    index = KeyIndex(capacity=2 * old.num_rows)
    h_old = np.empty(old.num_rows, dtype=np.uint64)
    h_old[old_h.order] = old_h.sorted
    index.insert(h_old, np.arange(old.num_rows, dtype=np.int64))
    h_new = np.empty(new.num_rows, dtype=np.uint64)
    h_new[new_h.order] = new_h.sorted
    return index.lookup(h_new, same_key)[0]


def _diff(old: pa.Table, old_h: Optional[KeyHashes], new: pa.Table, keys: Sequence[str]):
    """`diff_by_key`, also returning `new` with one row per key and its KeyHashes."""
    new_h = KeyHashes(new, keys)
    if not new_h.unique:
        new = last_per_key(new, keys, new_h)
        new_h = KeyHashes(new, keys)
    if old.num_rows == 0 or new.num_rows == 0:
        return old.select(list(keys)), new, new, new_h
    if old_h is None:
        old_h = KeyHashes(old, keys)
    match = _match(old, old_h, new, new_h, keys)
    found = match >= 0
    changed = ~found
    at = np.flatnonzero(found)
    if at.size:
        before = old.take(pa.array(match[at]))
        after = new.take(pa.array(at))
        differs = np.zeros(at.size, dtype=bool)
        for name in new.column_names:
            if name not in keys:
                differs |= ~equal_mask(before.column(name), after.column(name))
        changed[at[differs]] = True
    gone = np.ones(old.num_rows, dtype=bool)
    gone[match[found]] = False
    return old.filter(pa.array(gone)).select(list(keys)), new.filter(pa.array(changed)), new, new_h


def diff_by_key(old: pa.Table, new: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(keys to remove, rows to upsert) that turn `old` (one row per key) into `new` (the last row
    of each key counts): the keys of `old` missing from `new`, and the rows of `new` whose key is
    new or whose values differ (nulls equal nulls, NaN equals NaN). Bulk work only: the keys'
    hashes sorted, one binary search per row, the candidate keys and then the values of the
    matched rows compared column by column."""
    removed, upserts, _new, _h = _diff(old, None, new, keys)
    return removed, upserts


class _ReplaceState:
    """What a replace-mode table holds after the last batch queued into it (shared by every
    sink writing that table, so a sink made anew after a failure continues from it)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: Optional[pa.Table] = None
        self.hashes: Optional[KeyHashes] = None  # of `rows`, kept for the next batch's diff


_replace_states: "weakref.WeakKeyDictionary[KeyedTable, _ReplaceState]" = weakref.WeakKeyDictionary()


def _replace_state(table: KeyedTable) -> _ReplaceState:
    with _create_lock:
        s = _replace_states.get(table)
        if s is None:
            s = _replace_states[table] = _ReplaceState()
        return s


# ------------------------------------------------------------------------------------------------
# the sink
# ------------------------------------------------------------------------------------------------

def _graph_of(target) -> UpdateGraph:
    if isinstance(target, UpdateGraph):
        return target
    graph = getattr(target, "graph", None)
    if isinstance(graph, UpdateGraph):
        return graph
    raise TypeError(f"expected an UpdateGraph or a TickwireServer, got {type(target).__name__}")


class TickwireSink:
    """A `foreachBatch` function writing each micro-batch into one tickwire table; see the module
    documentation. `write(arrow_table, batch_id, scope)` is the same without Spark."""

    def __init__(self, target, table: str, mode: str = "append", keys: Optional[Sequence[str]] = None,
                 delete_column: Optional[str] = None, max_rows: Optional[int] = None, *, wait: bool = True,
                 wait_timeout: float = 60.0, scope: Optional[str] = None):
        if mode not in MODES:
            raise ValueError(f"tickwire sink into table {table!r}: mode must be one of {MODES}, got {mode!r}")
        keys = [keys] if isinstance(keys, str) else (list(keys) if keys is not None else None)
        if mode in ("upsert", "replace") and not keys:
            raise ValueError(f"tickwire sink into table {table!r}: mode {mode!r} needs keys=[...]")
        if mode in ("append", "blink") and keys:
            raise ValueError(f"tickwire sink into table {table!r}: mode {mode!r} takes no keys")
        if delete_column is not None and mode != "upsert":
            raise ValueError(f"tickwire sink into table {table!r}: delete_column applies to mode 'upsert' only")
        if delete_column is not None and delete_column in keys:
            raise ValueError(f"tickwire sink into table {table!r}: delete_column {delete_column!r} is a key")
        if max_rows is not None and mode != "append":
            raise ValueError(f"tickwire sink into table {table!r}: max_rows applies to mode 'append' only")
        if max_rows is not None and int(max_rows) <= 0:
            raise ValueError(f"tickwire sink into table {table!r}: max_rows must be positive, got {max_rows}")
        self.graph = _graph_of(target)
        self.name = table
        self.mode = mode
        self.keys = keys
        self.delete_column = delete_column
        self.max_rows = None if max_rows is None else int(max_rows)
        self.wait = wait
        self.wait_timeout = float(wait_timeout)
        self.scope = scope
        self._own_scope = f"sink-{uuid.uuid4().hex}"  # when the query id is unknown
        self._lock = threading.Lock()
        self._table = None
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
            self._table = engine_of(self.graph).resolve(self.name)
        return self._table

    # -- Spark -----------------------------------------------------------------------------------
    def __call__(self, batch_df, batch_id) -> None:
        _write_spark_batch((self,), batch_df, batch_id)

    def _key(self, batch_id, scope: Optional[str]) -> tuple:
        """The id a batch is applied under: ("spark", scope, batch id)."""
        return ("spark", scope or self.scope or self._own_scope, int(batch_id))

    def _is_replay(self, key) -> bool:
        table = self.table
        if table is not None and table.has_batch(key):
            self._note(key, None, accepted=False, timing={})
            log.info("table %r: Spark batch %s of query %s was already applied; ignored", self.name, key[2], key[1])
            return True
        return False

    def _schema_for(self, spark_schema) -> pa.Schema:
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
        key = self._key(batch_id, scope)
        if self._is_replay(key):
            return False
        schema = self._schema
        if schema is None:
            schema = pa.schema([f for f in data.schema if f.name != self.delete_column])
            self._ensure_table(schema)
        t0 = time.perf_counter()
        timing: dict = {}
        put = self._prepare(data, key, schema, timing)
        (accepted,) = _queue_all([(self, put, timing)])
        timing["write_s"] = time.perf_counter() - t0
        self._note(key, timing.get("rows"), accepted, timing)
        return accepted

    def _prepare(self, data: Optional[pa.Table], key, schema: pa.Schema, timing: dict):
        """Conforms the batch and builds its operations; returns `put()`, which queues them under
        the batch id and returns False for a batch id the table already has."""
        t0 = time.perf_counter()
        extra = None
        if self.delete_column is not None:
            extra = pa.schema([pa.field(self.delete_column, pa.bool_())])
        data = conform_arrow(data, schema, self.name, extra)
        timing["rows"] = data.num_rows
        table = self._table
        if self.mode == "replace":
            put = self._prepare_replace(table, data, key, timing)
        elif self.mode == "upsert" and self.delete_column is not None:
            latest = last_per_key(data, self.keys)
            flag = pa.array(pc.fill_null(latest.column(self.delete_column), False).to_numpy(zero_copy_only=False))
            ops = [("delete", latest.filter(flag).select(self.keys)),
                   ("add", latest.filter(pc.invert(flag)).drop_columns([self.delete_column]))]

            def put():
                return table.apply_ops(ops, batch_id=key)
        else:
            def put():
                return table.add(data, batch_id=key)
        timing["prepare_s"] = time.perf_counter() - t0
        return put

    def _prepare_replace(self, table: KeyedTable, data: pa.Table, key, timing: dict):
        state = _replace_state(table)
        result = {}

        def diff(base: Optional[pa.Table], base_hashes: Optional[KeyHashes]) -> list:
            # a table that existed before any replace-mode sink wrote it: start from its contents
            current = base if base is not None else table.to_arrow()
            removed, upserts, new, new_h = _diff(current, base_hashes, data, self.keys)
            result["rows"], result["hashes"] = new, new_h
            timing["removed"], timing["upserted"] = removed.num_rows, upserts.num_rows
            return [("delete", removed), ("add", upserts)]

        base = state.rows
        ops = diff(base, state.hashes)

        def put() -> bool:
            nonlocal ops
            with state.lock:
                if table.has_batch(key):
                    return False
                if state.rows is not base:  # another batch got in first: diff again
                    ops = diff(state.rows, state.hashes)
                accepted = table.apply_ops(ops, batch_id=key)
                if accepted:
                    state.rows, state.hashes = result["rows"], result["hashes"]
                return accepted

        return put

    def _note(self, key, rows: Optional[int], accepted: bool, timing: dict) -> None:
        with self._lock:
            if accepted:
                self.batches += 1
                self.rows += rows or 0
            else:
                self.replays += 1
            self.last = {"batch_id": key[2], "scope": key[1], "replay": not accepted, **timing}

    # -- the table -------------------------------------------------------------------------------
    def _ensure_table(self, schema: pa.Schema) -> None:
        with _create_lock:
            table = engine_of(self.graph).resolve(self.name, hidden=True)
            if table is None:
                table = self._create(schema)
            else:
                self._check_existing(table, schema)
            self._table = table

    def _create(self, schema: pa.Schema):
        g, name = self.graph, self.name
        if self.keys:
            missing = [k for k in self.keys if k not in schema.names]
            if missing:
                raise SparkSinkError(f"tickwire sink into table {name!r}: key column {missing[0]!r} is not in the "
                                     f"batch (columns: {', '.join(schema.names)})")
        if self.mode == "append":
            spec = TableSpec(name, "append", schema) if self.max_rows is None else \
                TableSpec(name, "ring", schema, capacity=self.max_rows)
        elif self.mode == "blink":
            spec = TableSpec(name, "blink", schema)
        else:
            spec = TableSpec(name, "keyed", schema, keys=tuple(self.keys))
        try:
            table, _created = engine_of(g).get_or_create(spec)
        except CatalogError as exc:
            raise SparkSinkError(f"tickwire sink into table {name!r}: {exc}") from None
        return table

    def _check_existing(self, table, schema: pa.Schema) -> None:
        name = self.name
        if self.mode == "append":
            want = AppendOnlyTable if self.max_rows is None else RingTable
        elif self.mode == "blink":
            want = BlinkTable
        else:
            want = KeyedTable
        if not isinstance(table, want):
            raise SparkSinkError(f"tickwire sink into table {name!r}: mode {self.mode!r} needs a {want.__name__}, "
                                 f"but the table is a {type(table).__name__}")
        if want is RingTable and table.capacity != self.max_rows:
            raise SparkSinkError(f"tickwire sink into table {name!r}: the ring table keeps {table.capacity} rows, "
                                 f"not max_rows={self.max_rows}")
        if want is KeyedTable and list(table.keys) != list(self.keys):
            raise SparkSinkError(f"tickwire sink into table {name!r}: the table's keys are {table.keys}, "
                                 f"not {self.keys}")
        have = table.schema
        for f in schema:
            if f.name not in have.names:
                raise SparkSinkError(f"tickwire sink into table {name!r}: column {f.name!r} ({f.type}) of the "
                                     f"batch is not in the table (columns: {', '.join(have.names)})")
            if have.field(f.name).type != f.type:
                raise SparkSinkError(f"tickwire sink into table {name!r}: column {f.name!r} is {f.type} in the "
                                     f"batch but {have.field(f.name).type} in the table; the schema of a sink's "
                                     f"table cannot change")
        missing = [n for n in have.names if n not in schema.names]
        if missing:
            raise SparkSinkError(f"tickwire sink into table {name!r}: the batch has no column {missing[0]!r} "
                                 f"({have.field(missing[0]).type}), which the table has")


def _queue_all(items) -> list[bool]:
    """Runs each `(sink, put, timing)`'s put. Sinks that wait and whose graph's cycle thread runs
    queue them as the engine's writes of one cycle, then wait once for that cycle to finish."""
    results = [False] * len(items)
    by_graph: dict[int, list[int]] = {}
    for i, (s, _put, _timing) in enumerate(items):
        by_graph.setdefault(id(s.graph), []).append(i)
    for idx in by_graph.values():
        graph = items[idx[0]][0].graph
        waiting = [i for i in idx if items[i][0].wait] if graph.running else []
        if not waiting:
            for i in idx:
                results[i] = bool(items[i][1]())
                items[i][2]["queued_at"] = time.perf_counter()
            continue
        timeout = max(items[i][0].wait_timeout for i in waiting)
        queued = None
        try:
            # no cycle starts inside: the next one takes every batch, and leaving waits for it
            with engine_of(graph).writes(timeout=timeout) as writes:
                for i in idx:
                    results[i] = bool(writes.run(items[i][1]))
                queued = time.perf_counter()
        except IngestError:
            log.warning("tables %s: the update graph did not apply a Spark batch within %.0f s",
                        [items[i][0].name for i in waiting], timeout)
        applied = time.perf_counter()
        for i in idx:
            items[i][2]["queued_at"] = queued
            if i in waiting:
                items[i][2]["applied_at"] = applied
        for i in waiting:  # a table whose storage refused the cycle's input did not apply the batch
            sink = items[i][0]
            refusal = getattr(sink._table, "refusal", None)
            if refusal is not None and results[i]:
                raise SparkSinkError(f"tickwire sink into table {sink.name!r}: the batch was not applied: {refusal}")
    return results


def _query_id(batch_df) -> Optional[str]:
    """The streaming query's id (kept in its checkpoint): Spark sets it as a local property of the
    thread that runs the batch."""
    try:
        return batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # not classic PySpark: each sink falls back to its own scope
        return None


def _write_spark_batch(sinks: Sequence[TickwireSink], batch_df, batch_id) -> None:
    """One micro-batch into every sink that does not have it yet, collected from Spark once."""
    t0 = time.perf_counter()
    query = _query_id(batch_df)
    # a sink's own `scope` (when given) wins over the query's id
    todo = [(s, s._key(batch_id, s.scope or query)) for s in sinks]
    todo = [(s, key) for s, key in todo if not s._is_replay(key)]
    if not todo:
        return
    schemas = [s._schema_for(batch_df.schema) for s, _ in todo]
    data = collect_arrow(batch_df)
    convert = time.perf_counter() - t0
    items = []
    for (s, key), schema in zip(todo, schemas):
        timing = {"convert_s": convert}
        items.append((s, s._prepare(data, key, schema, timing), timing))
    results = _queue_all(items)
    for (s, key), (_s, _put, timing), accepted in zip(todo, items, results):
        timing["write_s"] = time.perf_counter() - t0 - convert
        s._note(key, timing.get("rows"), accepted, timing)


def fan_out(*sinks: TickwireSink):
    """A `foreachBatch` function writing each micro-batch into several tables (e.g. the same rows
    appended to one table, into a ring table and into a blink table), collecting it from Spark
    once. Each table applies each batch exactly once on its own; sinks that wait are queued
    together, so the batch reaches every table of a graph in the same cycle."""
    if not sinks or not all(isinstance(s, TickwireSink) for s in sinks):
        raise TypeError("fan_out takes one or more TickwireSink (from sink(...))")

    def write(batch_df, batch_id) -> None:
        _write_spark_batch(sinks, batch_df, batch_id)

    write.sinks = sinks
    return write


def sink(target, table: str, mode: str = "append", keys: Optional[Sequence[str]] = None,
         delete_column: Optional[str] = None, max_rows: Optional[int] = None, **options) -> TickwireSink:
    """A `foreachBatch` function `(batch_df, batch_id) -> None` writing each micro-batch of a
    Spark streaming query into table `table` of `target` (an UpdateGraph or a TickwireServer).
    Options: `wait` (default True), `wait_timeout` (seconds, default 60), `scope` (the batch-id
    scope; default the query's id)."""
    return TickwireSink(target, table, mode=mode, keys=keys, delete_column=delete_column, max_rows=max_rows,
                        **options)
