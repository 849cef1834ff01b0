"""slice and flatten: rows of the parent by position.

- `slice(first, last)`: the parent's rows at positions [first, last), under the parent's row keys,
  with Deephaven's rules for negative positions (counted from the end; a negative first with last
  0 runs to the end; an end before the start gives no rows). Each cycle reads the parent's keys in
  the new position range and compares them with its own: cost O(slice + the parent's change).
- `flatten()`: the parent's rows under the row keys 0..n-1 (their positions). An added or removed
  parent row moves the rows after it: those moves are reported as shifts, one range per run of
  rows moving by the same amount, computed from the added and removed ranges only (as Deephaven
  computes them), so a cycle costs what the change costs plus one read of the parent's keys.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from tickwire.server.engine.graph.ops.base import _EMPTY, _bitmap, _Op, _restrict_shifts, _unregistered_on_error
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData, RowSetShiftDataBuilder
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["SliceTable", "FlattenTable", "slice_positions", "flattened_shifts"]


def slice_positions(first: int, last: int, size: int) -> tuple[int, int]:
    """[start, end) positions of `slice(first, last)` on a table of `size` rows (Deephaven's rules)."""
    start, end = int(first), int(last)
    if start < 0:
        if end == 0:  # a negative start with end 0 runs to the end (tail)
            end = size
        start = max(0, start + size)
    if end < 0:
        end = max(0, end + size)
    end = max(start, end)  # an end before the start: no rows
    return min(start, size), min(end, size)


class SliceTable(_Op):
    """The parent's rows at positions [first, last) (see `slice_positions`), under its row keys."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, first: int, last: int):
        from tickwire.server.engine.errors import OperationError

        first, last = int(first), int(last)
        if (first < 0 or last >= 0) and last < first and first != last:
            raise OperationError(f"table {name!r}: cannot slice with a first position ({first}) after the "
                                 f"last position ({last})")
        self.first, self.last = first, last
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = self._attributes(parent)
            self._keys = self._current_keys()
            self._bm = _bitmap(self._keys)
            self._rs = None

    def _attributes(self, parent: Table) -> dict[str, object]:
        """As Deephaven: flat when the parent is and the slice starts at 0; append-only when the
        parent is and the start is not negative; add-only too when the end also floats."""
        out: dict[str, object] = {}
        if self.first == self.last:
            return out
        if parent.attributes.get("IsFlat") and self.first == 0:
            out["IsFlat"] = True
        if self.first >= 0:
            if parent.attributes.get("AddOnly") and self.last <= 0:
                out["AddOnly"] = True
            if parent.attributes.get("AppendOnly"):
                out["AppendOnly"] = True
        return out

    def _current_keys(self) -> np.ndarray:
        keys: np.ndarray = _EMPTY.copy()
        if self.first == self.last:
            return keys
        rs = self.parent.rowset
        a, b = slice_positions(self.first, self.last, len(rs))
        if b > a:
            keys = rs.subset_by_positions(a, b - 1).keys()
        return keys

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return self.parent.slots(keys)

    def _follow(self, step: int, up: TableUpdate) -> TableUpdate:
        h0 = self._keys
        h1 = self._current_keys()
        gone = up.removed.contains(h0) if h0.size and not up.removed.is_empty() else np.zeros(h0.size, dtype=bool)
        s0 = h0[~gone]
        s0_new = up.shifted.apply_to_keys(s0)
        stays = np.isin(s0_new, h1, assume_unique=True)
        removed = np.concatenate((h0[gone], s0[~stays]))
        kept_old, kept_new = s0[stays], s0_new[stays]
        added = h1[~np.isin(h1, kept_new, assume_unique=True)]
        moved = kept_old != kept_new
        shifted = _restrict_shifts(up.shifted, kept_old[moved]) if moved.any() else RowSetShiftData()
        self._moves = (kept_old[moved], kept_new[moved]) if moved.any() else None
        modified = RowSet()
        if not up.modified.is_empty() and kept_new.size:
            m = up.modified.keys()
            modified = RowSet.from_keys(m[np.isin(m, kept_new, assume_unique=True)])
        self._keys = h1
        self._bm = _bitmap(h1)
        return TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(np.sort(removed)),
                           modified=modified, shifted=shifted,
                           modified_columns=ModifiedColumnSet(up.modified_columns if not modified.is_empty() else ()))


def flattened_shifts(removed: RowSet, added: RowSet, prev_size: int) -> RowSetShiftData:
    """The shifts of a flat table (keys = positions) whose rows at positions `removed` (before the
    change) went and `added` (after it) arrived: one pass over both sets' ranges, as Deephaven's
    flatten computes them."""
    if removed.is_empty() and added.is_empty():
        return RowSetShiftData()
    out = RowSetShiftDataBuilder()
    rm = removed.ranges().tolist()
    ad = added.ranges().tolist()
    i = j = 0
    delta = 0  # previous key space -> new key space
    marker = 0  # every position below it is accounted for
    while i < len(rm) or j < len(ad):
        next_rm = rm[i][0] if i < len(rm) else None
        next_add = ad[j][0] - delta if j < len(ad) else None
        if next_rm is not None and next_rm == next_add:
            n_rm = rm[i][1] - rm[i][0] + 1
            n_add = ad[j][1] - ad[j][0] + 1
            if n_rm != n_add:
                out.shift_range(marker, next_add - 1, delta)
                delta += n_add - n_rm
                marker = rm[i][1] + 1
            i += 1
            j += 1
        elif next_add is None or (next_rm is not None and next_rm < next_add):
            assert next_rm is not None
            out.shift_range(marker, next_rm - 1, delta)
            delta -= rm[i][1] - rm[i][0] + 1
            marker = rm[i][1] + 1
            i += 1
        else:
            out.shift_range(marker, next_add - 1, delta)
            delta += ad[j][1] - ad[j][0] + 1
            marker = next_add
            j += 1
    if marker < prev_size:
        out.shift_range(marker, prev_size - 1, delta)
    return out.build()


class FlattenTable(_Op):
    """The parent's rows under the row keys 0..n-1. Values are read through the parent's keys at
    those positions (read once per cycle, when first needed)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table):
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k in ("AddOnly", "AppendOnly")}
            self.attributes["IsFlat"] = True
            self._parent_keys_now: Optional[np.ndarray] = None
            n = parent.size
            self._n = n
            self.rowset = RowSet.range(0, n - 1)

    def _pkeys(self) -> np.ndarray:
        if self._parent_keys_now is None:
            self._parent_keys_now = self.parent.rowset.keys()
        return self._parent_keys_now

    def _parent_keys(self, keys: np.ndarray) -> np.ndarray:
        k = np.asarray(keys, dtype=np.int64)
        if k.size == 0:
            empty: np.ndarray = _EMPTY.copy()
            return empty
        rs = self.parent.rowset
        if rs.is_single_range:  # the common case: keys are the parent's positions shifted
            return k + rs.first()
        out: np.ndarray = self._pkeys()[k]
        return out

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return self.parent.slots(self._parent_keys(keys))

    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        self._parent_keys_now = None  # the parent's keys changed (shifts alone change them too)
        rs = self.parent.rowset
        modified = rs.positions_of(up.modified) if not up.modified.is_empty() else RowSet()
        mcs = ModifiedColumnSet(up.modified_columns if not modified.is_empty() else ())
        if up.added.is_empty() and up.removed.is_empty():
            return TableUpdate(modified=modified, modified_columns=mcs)
        prev = self.parent.prev_rowset
        if prev is None:
            raise RuntimeError(f"table {self.parent.name!r} changed rows but has no previous row set")
        added = rs.positions_of(up.added)
        removed = prev.positions_of(up.removed) if not up.removed.is_empty() else RowSet()
        prev_n, n = self._n, len(rs)
        shifted = flattened_shifts(removed, added, prev_n)
        if n < prev_n:
            self._commit(RowSet.range(n, prev_n - 1), _EMPTY)
        elif n > prev_n:
            self._commit(_EMPTY, RowSet.range(prev_n, n - 1))
        self._n = n
        return TableUpdate(added=added, removed=removed, modified=modified, shifted=shifted, modified_columns=mcs)


register_operation("slice", lambda graph, name, parent, first, last: SliceTable(graph, name, parent, first, last))
register_operation("flatten", lambda graph, name, parent: FlattenTable(graph, name, parent))
