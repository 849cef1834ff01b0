"""where_in and where_not_in: the left rows whose key is (or is not) among the right table's keys.

A filter of the left table (its row keys and storage, as `where`), whose predicate is "the row's key
group has right rows". Both sides are followed by key group (`JoinSide`): the right side only
counts rows per group; the left side also keeps each group's rows, so that when a group gains its
first right row or loses its last one, exactly the left rows of that group are tested again. The
cycle hands the filter the left table's update with those rows added to its modified rows (as if
their key had changed), so that `where`'s bookkeeping of entering, leaving, shifted and modified
rows applies unchanged.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa
from pyroaring import BitMap64

from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.ops.base import _EMPTY, _bitmap, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.join_keys import JoinSide, KeySpace, check_keys, epoch_pair
from tickwire.server.engine.graph.ops.where import WhereTable
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["WhereInTable"]


class WhereInTable(WhereTable):
    """The rows of `left` whose `on` columns ((left, right) pairs) match a row of `right`
    (`inverted`: match none)."""

    def __init__(self, graph: "UpdateGraph", name: str, left: Table, right: Table,
                 on: Sequence[tuple[str, str]], inverted: bool = False):
        on = [(str(a), str(b)) for a, b in on]
        check_keys(name, left, right, on, epoch=True)  # as Deephaven: an Instant key may meet a long one
        self.on = on
        self.inverted = bool(inverted)
        self.right = right
        self.predicate = self._passing
        self.columns = [a for a, _b in on] or None
        self.space = KeySpace([pa.int64() if epoch_pair(left.schema.field(a).type, right.schema.field(b).type)
                               else left.schema.field(a).type for a, b in on], reuse=True)
        self.lside = JoinSide(self.space, left, [a for a, _b in on])
        self.rside = JoinSide(self.space, right, [b for _a, b in on], members=False)
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, left, left.schema, others=[right])
            self.store = left.store
            self.attributes: dict[str, object] = {}
            self.rside.follow(TableUpdate(added=right.rowset))
            self.lside.follow(TableUpdate(added=left.rowset))
            keys = left.rowset.keys()
            self._bm = _bitmap(keys[self._passes(keys)]) if keys.size else BitMap64()
            self._rs = None

    def _passing(self, values: pa.Table) -> np.ndarray:  # never called: `_passes` reads groups
        raise RuntimeError("where_in tests rows by key group")

    def _in(self, groups: np.ndarray) -> np.ndarray:
        out: np.ndarray = (self.rside.counts(groups) > 0) != self.inverted
        return out

    def _passes(self, keys: np.ndarray, extra: Optional[pa.Table] = None) -> np.ndarray:
        if keys.size == 0:
            return np.zeros(0, dtype=bool)
        return self._in(self.lside.group_of.get(keys))

    def _prev_values(self, mkeys: np.ndarray) -> Optional[pa.Table]:
        return None  # whether a row was in is read from the row set

    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        self.space.begin_cycle()
        lup = updates.get(self.parent.name)
        rup = updates.get(self.right.name)
        flipped = _EMPTY
        if rup is not None:
            rc = self.rside.follow(rup)
            G = rc.touched
            if G.size:
                now = self.rside.counts(G) > 0
                was = rc.counts_before(self.rside, G) > 0
                flipped = G[was != now]
        if lup is not None:
            self.lside.follow(lup)
        else:
            lup = TableUpdate()
        if flipped.size == 0:
            return self._follow(step, lup) if updates.get(self.parent.name) is not None else None
        _g, rows = self.lside.rows_of(flipped)
        if rows.size and not lup.added.is_empty():
            rows = rows[~lup.added.contains(rows)]
        if rows.size == 0:
            return self._follow(step, lup) if updates.get(self.parent.name) is not None else None
        keys = [a for a, _b in self.on]
        mod = lup.modified.union(RowSet.from_keys(unique(rows)))
        cols = set(lup.modified_columns) | set(keys)
        widened = TableUpdate(added=lup.added, removed=lup.removed, shifted=lup.shifted, modified=mod,
                              modified_columns=ModifiedColumnSet([c for c in self.schema.names if c in cols]))
        update = self._follow(step, widened)
        if not update.modified.is_empty():
            # rows only retested keep the left table's modified columns
            real = update.modified.intersect(lup.modified) if not lup.modified.is_empty() else RowSet()
            update = TableUpdate(added=update.added, removed=update.removed, shifted=update.shifted,
                                 modified=real,
                                 modified_columns=ModifiedColumnSet(lup.modified_columns if not real.is_empty()
                                                                    else ()))
        return update


def _where_in(graph: "UpdateGraph", name: str, left: Table, right: Table, on: Sequence[tuple[str, str]],
              inverted: bool = False) -> Table:
    return WhereInTable(graph, name, left, right, on, inverted)


register_operation("where_in", _where_in)
