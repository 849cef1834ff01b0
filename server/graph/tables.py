"""Tables of the update graph: static tables and the four kinds of source table.

Producers call `add(...)` (and `delete(...)` on keyed tables) from any thread; the input is checked
against the table's schema right away and queued; the graph applies it at the start of its next
cycle and emits one `TableUpdate` per table per cycle. A batch id that was already accepted is
ignored, so a replayed Spark micro-batch is applied once.

Row keys:
- append-only: 0, 1, 2, ... (one range forever);
- ring: keys keep growing; the last `capacity` keys are live, older ones are removed;
- keyed: a new key gets the next row key, kept for the key's whole life;
- blink: each cycle's rows are [0, N) and the previous cycle's rows are removed.
"""
from __future__ import annotations

import logging
import threading
from itertools import repeat
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.graph.columns import ColumnStore
from tickwire.server.graph.rowset import RowSet
from tickwire.server.graph.update import TableUpdate

if TYPE_CHECKING:
    from tickwire.server.graph.graph import UpdateGraph

__all__ = [
    "SchemaMismatchError",
    "Table",
    "StaticTable",
    "AppendOnlyTable",
    "KeyedTable",
    "BlinkTable",
    "RingTable",
]

log = logging.getLogger("tickwire.graph")

Listener = Callable[["Table", TableUpdate, int], None]


class SchemaMismatchError(ValueError):
    """Input whose schema does not match the table's. Names the table, the column and both types."""


def _as_table(data) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], pa.RecordBatch):
        return pa.Table.from_batches(list(data))
    raise TypeError(f"expected a pyarrow Table or RecordBatch, got {type(data).__name__}")


def conform(table_name: str, schema: pa.Schema, data, names: Optional[Sequence[str]] = None) -> pa.Table:
    """Checks `data` against `schema` (or the subset `names`) and returns it in schema column order."""
    t = _as_table(data)
    want = list(names) if names is not None else schema.names
    have = set(t.column_names)
    missing = [n for n in want if n not in have]
    if missing:
        raise SchemaMismatchError(f"table {table_name!r}: input is missing column {missing[0]!r} "
                                  f"({schema.field(missing[0]).type})")
    extra = [n for n in t.column_names if n not in set(want)]
    if extra:
        raise SchemaMismatchError(f"table {table_name!r}: input has column {extra[0]!r} "
                                  f"({t.schema.field(extra[0]).type}) that the table does not have")
    for n in want:
        got, expected = t.schema.field(n).type, schema.field(n).type
        if got != expected:
            raise SchemaMismatchError(f"table {table_name!r}: column {n!r} has type {got}, expected {expected}")
    if t.column_names != want:
        t = t.select(want)
    return t.combine_chunks()


class Table:
    """A table in the update graph: a row set, column data and listeners."""

    is_refreshing = True

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema):
        self.graph = graph
        self.name = name
        self.schema = schema
        self.rowset = RowSet()
        self.last_step = 0
        self.attributes: dict[str, object] = {}
        self.listeners: list[Listener] = []
        self.store = ColumnStore(schema)
        # one intake lock for the whole graph: a cycle takes every table's input at once, so inputs
        # that one thread adds to several tables in order become visible in that order
        self._pending_lock = graph._intake_lock
        self._seen_batches: set = set()
        self._prev: Optional[tuple[np.ndarray, pa.Table]] = None  # (sorted row keys, values) of this cycle's mods

    # -- reading ----------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.rowset)

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        return keys

    def gather(self, columns: Optional[Sequence[str]] = None, rowset=None) -> pa.Table:
        """Values of `rowset` (a RowSet or key array; default: all rows) in key order."""
        if rowset is None:
            rowset = self.rowset
        keys = rowset.keys() if isinstance(rowset, RowSet) else np.asarray(rowset, dtype=np.int64)
        return self.store.gather(self._slots(keys), columns)

    def to_arrow(self) -> pa.Table:
        with self.graph.shared_lock():
            return self.gather()

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys=None) -> pa.Table:
        """Inside a listener: the values the modified rows had before this cycle."""
        if self._prev is None:
            raise RuntimeError(f"table {self.name!r}: previous values are only available during its cycle")
        pkeys, values = self._prev
        want = pkeys if keys is None else np.asarray(keys, dtype=np.int64)
        idx = np.searchsorted(pkeys, want)
        if idx.size and (np.any(idx >= pkeys.size) or np.any(pkeys[np.minimum(idx, pkeys.size - 1)] != want)):
            raise KeyError(f"table {self.name!r}: previous values exist only for rows modified this cycle")
        t = values if columns is None else values.select(list(columns))
        return t.take(pa.array(idx))

    # -- listening ------------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        with self.graph.shared_lock():
            self.listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        with self.graph.shared_lock():
            if fn in self.listeners:
                self.listeners.remove(fn)

    # -- input bookkeeping ----------------------------------------------------------------------
    def _accept_batch_id(self, batch_id) -> bool:
        """Records a batch id; False if it was already accepted (the caller then drops the input)."""
        if batch_id is None:
            return True
        if batch_id in self._seen_batches:
            log.info("table %r: batch %r already applied; ignored", self.name, batch_id)
            return False
        self._seen_batches.add(batch_id)
        return True

    def has_batch(self, batch_id) -> bool:
        with self._pending_lock:
            return batch_id in self._seen_batches

    # -- cycle hooks (called by the graph under its lock) ---------------------------------------
    def _take_pending(self) -> list:
        """Called with the graph's intake lock held."""
        return []

    def _apply_pending(self, step: int, ops: list) -> Optional[TableUpdate]:
        return None

    def _end_cycle(self) -> None:
        self._prev = None


class StaticTable(Table):
    is_refreshing = False

    def __init__(self, graph: "UpdateGraph", name: str, data: pa.Table):
        data = _as_table(data).combine_chunks()
        super().__init__(graph, name, data.schema)
        n = data.num_rows
        self.store.write(np.arange(n, dtype=np.int64), data)
        self.rowset = RowSet.range(0, n - 1)
        self.attributes = {"AddOnly": True, "AppendOnly": True}


class _QueuedTable(Table):
    def __init__(self, graph, name, schema):
        super().__init__(graph, name, schema)
        self._pending: list[tuple[str, pa.Table]] = []

    def add(self, data, batch_id=None) -> bool:
        """Queues rows for the next cycle. Returns False when `batch_id` was already applied."""
        t = conform(self.name, self.schema, data)
        with self._pending_lock:
            if not self._accept_batch_id(batch_id):
                return False
            self._pending.append(("add", t))
        self.graph.wake()
        return True

    def _take_pending(self) -> list[tuple[str, pa.Table]]:
        ops, self._pending = self._pending, []
        return ops

    def pending_rows(self) -> int:
        with self._pending_lock:
            return sum(t.num_rows for _, t in self._pending)


class AppendOnlyTable(_QueuedTable):
    def __init__(self, graph, name, schema):
        super().__init__(graph, name, schema)
        self.attributes = {"AddOnly": True, "AppendOnly": True}

    def _apply_pending(self, step, ops):
        if not ops:
            return None
        data = pa.concat_tables([t for _, t in ops])
        n = data.num_rows
        if n == 0:
            return None
        first = len(self.rowset)
        keys = np.arange(first, first + n, dtype=np.int64)
        self.store.write(keys, data)
        added = RowSet.range(first, first + n - 1)
        self.rowset = RowSet.range(0, first + n - 1)
        return TableUpdate(added=added)


class RingTable(_QueuedTable):
    """Keeps the last `capacity` rows; storage is a ring of `capacity` slots."""

    def __init__(self, graph, name, schema, capacity: int):
        if capacity <= 0:
            raise ValueError("ring capacity must be positive")
        super().__init__(graph, name, schema)
        self.capacity = int(capacity)
        self.store.ensure(self.capacity)
        self._next_key = 0
        self.attributes = {"RingTable": True}

    def _slots(self, keys):
        return keys % self.capacity

    def _apply_pending(self, step, ops):
        if not ops:
            return None
        data = pa.concat_tables([t for _, t in ops])
        n = data.num_rows
        if n == 0:
            return None
        start = self._next_key
        self._next_key += n
        if n > self.capacity:
            data = data.slice(n - self.capacity)
            start = self._next_key - self.capacity
        keys = np.arange(start, self._next_key, dtype=np.int64)
        self.store.write(self._slots(keys), data)
        added = RowSet.range(start, self._next_key - 1)
        live_first = max(0, self._next_key - self.capacity)
        removed = self.rowset.subset_by_key_range(0, live_first - 1)
        self.rowset = RowSet.range(live_first, self._next_key - 1)
        return TableUpdate(added=added, removed=removed)


class BlinkTable(_QueuedTable):
    """Each cycle's rows replace the previous cycle's rows entirely."""

    def __init__(self, graph, name, schema):
        super().__init__(graph, name, schema)
        self.attributes = {"BlinkTable": True, "AddOnly": True}

    def _apply_pending(self, step, ops):
        data = pa.concat_tables([t for _, t in ops]) if ops else None
        n = 0 if data is None else data.num_rows
        if n == 0 and self.rowset.is_empty():
            return None
        removed = self.rowset
        if n:
            self.store.write(np.arange(n, dtype=np.int64), data)
        self.rowset = RowSet.range(0, n - 1)
        return TableUpdate(added=self.rowset, removed=removed)


def _lookup(values: Iterable, count: int) -> np.ndarray:
    """Row keys from an iterator of ints or None (missing) as an int64 array with -1 for None."""
    arr = np.fromiter(values, dtype=object, count=count)
    missing = np.equal(arr, None)
    arr[missing] = -1
    return arr.astype(np.int64)


def _key_tuples(t: pa.Table, keys: Sequence[str]) -> list:
    """The key of each row as a hashable Python value (a tuple for several key columns)."""
    cols = [t.column(k).to_pylist() for k in keys]
    return cols[0] if len(cols) == 1 else list(zip(*cols))


def _changed(old: pa.Array, new: pa.Array) -> bool:
    """True if any slot differs (nulls equal each other)."""
    if len(old) == 0:
        return False
    if pa.types.is_list(old.type) or pa.types.is_struct(old.type):
        return old.to_pylist() != new.to_pylist()
    eq = pc.equal(old, new)
    both_null = pc.and_(old.is_null(), new.is_null())
    same = pc.or_kleene(eq, both_null)
    return not pc.all(pc.fill_null(same, False)).as_py()


class KeyedTable(_QueuedTable):
    """Upsert and delete by one or more key columns."""

    def __init__(self, graph, name, schema, keys: Sequence[str]):
        super().__init__(graph, name, schema)
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys:
            raise ValueError("a keyed table needs at least one key column")
        for k in keys:
            if k not in schema.names:
                raise ValueError(f"table {name!r}: key column {k!r} is not in the schema")
        self.keys = keys
        self._index: dict = {}
        self._next_key = 0
        self._value_columns = [n for n in schema.names if n not in keys]

    def delete(self, keys_data, batch_id=None) -> bool:
        """Queues removal of the rows whose keys are in `keys_data` (a table of the key columns)."""
        t = conform(self.name, self.schema, _as_table(keys_data).select(self.keys), names=self.keys)
        with self._pending_lock:
            if not self._accept_batch_id(batch_id):
                return False
            self._pending.append(("delete", t))
        self.graph.wake()
        return True

    def apply_ops(self, ops) -> None:
        """Queues a mix of ("add", table) and ("delete", keys) operations under one batch id check."""
        with self._pending_lock:
            self._pending.extend(ops)
        self.graph.wake()

    def row_keys_for(self, key_values: list) -> np.ndarray:
        """Row key of each key value (-1 where the key is not in the table)."""
        return _lookup(map(self._index.get, key_values), len(key_values))

    def _apply_pending(self, step, ops):
        if not ops:
            return None
        prev = self.rowset
        added_keys: list[np.ndarray] = []
        removed_keys: list[np.ndarray] = []
        modified_keys: list[np.ndarray] = []
        modified_cols: set[str] = set()
        prev_keys: list[np.ndarray] = []
        prev_vals: list[pa.Table] = []
        saved = np.zeros(0, dtype=np.int64)
        start_next_key = self._next_key  # row keys below it that are still indexed existed before the cycle
        live = prev
        for kind, t in ops:
            if t.num_rows == 0:
                continue
            kv = _key_tuples(t, self.keys)
            if kind == "delete":
                rks = _lookup(map(self._index.pop, kv, repeat(None)), len(kv))
                rks = np.unique(rks[rks >= 0])
                if rks.size:
                    removed_keys.append(rks)
                    live = live.minus(RowSet.from_keys(rks))
                continue
            # last occurrence of each key within this batch wins
            last_pos = dict(zip(kv, range(len(kv))))
            if len(last_pos) != len(kv):
                t = t.take(pa.array(np.fromiter(last_pos.values(), dtype=np.int64, count=len(last_pos))))
                kv = list(last_pos.keys())
            found = _lookup(map(self._index.get, kv), len(kv))
            existing = found >= 0
            if existing.any():
                ex_rows = np.flatnonzero(existing)
                rks = found[ex_rows]
                new_vals = t.take(pa.array(ex_rows))
                old_vals = self.store.gather(rks)
                # rows that existed before the cycle are modifications; rows added earlier in this
                # cycle simply take the newer values
                pre = rks < start_next_key
                if pre.any():
                    pre_idx = pa.array(np.flatnonzero(pre))
                    old_pre, new_pre = old_vals.take(pre_idx), new_vals.take(pre_idx)
                    for name in self._value_columns:
                        if name not in modified_cols and _changed(old_pre.column(name).combine_chunks(),
                                                                  new_pre.column(name).combine_chunks()):
                            modified_cols.add(name)
                    modified_keys.append(rks[pre])
                # previous values, once per row per cycle
                first_touch = pre & ~np.isin(rks, saved)
                if first_touch.any():
                    prev_keys.append(rks[first_touch])
                    prev_vals.append(old_vals.take(pa.array(np.flatnonzero(first_touch))))
                    saved = np.concatenate((saved, rks[first_touch]))
                self.store.write(rks, new_vals)
            if not existing.all():
                new_rows = np.flatnonzero(~existing)
                n = new_rows.size
                rks = np.arange(self._next_key, self._next_key + n, dtype=np.int64)
                self._next_key += n
                new_kv = np.fromiter(kv, dtype=object, count=len(kv))[new_rows].tolist()
                self._index.update(zip(new_kv, rks.tolist()))
                self.store.write(rks, t.take(pa.array(new_rows)))
                added_keys.append(rks)
                live = live.union(RowSet.from_keys(rks))
        added = RowSet.from_keys(np.concatenate(added_keys)) if added_keys else RowSet()
        removed = RowSet.from_keys(np.concatenate(removed_keys)) if removed_keys else RowSet()
        # a row added and deleted within the cycle is neither; removed counts only pre-cycle rows
        removed_pre = removed.intersect(prev)
        added_live = added.minus(removed)
        modified = (RowSet.from_keys(np.concatenate(modified_keys)) if modified_keys else RowSet())
        modified = modified.intersect(prev).minus(removed)
        if modified.is_empty() or not modified_cols:
            modified, modified_cols = RowSet(), set()
        self.rowset = live
        if prev_keys:
            pk = np.concatenate(prev_keys)
            order = np.argsort(pk)
            self._prev = (pk[order], pa.concat_tables(prev_vals).take(pa.array(order)))
        update = TableUpdate(added=added_live, removed=removed_pre, modified=modified,
                             modified_columns=frozenset(modified_cols))
        return None if update.is_empty() else update
