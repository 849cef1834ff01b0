"""Source tables: append-only, keyed (upsert and delete by key), blink and ring.

Producers write with `Engine.write` (the engine's one write path) from any thread, which queues
the input here (`queue_rows`, and `queue_delete` / `queue_ops` on keyed tables: engine-internal
calls). The input is checked against the table's schema at once (a mismatch raises
SchemaMismatchError and queues nothing) and queued; the graph applies it at the start of its next
cycle and emits one `TableUpdate` per table per cycle. An input whose `batch_id` the table has
already accepted is ignored (the queue call returns False), so a replayed Spark micro-batch is
applied exactly once; numbered batch ids (`(scope, n)`, as Spark sinks use) are remembered in
bounded memory (see `batchids`).

Row keys:
- append-only: 0, 1, 2, ... (one range forever);
- ring: keys keep growing; the last `capacity` keys are live and older ones are removed; key k is
  stored in slot k mod capacity;
- keyed: a new key gets the next row key (it is appended at the end) and keeps it for the life of
  the key; a deleted key that comes back is a new row with a new row key. Row keys (and the slots
  of their values) of deleted rows are reused once many are free (`_REUSE_MIN`, or an eighth of
  the live rows): from then on new keys take the lowest freed ones, so a table that churns keys
  holds memory for its live rows, not for every key it has seen. A key freed in one cycle is
  reused at the earliest in the next, after the update that removed it went out;
- blink: each cycle's rows are [0, N) and the previous cycle's rows [0, M) are removed.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Hashable, Iterable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError, WriteRefused
from tickwire.server.engine.graph.arrays import has_duplicates
from tickwire.server.engine.graph.batchids import BatchIds
from tickwire.server.engine.graph.column_store import (
    ColumnStore,
    check_hashable,
    equal_mask,
    hash_columns,
    key_verifier,
)
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Table, TableInput, as_table, conform

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["SourceTable", "AppendOnlyTable", "KeyedTable", "BlinkTable", "RingTable", "UpdateSourceTable",
           "WriteRefused"]

log = logging.getLogger(__name__)

_EMPTY = np.zeros(0, dtype=np.int64)

#: queued input: ("add", rows), ("restate", rows) (an add whose rewrites are all modifications) or
#: ("delete", key values)
_Input = tuple[str, pa.Table]

#: freed row keys a keyed table holds before new keys take them (or an eighth of its live rows)
_REUSE_MIN = 1024


class SourceTable(Table):
    """A table fed from outside the graph; input is queued and applied at the next cycle.

    `journaled`: the graph's input journal (UpdateGraph.set_input_journal) records this table's
    input, with the batch ids it carries, before each cycle applies it. `refusal`, when set, is
    the reason every write is refused."""

    store: ColumnStore

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema):
        super().__init__(graph, name, schema)
        self._pending: list[_Input] = []
        self._pending_batches: list[Hashable] = []
        self.taken_batches: list[Hashable] = []  # the batch ids of the input the current cycle took
        self.journaled = False
        self.refusal: Optional[str] = None
        self._seen_batches = BatchIds()
        # the graph's intake lock: a cycle takes every table's input at once, so inputs that one
        # thread adds to several tables in order become visible in the same cycle or in order
        self._pending_lock = graph.intake_lock

    def queue_rows(self, data: TableInput, batch_id: Optional[Hashable] = None) -> bool:
        """Queues rows (a RecordBatch, Table or list of RecordBatches) for the next cycle.
        Returns False, queuing nothing, when `batch_id` was already accepted. Engine-internal:
        producers call `Engine.write`."""
        return self._queue([("add", conform(self.name, self.schema, data))], batch_id)

    def _queue(self, ops: list[_Input], batch_id: Optional[Hashable]) -> bool:
        with self._pending_lock:
            if self.refusal is not None:
                raise WriteRefused(f"table {self.name!r} takes no writes: {self.refusal}")
            if batch_id is not None:
                if batch_id in self._seen_batches:
                    log.info("table %r: batch %r was already applied; ignored", self.name, batch_id)
                    return False
                self._seen_batches.add(batch_id)
                self._pending_batches.append(batch_id)
            self._pending.extend(op for op in ops if op[1].num_rows)
        return True

    def forget_batches(self, batch_ids: Iterable[Hashable]) -> None:
        """Input taken but not applied (its journal could not record it): its batch ids may come again."""
        with self._pending_lock:
            for b in batch_ids:
                self._seen_batches.discard(b)

    def batch_memory(self) -> BatchIds:
        return self._seen_batches

    def applied_batch_state(self) -> dict[str, Any]:
        """The batch-id memory as of the last applied cycle (BatchIds.state()): without the ids of
        input still queued or taken by the running cycle, which a checkpoint must not claim."""
        with self._pending_lock:
            memory = BatchIds.from_state(self._seen_batches.state(), self._seen_batches.keep)
            for b in (*self._pending_batches, *self.taken_batches):
                memory.discard(b)
        return memory.state()

    def restore_batches(self, state: dict[str, Any]) -> None:
        """Puts back a checkpoint's batch-id memory (BatchIds.state())."""
        with self._pending_lock:
            self._seen_batches = BatchIds.from_state(state, self._seen_batches.keep)

    def restore(self, row_keys: np.ndarray, data: pa.Table, next_key: int) -> None:
        """Puts back a checkpoint's rows with their row keys (into a table without any of the rows
        a checkpoint keeps, under the graph's lock, before anyone reads it); `next_key` is the next
        new row's key."""
        if len(self.checkpoint_rows()) or self._pending:
            raise ValueError(f"table {self.name!r}: restore needs an empty table")
        row_keys = np.asarray(row_keys, dtype=np.int64)
        if row_keys.size != data.num_rows:
            raise ValueError(f"table {self.name!r}: {row_keys.size} row keys for {data.num_rows} rows")
        self._restore(row_keys, conform(self.name, self.schema, data), int(next_key))
        self.prev_rowset = self.rowset

    def _restore(self, row_keys: np.ndarray, data: pa.Table, next_key: int) -> None:
        raise ValueError(f"table {self.name!r} ({type(self).__name__}) has no checkpoints")

    @property
    def next_key(self) -> int:
        """The row key the next new row gets."""
        return len(self.rowset)

    #: the rows of `checkpoint_rows()` keep their values while the table lives (an append table's
    #: rows are never changed or removed): a checkpoint reads them after the boundary, a slice at a
    #: time, instead of copying the table at it
    checkpoint_rows_stay = False

    def checkpoint_rows(self) -> RowSet:
        """The rows a checkpoint of this table keeps (all; a history table's intraday rows only)."""
        return self.rowset

    def has_batch(self, batch_id: Hashable) -> bool:
        """True when input with this batch id was accepted."""
        with self._pending_lock:
            return batch_id in self._seen_batches

    def pending_rows(self) -> int:
        with self._pending_lock:
            return sum(t.num_rows for _, t in self._pending)

    def take_pending(self) -> list[_Input]:
        ops, self._pending = self._pending, []
        self.taken_batches, self._pending_batches = self._pending_batches, []
        return ops


def _merge_runs(ops: list[_Input]) -> list[_Input]:
    """Consecutive operations of the same kind as one: many small inputs queued between two
    cycles cost what their rows cost, not a pass each (an upsert keeps the last row of a key)."""
    out: list[tuple[str, list[pa.Table]]] = []
    for kind, t in ops:
        if out and out[-1][0] == kind:
            out[-1][1].append(t)
        else:
            out.append((kind, [t]))
    return [(kind, ts[0] if len(ts) == 1 else pa.concat_tables(ts)) for kind, ts in out]


def _concat(ops: Sequence[_Input]) -> Optional[pa.Table]:
    tables = [t for _, t in ops]
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


class AppendOnlyTable(SourceTable):
    """Rows are only ever appended; the row set is always [0, n)."""

    checkpoint_rows_stay = True

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema):
        super().__init__(graph, name, schema)
        self.attributes = {"AddOnly": True, "AppendOnly": True}

    def apply_pending(self, step: int, ops: list[_Input]) -> Optional[TableUpdate]:
        data = _concat(ops)
        if data is None or data.num_rows == 0:
            return None
        n = data.num_rows
        first = len(self.rowset)
        self.store.ensure_appending(first + n, first)  # rows below `first` never change again
        self.store.write(np.arange(first, first + n, dtype=np.int64), data)
        self.prev_rowset = self.rowset
        self.rowset = RowSet.range(0, first + n - 1)
        return TableUpdate(added=RowSet.range(first, first + n - 1))

    def _restore(self, row_keys: np.ndarray, data: pa.Table, next_key: int) -> None:
        n = data.num_rows
        if n and not np.array_equal(row_keys, np.arange(n, dtype=np.int64)):
            raise ValueError(f"table {self.name!r}: an append table's row keys are 0..n-1")
        if n:
            self.store.ensure(n)
            self.store.write(row_keys, data)
        self.rowset = RowSet.range(0, n - 1)


class RingTable(SourceTable):
    """Keeps the last `capacity` rows; row keys keep growing, storage is `capacity` slots."""

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema, capacity: int):
        if int(capacity) <= 0:
            raise OperationError(f"table {name!r}: ring capacity must be positive, got {capacity}")
        super().__init__(graph, name, schema)
        self.capacity = int(capacity)
        self.store.ensure(self.capacity)
        self._next_key = 0

    def slots(self, keys: np.ndarray) -> np.ndarray:
        slots: np.ndarray = keys % self.capacity
        return slots

    def apply_pending(self, step: int, ops: list[_Input]) -> Optional[TableUpdate]:
        data = _concat(ops)
        if data is None or data.num_rows == 0:
            return None
        n = data.num_rows
        end = self._next_key + n  # one past the last new key
        start = self._next_key
        if n > self.capacity:  # rows pushed out within this cycle are never seen
            data = data.slice(n - self.capacity)
            start = end - self.capacity
        self.store.write(self.slots(np.arange(start, end, dtype=np.int64)), data)
        self._next_key = end
        live_first = max(0, end - self.capacity)
        removed = self.rowset.subset_by_key_range(0, live_first - 1)
        self.prev_rowset = self.rowset
        self.rowset = RowSet.range(live_first, end - 1)
        return TableUpdate(added=RowSet.range(start, end - 1), removed=removed)

    @property
    def next_key(self) -> int:
        return self._next_key

    def _restore(self, row_keys: np.ndarray, data: pa.Table, next_key: int) -> None:
        n = data.num_rows
        first = next_key - n
        if n > self.capacity or first < 0 or (n and not np.array_equal(
                row_keys, np.arange(first, next_key, dtype=np.int64))):
            raise ValueError(f"table {self.name!r}: a ring table's rows are its last keys, at most its capacity")
        if n:
            self.store.write(self.slots(row_keys), data)
        self._next_key = next_key
        self.rowset = RowSet.range(first, next_key - 1)


class BlinkTable(SourceTable):
    """Each cycle's rows replace the previous cycle's rows entirely."""

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema):
        super().__init__(graph, name, schema)
        self.attributes = {"BlinkTable": True}

    def apply_pending(self, step: int, ops: list[_Input]) -> Optional[TableUpdate]:
        data = _concat(ops)
        n = 0 if data is None else data.num_rows
        if n == 0 and self.rowset.is_empty():
            return None
        if n:
            self.store.ensure(n)
            self.store.write(np.arange(n, dtype=np.int64), data)
        self.prev_rowset = self.rowset
        self.rowset = RowSet.range(0, n - 1)
        return TableUpdate(added=self.rowset, removed=self.prev_rowset)


class KeyedTable(SourceTable):
    """Upsert and delete by one or more key columns.

    A row whose key is new is added (at the end); a row whose key exists replaces that row's
    values in place, and is reported as modified only if some value changed, with only the
    changed columns in the modified-column set; a delete removes the key's row. Within one input
    the last row of each key wins. Keys are found through a numpy hash index (`KeyIndex`), so a
    cycle costs what its input costs, whatever the size of the table.
    """

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema, keys: Union[str, Sequence[str]]):
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys:
            raise OperationError(f"table {name!r}: a keyed table needs at least one key column")
        for k in keys:
            if k not in schema.names:
                raise OperationError(f"table {name!r}: key column {k!r} is not in the schema")
            if not check_hashable(schema.field(k).type):
                raise OperationError(f"table {name!r}: key column {k!r} has type {schema.field(k).type}, which "
                                 f"cannot be a key (use numbers, booleans, temporal types, strings or binaries)")
        super().__init__(graph, name, schema)
        self.keys = keys
        self.value_columns = [n for n in schema.names if n not in keys]
        self._index = KeyIndex()
        self._next_key = 0
        self._free = _EMPTY            # freed row keys, ascending; new keys take them from `_head` on
        self._head = 0
        self._spare: list[np.ndarray] = []  # freed since `_free` was sorted (merged when keys are taken)
        self._dying: list[np.ndarray] = []  # removed this cycle: free from the next one
        self.reused_keys = 0  # row keys taken again by new keys, in all
        kt = schema.field(keys[0]).type
        self._injective = len(keys) == 1 and (pa.types.is_integer(kt) or pa.types.is_boolean(kt) or (
            pa.types.is_temporal(kt) and kt.bit_width <= 64))
        self._null_keys = False  # a null key was ever stored (its hash is not a bijection)

    # -- input ----------------------------------------------------------------------------------
    def queue_delete(self, keys_data: TableInput, batch_id: Optional[Hashable] = None) -> bool:
        """Queues removal of the rows whose keys appear in `keys_data` (its other columns are ignored)."""
        return self._queue([("delete", self._key_input(keys_data))], batch_id)

    def queue_ops(self, ops: Iterable[tuple[str, TableInput]], batch_id: Optional[Hashable] = None) -> bool:
        """Queues ("add", rows) and ("delete", keys) operations in order, under one batch id;
        ("restate", rows) is an add whose rows of keys already there are all modifications (see
        `Engine.write`)."""
        checked: list[_Input] = []
        for kind, data in ops:
            if kind in ("add", "upsert", "restate"):
                checked.append(("restate" if kind == "restate" else "add", conform(self.name, self.schema, data)))
            elif kind == "delete":
                checked.append(("delete", self._key_input(data)))
            else:
                raise OperationError(f"table {self.name!r}: unknown operation {kind!r} (use 'add' or 'delete')")
        return self._queue(checked, batch_id)

    def _key_input(self, data: TableInput) -> pa.Table:
        t = as_table(data)
        return conform(self.name, self.schema, t.select([k for k in self.keys if k in t.column_names]), self.keys)

    def row_keys_for(self, keys_data: TableInput) -> np.ndarray:
        """Row key of each row's key in `keys_data` (-1 where the key is not in the table)."""
        t = self._key_input(keys_data)
        with self.graph.lock:
            return self._find(t, hash_columns([t.column(k) for k in self.keys]))[0]

    @property
    def next_key(self) -> int:
        return self._next_key

    def _restore(self, row_keys: np.ndarray, data: pa.Table, next_key: int) -> None:
        h = _EMPTY.astype(np.uint64)
        if row_keys.size:
            increasing = bool(np.all(row_keys[1:] > row_keys[:-1]))  # a checkpoint writes them in order
            if row_keys[0 if increasing else row_keys.argmin()] < 0 or row_keys.max() >= next_key \
                    or (not increasing and has_duplicates(row_keys)):
                raise ValueError(f"table {self.name!r}: checkpoint row keys must be distinct and below {next_key}")
            h = hash_columns([data.column(k) for k in self.keys])
            if has_duplicates(h) and data.select(self.keys).group_by(self.keys).aggregate([]).num_rows != data.num_rows:
                raise ValueError(f"table {self.name!r}: a key appears twice in the checkpoint")
            if not increasing:
                order = np.argsort(row_keys)
                row_keys, data, h = row_keys[order], data.take(pa.array(order)), h[order]
        if next_key > 2 * row_keys.size + _REUSE_MIN:
            # a sparse key space (a table that shrank): its rows, in their order, from key 0 on
            row_keys, next_key = np.arange(row_keys.size, dtype=np.int64), row_keys.size
        if row_keys.size:
            self.store.ensure(next_key)
            self.store.write(row_keys, data)
            self._index.insert(h, row_keys)
            if any(data.column(k).null_count for k in self.keys):
                self._null_keys = True
        self._next_key = next_key
        held = np.zeros(next_key, dtype=bool)
        held[row_keys] = True
        self._free, self._head, self._spare, self._dying = np.flatnonzero(~held).astype(np.int64), 0, [], []
        self.rowset = RowSet.from_keys(row_keys)

    # -- row keys ---------------------------------------------------------------------------------
    def _takeable(self) -> int:
        """Freed row keys new rows may take now (not those freed this cycle)."""
        return self._free.size - self._head + sum(a.size for a in self._spare)

    @property
    def free_keys(self) -> int:
        """Row keys freed and not yet taken again (those freed this cycle included)."""
        return self._takeable() + sum(a.size for a in self._dying)

    def _new_keys(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Row keys for `n` new rows: (reused, fresh), the lowest freed keys first once enough are
        free, then the next keys of the key space. The keys chosen depend only on which keys are
        free, so a restart from a checkpoint (whose free keys are the gaps of its key space) goes on
        as the process it replaces would have."""
        if n == 0 or self._takeable() < max(_REUSE_MIN, len(self.rowset) // 8):
            reused = _EMPTY
        else:
            if self._spare:  # two ascending runs: a stable sort merges them in one pass
                added = np.sort(np.concatenate(self._spare))
                self._free = np.sort(np.concatenate((self._free[self._head:], added)), kind="stable")
                self._head, self._spare = 0, []
            take = min(n, self._free.size - self._head)
            reused = self._free[self._head:self._head + take]
            self._head += take
            self.reused_keys += take
            if self._head == self._free.size:
                self._free, self._head = _EMPTY, 0
        fresh = np.arange(self._next_key, self._next_key + n - reused.size, dtype=np.int64)
        self._next_key += fresh.size
        return reused, fresh

    # -- cycle ----------------------------------------------------------------------------------
    def _find(self, t: pa.Table, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key_cols = [t.column(k).combine_chunks() for k in self.keys]
        if self._injective and not self._null_keys and not any(c.null_count for c in key_cols):
            # one fixed-width key column of at most 64 bits: its hash is a bijection of the value
            return self._index.lookup(h)
        return self._index.lookup(h, key_verifier(self.store, self.keys, key_cols))

    def _dedupe(self, t: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """One row per key: the last row of each key, in order of each key's first row."""
        h = hash_columns([t.column(k) for k in self.keys])
        if t.num_rows < 2 or not has_duplicates(h):
            return t, h  # distinct hashes: distinct keys
        idx = pa.array(np.arange(t.num_rows, dtype=np.int64))
        g = t.select(self.keys).append_column("__row", idx).group_by(self.keys, use_threads=False) \
            .aggregate([("__row", "min"), ("__row", "max")])
        first = g.column("__row_min").to_numpy()
        last = g.column("__row_max").to_numpy()[np.argsort(first, kind="stable")]
        return t.take(pa.array(last)), h[last]

    def apply_pending(self, step: int, ops: list[_Input]) -> Optional[TableUpdate]:
        if not ops:
            return None
        ops = _merge_runs(ops)
        if self._dying:  # removed by an earlier cycle, whose update has gone out: free now
            self._spare.extend(self._dying)
            self._dying = []
        start_next = self._next_key  # row keys below it existed before this cycle, unless reused in it
        reused_now: list[np.ndarray] = []

        def existed(rows: np.ndarray) -> np.ndarray:
            pre = rows < start_next
            if reused_now:
                pre &= ~np.isin(rows, np.concatenate(reused_now))
            return pre
        removed_pre: list[np.ndarray] = []
        dropped_new: list[np.ndarray] = []
        new_rows: list[np.ndarray] = []
        touched = _EMPTY
        saved_keys: list[np.ndarray] = []
        saved_vals: list[pa.Table] = []
        written: list[pa.Table] = []  # the new values of the rows saved, per upsert that saved some
        rewrites = 0  # upserts that wrote rows existing before the cycle
        restated: list[np.ndarray] = []  # rows existing before the cycle that a "restate" wrote
        for kind, t in ops:
            if kind == "delete":
                rows, where = self._find(t, hash_columns([t.column(k) for k in self.keys]))
                hit = rows >= 0
                where, first = np.unique(where[hit], return_index=True)
                rows = rows[hit][first]
                self._index.delete(where)
                pre = existed(rows)
                removed_pre.append(rows[pre])
                dropped_new.append(rows[~pre])
                continue
            t, h = self._dedupe(t)
            rows, _ = self._find(t, h)
            found = rows >= 0
            if found.any():
                at = np.flatnonzero(found)
                rk = rows[at]
                pre = existed(rk)
                rewrites += bool(pre.any())
                if kind == "restate":
                    restated.append(rk[pre])
                first_touch = pre & ~np.isin(rk, touched) if touched.size else pre
                new_vals = t.take(pa.array(at))
                if first_touch.any():
                    keep = rk[first_touch]
                    saved_keys.append(keep)
                    saved_vals.append(self.store.gather(keep, self.value_columns))
                    written.append(new_vals.filter(pa.array(first_touch)).select(self.value_columns))
                    touched = np.concatenate((touched, keep))
                self.store.write(rk, new_vals)
            if not found.all():
                at = np.flatnonzero(~found)
                reused, fresh = self._new_keys(at.size)
                if reused.size:
                    reused_now.append(reused)
                rk = np.concatenate((reused, fresh)) if reused.size else fresh
                self.store.ensure(self._next_key)
                self.store.write(rk, t.take(pa.array(at)))
                self._index.insert(h[at], rk)
                if not self._null_keys and any(t.column(k).null_count for k in self.keys):
                    self._null_keys = True
                new_rows.append(rk)
        self._dying.extend(a for a in (*removed_pre, *dropped_new) if a.size)
        prev = self.rowset
        removed = RowSet.from_keys(np.concatenate(removed_pre)) if removed_pre else RowSet()
        added = RowSet.from_keys(np.concatenate(new_rows)) if new_rows else RowSet()
        if dropped_new:
            added = added.minus(RowSet.from_keys(np.concatenate(dropped_new)))
        modified, modified_cols = RowSet(), set[str]()
        if saved_keys:
            keys = np.concatenate(saved_keys)
            old = pa.concat_tables(saved_vals)
            # one upsert wrote them all: its input holds the rows' values now
            new = written[0] if rewrites == 1 else None
            alive = ~removed.contains(keys)
            if not alive.all():
                keys, old = keys[alive], old.filter(pa.array(alive))
                new = None if new is None else new.filter(pa.array(alive))
            if keys.size:
                if new is None:
                    new = self.store.gather(keys, self.value_columns)
                changed_rows = np.zeros(keys.size, dtype=bool)
                for name in self.value_columns:
                    diff = ~equal_mask(old.column(name), new.column(name))
                    if diff.any():
                        modified_cols.add(name)
                        changed_rows |= diff
                if restated:
                    forced = np.isin(keys, np.concatenate(restated))
                    if forced.any():
                        changed_rows |= forced
                        modified_cols.update(self.value_columns)
                if changed_rows.any():
                    order = np.argsort(keys[changed_rows])
                    mkeys = keys[changed_rows][order]
                    modified = RowSet.from_keys(mkeys)
                    # previous values of the modified rows, key columns included
                    prev_vals = old.filter(pa.array(changed_rows)).take(pa.array(order))
                    key_vals = self.store.gather(mkeys, self.keys)
                    for name in self.keys:
                        prev_vals = prev_vals.append_column(self.schema.field(name), key_vals.column(name))
                    self._prev = (mkeys, prev_vals.select(self.schema.names))
        update = TableUpdate(added=added, removed=removed, modified=modified,
                             modified_columns=ModifiedColumnSet(modified_cols))
        if update.is_empty():
            return None
        self.prev_rowset = prev
        self.rowset = prev.minus(removed).union(added)
        return update


class UpdateSourceTable(Table):
    """A source table fed whole updates by one producer (a replica following another server, a
    scripted test source): each operation written to it (`Engine.write(table, op)`, any thread)
    is queued, and the next cycle hands every queued one, in order, to the subclass's
    `apply_pending(step, ops)`, which applies them and returns their update (or None)."""

    store: ColumnStore

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema):
        super().__init__(graph, name, schema)
        self._queue: list[Any] = []
        self._pending_lock = graph.intake_lock  # a cycle takes every source's input at once

    def queue_update(self, op: Any) -> None:
        with self._pending_lock:
            self._queue.append(op)

    def take_pending(self) -> list[Any]:
        q, self._queue = self._queue, []
        return q

    def apply_pending(self, step: int, ops: list[Any]) -> Optional[TableUpdate]:
        raise NotImplementedError
