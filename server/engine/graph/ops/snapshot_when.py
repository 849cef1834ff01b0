"""snapshot_when: the base table as it was when the trigger table last changed, stamped with the
trigger's last row, as Deephaven's snapshotWhen.

Any change of the trigger (rows added, modified or removed) in a cycle takes one snapshot, after
that cycle's base changes. The stamp columns (`stamps`: output name -> trigger column; default all
of them) hold the trigger's last row at that moment (nulls when it has none).

- Without `history`: the result's rows are the base's rows at the last snapshot, under the base's
  row keys then, values copied (a snapshot does not change until the next one); the base's updates
  between snapshots are coalesced into one, which the next snapshot applies. Not `incremental`:
  every row is restamped (and reported modified) at each snapshot; `incremental`: only rows the base
  added or modified since the last snapshot take the new values and stamp, the others keep theirs.
  Before the first snapshot the result is empty, unless `initial` takes one at once. Columns: the
  base's, then the stamps.
- With `history`: each trigger row added appends a whole copy of the base stamped with that row
  (stamp columns first); the result only grows. A trigger row modified or removed fails the table,
  as in Deephaven. Stamped with every trigger column (none named), a trigger column named like a
  base column keeps its place among the stamps with the base's values, as Deephaven answers;
  otherwise such a name is refused.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.column_store import ColumnStore
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.cross_join import _ragged
from tickwire.server.engine.graph.ops.join_keys import unknown_columns
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["SnapshotWhenTable"]


def _moved(prev: RowSet, update: TableUpdate) -> tuple[np.ndarray, np.ndarray]:
    """(old, new) keys of the rows of `prev` an update shifts (those it does not remove)."""
    sh = update.shifted
    if sh.is_empty():
        return _EMPTY, _EMPTY
    kept = prev.minus(update.removed) if not update.removed.is_empty() else prev
    olds, news = [], []
    for s, e, d in zip(sh.starts.tolist(), sh.ends.tolist(), sh.deltas.tolist()):  # one query per shift range
        k = kept.subset_by_key_range(s, e).keys()
        if k.size:
            olds.append(k)
            news.append(k + d)
    if not olds:
        return _EMPTY, _EMPTY
    return np.concatenate(olds), np.concatenate(news)


class SnapshotWhenTable(_Op):
    """`base` snapshotted whenever `trigger` changes (see the module docstring)."""

    store: ColumnStore

    def __init__(self, graph: "UpdateGraph", name: str, base: Table, trigger: Table,
                 stamps: Optional[Sequence[tuple[str, str]]] = None, initial: bool = False,
                 incremental: bool = False, history: bool = False):
        every = stamps is None or not len(stamps)
        if stamps is None or not len(stamps):
            stamps = [(c, c) for c in trigger.schema.names]
        # as Deephaven: an output name given twice keeps its first place and its last column
        stamps = list({str(a): str(b) for a, b in stamps}.items())
        missing = [c for _n, c in stamps if c not in trigger.schema.names]
        if missing:
            raise unknown_columns(trigger, missing)
        clash = [n for n, _c in stamps if n in base.schema.names]
        # as Deephaven: a history stamped with every trigger column (none named) takes a trigger
        # column named like a base column, in its place among the stamps, with the base's values
        if clash and not (history and every):
            raise OperationError(f"Column name conflicts: {', '.join(clash)}")
        if history and (initial or incremental):
            raise OperationError("snapshotWhen with history does not currently support incremental nor initial")
        self.base, self.trigger = base, trigger
        self.stamps = stamps
        self.initial, self.incremental, self.history = bool(initial), bool(incremental), bool(history)
        sfields = [base.schema.field(n) if n in clash else trigger.schema.field(c).with_name(n) for n, c in stamps]
        fields = sfields + [f for f in base.schema if f.name not in clash] if history else list(base.schema) + sfields
        self._slot_of = KeyMap()            # row key -> slot (without history; with it a row key is its slot)
        self._free = _EMPTY.copy()
        self._nslots = 0
        self._snapped = False
        self._pending: Optional[TableUpdate] = None  # the base's updates since the last snapshot
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, base, pa.schema(fields), others=[trigger])
            self.store = ColumnStore(self.schema)
            if history:
                rows = trigger.rowset.keys()
                if rows.size:
                    self._append(rows)
            elif initial:
                self._first()
            self._rs = None
            self._update = None
            self._prev = None

    # -- storage --------------------------------------------------------------------------------
    def slots(self, keys: np.ndarray) -> np.ndarray:
        if self.history:
            return keys
        return self._slot_of.get(keys)

    def _alloc(self, m: int) -> np.ndarray:
        take = min(m, self._free.size)
        slots = np.concatenate((self._free[self._free.size - take:],
                                np.arange(self._nslots, self._nslots + m - take, dtype=np.int64)))
        self._free = self._free[:self._free.size - take]
        self._nslots += m - take
        self.store.ensure(max(self._nslots, 1))
        return slots

    def _stamp_rows(self, trigger_keys: np.ndarray) -> pa.Table:
        """The stamp columns of trigger rows `trigger_keys` (-1: nulls)."""
        have = trigger_keys >= 0
        got = self.trigger.gather([c for _n, c in self.stamps], trigger_keys[have])
        idx = np.full(trigger_keys.size, -1, dtype=np.int64)
        idx[have] = np.arange(int(have.sum()), dtype=np.int64)
        take = pa.array(idx, mask=idx < 0)
        return pa.Table.from_arrays([c.combine_chunks().take(take) for c in got.columns],
                                    names=[n for n, _c in self.stamps])

    def _last_trigger_row(self) -> np.ndarray:
        rs = self.trigger.rowset
        return np.array([rs.last() if not rs.is_empty() else -1], dtype=np.int64)

    def _rows(self, base_keys: np.ndarray, stamp_keys: np.ndarray) -> pa.Table:
        """Result rows: base rows `base_keys` with the stamps of trigger rows `stamp_keys` (one each)."""
        vals = self.base.gather(None, base_keys)
        st = self._stamp_rows(stamp_keys)
        base_cols, stamp_cols = dict(zip(vals.column_names, vals.columns)), dict(zip(st.column_names, st.columns))
        cols = {**stamp_cols, **base_cols} if self.history else {**base_cols, **stamp_cols}  # (see __init__)
        return pa.Table.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)

    # -- snapshots ------------------------------------------------------------------------------
    def _append(self, trigger_rows: np.ndarray) -> TableUpdate:
        """History: one copy of the base per trigger row."""
        base_keys = self.base.rowset.keys()
        n = base_keys.size
        owner, pos = _ragged(np.full(trigger_rows.size, n, dtype=np.int64))
        start = self._nslots
        keys = np.arange(start, start + owner.size, dtype=np.int64)
        self._nslots += owner.size
        if keys.size:
            self.store.ensure(self._nslots)
            self.store.write(keys, self._rows(base_keys[pos], trigger_rows[owner]))
            self._commit(_EMPTY, keys)
        return TableUpdate(added=RowSet.from_keys(keys))

    def _first(self) -> TableUpdate:
        keys = self.base.rowset.keys()
        slots = self._alloc(keys.size)
        self._slot_of.set(keys, slots)
        if keys.size:
            self.store.write(slots, self._rows(keys, np.repeat(self._last_trigger_row(), keys.size)))
        self._commit(_EMPTY, keys)
        self._snapped = True
        self._pending = None
        return TableUpdate(added=RowSet.from_keys(keys))

    def _snap(self) -> Optional[TableUpdate]:
        """Applies the base's changes since the last snapshot, with the new stamp."""
        up = self._pending or TableUpdate()
        self._pending = None
        prev = self.rowset
        rem = up.removed.keys()
        if rem.size:
            self._free = np.concatenate((self._free, self._slot_of.get(rem)))
            self._slot_of.delete(rem)
        old, new = _moved(prev, up)
        if old.size:
            self._slot_of.remap(old, new)
        stamp = self._last_trigger_row()
        add = up.added.keys()
        slots = self._alloc(add.size)
        self._slot_of.set(add, slots)
        if add.size:
            self.store.write(slots, self._rows(add, np.repeat(stamp, add.size)))
        if self.incremental:
            mod = up.modified.keys()
            cols = set(up.modified_columns) | {n for n, _c in self.stamps}
        else:
            mod = prev.minus(up.removed).keys()
            if old.size:
                mod = np.union1d(np.setdiff1d(mod, old, assume_unique=True), new)
            cols = set(self.schema.names)
        if mod.size:
            ms = self._slot_of.get(mod)
            self._prev = (mod, self.store.gather(ms))
            self.store.write(ms, self._rows(mod, np.repeat(stamp, mod.size)))
        self._commit(rem, _EMPTY)
        if old.size:
            self._commit(old, new)
            self._moves = (old, new)
        self._commit(_EMPTY, add)
        update = TableUpdate(added=up.added, removed=up.removed, shifted=up.shifted, modified=RowSet.from_keys(mod),
                             modified_columns=ModifiedColumnSet([c for c in self.schema.names if c in cols]
                                                                if mod.size else ()))
        return None if update.is_empty() else update

    # -- the cycle ------------------------------------------------------------------------------
    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        bup = updates.get(self.base.name)
        tup = updates.get(self.trigger.name)
        if bup is not None and self._snapped:
            self._pending = bup if self._pending is None else self._pending.coalesce(bup, self.rowset)
        if tup is None:
            return None
        if self.history:  # as Deephaven: a history follows a trigger that only grows
            if not tup.modified.is_empty() or not tup.removed.is_empty():
                what = "modified" if not tup.modified.is_empty() else "removed"
                raise OperationError(f"Assertion failed: asserted updateToSend.{what}.empty(): snapshot_when with "
                                     f"history cannot follow a trigger row that is {what}")
            added = tup.added.keys()
            return self._append(added) if added.size else None
        if not self._snapped:
            return self._first()
        return self._snap()

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        return Table.prev_gather(self, columns, keys)  # the copies the snapshot replaced


def _snapshot_when(graph: "UpdateGraph", name: str, base: Table, trigger: Table,
                   stamps: Optional[Sequence[tuple[str, str]]] = None, initial: bool = False,
                   incremental: bool = False, history: bool = False) -> Table:
    return SnapshotWhenTable(graph, name, base, trigger, stamps, initial, incremental, history)


register_operation("snapshot_when", _snapshot_when)
