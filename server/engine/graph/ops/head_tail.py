"""head and tail: the first or last n rows of the parent."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.ops.base import (
    _EMPTY,
    _bitmap,
    _first_keys,
    _Op,
    _restrict_shifts,
    _unregistered_on_error,
)
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["HeadTailTable"]


class HeadTailTable(_Op):
    """The first (`head`) or last (`tail`) n rows of the parent, under the parent's row keys.
    Each cycle reads the parent's first or last n keys and compares them with its own: cost
    O(n + the parent's change)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, n: int, tail: bool = False):
        if int(n) < 0:
            raise OperationError(f"table {name!r}: {'tail' if tail else 'head'} needs n >= 0, got {n}")
        self.n = int(n)
        self.from_end = bool(tail)
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k == "BlinkTable"}
            self._keys = _first_keys(parent, self.n, not self.from_end) if self.n else _EMPTY.copy()
            self._bm = _bitmap(self._keys)
            self._rs = None

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return self.parent.slots(keys)

    def _edge_keys(self, n: int, front: bool) -> np.ndarray:
        n = min(int(n), self._keys.size)
        keys: np.ndarray = self._keys[:n].copy() if front else self._keys[self._keys.size - n:].copy()
        return keys

    def _follow(self, step: int, up: TableUpdate) -> TableUpdate:
        h0 = self._keys
        h1 = _first_keys(self.parent, self.n, not self.from_end) if self.n else _EMPTY.copy()
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
        return TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(removed), modified=modified,
                           shifted=shifted,
                           modified_columns=ModifiedColumnSet(up.modified_columns if not modified.is_empty() else ()))


register_operation("head", lambda graph, name, parent, n: HeadTailTable(graph, name, parent, n, False))
register_operation("tail", lambda graph, name, parent, n: HeadTailTable(graph, name, parent, n, True))
