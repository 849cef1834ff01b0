"""Writing a batch into a table by mode: the one implementation behind the in-process Spark sinks
(`tickwire.server.adapters.spark.sinks`) and the staged, committed writes of producers in other processes
(`tickwire.server.engine.staging`), so both make the same tables, check schemas with the same messages
and apply a batch the same way.

Modes:
- "append": rows are appended (an append-only table; a ring table of the last `max_rows` rows
  when `max_rows` is given).
- "upsert" (needs `keys`): rows replace the row with the same key or are added; with
  `delete_column` (a boolean column, not part of the table), rows where it is true delete their
  key instead. Within a batch the last row of a key wins.
- "replace" (needs `keys`): the batch is the whole new table. It is compared with the table's
  current contents by key, in bulk: only keys that appeared are added, keys that disappeared
  removed, and keys whose values changed modified (with only the changed columns marked);
  unchanged rows are not touched. The writer must be the table's only writer.
- "blink": each batch replaces the previous one entirely (a blink table).

The table is created from the first batch's schema unless it exists; an existing table must be
of the mode's kind, with the same keys and columns.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine import CatalogError, IngestError, TableSpec, engine_of
from tickwire.server.engine.graph import (
    AppendOnlyTable,
    BlinkTable,
    KeyedTable,
    KeyIndex,
    RingTable,
    UpdateGraph,
    equal_mask,
    hash_columns,
)

__all__ = ["MODES", "ModeError", "ModeWriter", "KeyHashes", "last_per_key", "diff_by_key"]

MODES = ("append", "upsert", "replace", "blink")

_create_lock = threading.Lock()


class ModeError(IngestError, ValueError):
    """A batch or a writer's options that a table cannot take (bad options, an unsupported or
    changed schema, a table of another kind); the message names the table and, where one is at
    fault, the column."""


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
# the writer
# ------------------------------------------------------------------------------------------------

class ModeWriter:
    """Writes batches into table `table` of `graph` in one of the `MODES` (see the module
    documentation). `ensure_table(schema)` makes or checks the table; `prepare(data, batch_id)`
    turns a batch (already in the table's types, plus the delete column in upsert mode) into
    `put()`, which queues it under `batch_id` and returns False for a batch id the table has."""

    def __init__(self, graph: UpdateGraph, table: str, mode: str = "append", keys: Optional[Sequence[str]] = None,
                 delete_column: Optional[str] = None, max_rows: Optional[int] = None):
        where = f"tickwire sink into table {table!r}"
        if mode not in MODES:
            raise ModeError(f"{where}: mode must be one of {MODES}, got {mode!r}")
        keys = [keys] if isinstance(keys, str) else (list(keys) if keys is not None else None)
        if mode in ("upsert", "replace") and not keys:
            raise ModeError(f"{where}: mode {mode!r} needs keys=[...]")
        if mode in ("append", "blink") and keys:
            raise ModeError(f"{where}: mode {mode!r} takes no keys")
        if delete_column is not None and mode != "upsert":
            raise ModeError(f"{where}: delete_column applies to mode 'upsert' only")
        if delete_column is not None and delete_column in keys:
            raise ModeError(f"{where}: delete_column {delete_column!r} is a key")
        if max_rows is not None and mode != "append":
            raise ModeError(f"{where}: max_rows applies to mode 'append' only")
        if max_rows is not None and int(max_rows) <= 0:
            raise ModeError(f"{where}: max_rows must be positive, got {max_rows}")
        self.graph = graph
        self.name = table
        self.mode = mode
        self.keys = keys
        self.delete_column = delete_column
        self.max_rows = None if max_rows is None else int(max_rows)
        self.where = where
        self.table = None

    @property
    def extra_schema(self) -> Optional[pa.Schema]:
        """The columns a batch carries beside the table's: the delete flag in upsert mode."""
        if self.delete_column is None:
            return None
        return pa.schema([pa.field(self.delete_column, pa.bool_())])

    def table_schema(self, batch_schema: pa.Schema) -> pa.Schema:
        """The table's columns of a batch's schema (without the delete column), which must be a
        boolean column when the writer has one."""
        if self.delete_column is not None:
            if self.delete_column not in batch_schema.names:
                raise ModeError(f"{self.where}: the batch has no delete column {self.delete_column!r}")
            t = batch_schema.field(self.delete_column).type
            if t != pa.bool_():
                raise ModeError(f"{self.where}: delete column {self.delete_column!r} must be boolean, not {t}")
        return pa.schema([f for f in batch_schema if f.name != self.delete_column])

    # -- the table -------------------------------------------------------------------------------
    def ensure_table(self, schema: pa.Schema):
        """The table, made from `schema` (the table's columns) unless it exists, in which case it
        must be of this writer's kind with these keys and columns."""
        with _create_lock:
            table = engine_of(self.graph).resolve(self.name, hidden=True)
            if table is None:
                table = self._create(schema)
            else:
                self.check_existing(table, schema)
            self.table = table
            return table

    def check(self, schema: pa.Schema) -> None:
        """What `ensure_table(schema)` would refuse, without making anything."""
        table = engine_of(self.graph).resolve(self.name, hidden=True)
        if table is not None:
            self.check_existing(table, schema)
        else:
            self._check_keys(schema)

    def _check_keys(self, schema: pa.Schema) -> None:
        missing = [k for k in (self.keys or ()) if k not in schema.names]
        if missing:
            raise ModeError(f"{self.where}: key column {missing[0]!r} is not in the batch (columns: "
                            f"{', '.join(schema.names)})")

    def _create(self, schema: pa.Schema):
        self._check_keys(schema)
        name = self.name
        if self.mode == "append":
            spec = TableSpec(name, "append", schema) if self.max_rows is None else \
                TableSpec(name, "ring", schema, capacity=self.max_rows)
        elif self.mode == "blink":
            spec = TableSpec(name, "blink", schema)
        else:
            spec = TableSpec(name, "keyed", schema, keys=tuple(self.keys))
        try:
            table, _created = engine_of(self.graph).get_or_create(spec)
        except CatalogError as exc:
            raise ModeError(f"{self.where}: {exc}") from None
        return table

    def check_existing(self, table, schema: pa.Schema) -> None:
        where = self.where
        if self.mode == "append":
            want = AppendOnlyTable if self.max_rows is None else RingTable
        elif self.mode == "blink":
            want = BlinkTable
        else:
            want = KeyedTable
        if not isinstance(table, want):
            raise ModeError(f"{where}: mode {self.mode!r} needs a {want.__name__}, but the table is a "
                            f"{type(table).__name__}", "FAILED_PRECONDITION")
        if want is RingTable and table.capacity != self.max_rows:
            raise ModeError(f"{where}: the ring table keeps {table.capacity} rows, not max_rows={self.max_rows}",
                            "FAILED_PRECONDITION")
        if want is KeyedTable and list(table.keys) != list(self.keys):
            raise ModeError(f"{where}: the table's keys are {table.keys}, not {self.keys}", "FAILED_PRECONDITION")
        have = table.schema
        for f in schema:
            if f.name not in have.names:
                raise ModeError(f"{where}: column {f.name!r} ({f.type}) of the batch is not in the table (columns: "
                                f"{', '.join(have.names)})", "FAILED_PRECONDITION")
            if have.field(f.name).type != f.type:
                raise ModeError(f"{where}: column {f.name!r} is {f.type} in the batch but {have.field(f.name).type} "
                                f"in the table; the schema of a sink's table cannot change", "FAILED_PRECONDITION")
        missing = [n for n in have.names if n not in schema.names]
        if missing:
            raise ModeError(f"{where}: the batch has no column {missing[0]!r} ({have.field(missing[0]).type}), "
                            f"which the table has", "FAILED_PRECONDITION")

    # -- batches ---------------------------------------------------------------------------------
    def prepare(self, data: pa.Table, batch_id, timing: Optional[dict] = None):
        """Builds a batch's operations (data: the table's columns in its types, then the delete
        column in upsert mode); returns `put()`, which queues them under `batch_id` and returns
        False for a batch id the table already has. `timing` gets "rows", "prepare_s" and, in
        replace mode, "removed" and "upserted"."""
        timing = {} if timing is None else timing
        t0 = time.perf_counter()
        timing["rows"] = data.num_rows
        table = self.table
        if table is None:
            raise ModeError(f"{self.where}: no table yet (ensure_table first)", "FAILED_PRECONDITION")
        if self.mode == "replace":
            put = self._prepare_replace(table, data, batch_id, timing)
        elif self.mode == "upsert" and self.delete_column is not None:
            latest = last_per_key(data, self.keys)
            flag = pa.array(pc.fill_null(latest.column(self.delete_column), False).to_numpy(zero_copy_only=False))
            ops = [("delete", latest.filter(flag).select(self.keys)),
                   ("add", latest.filter(pc.invert(flag)).drop_columns([self.delete_column]))]

            def put():
                return table.apply_ops(ops, batch_id=batch_id)
        else:
            def put():
                return table.add(data, batch_id=batch_id)
        timing["prepare_s"] = time.perf_counter() - t0
        return put

    def _prepare_replace(self, table: KeyedTable, data: pa.Table, batch_id, timing: dict):
        state = _replace_state(table)
        result = {}

        def diff(base: Optional[pa.Table], base_hashes: Optional[KeyHashes]) -> list:
            # a table that existed before any replace-mode writer wrote it: start from its contents
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
                if table.has_batch(batch_id):
                    return False
                if state.rows is not base:  # another batch got in first: diff again
                    ops = diff(state.rows, state.hashes)
                accepted = table.apply_ops(ops, batch_id=batch_id)
                if accepted:
                    state.rows, state.hashes = result["rows"], result["hashes"]
                return accepted

        return put
