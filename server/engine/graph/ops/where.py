"""where: the parent's rows for which a predicate holds."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap64

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.ops.base import (
    _EMPTY,
    _bitmap,
    _bm_keys,
    _evaluate,
    _Op,
    _restrict_shifts,
    _rs_bitmap,
    _unregistered_on_error,
    expression_columns,
)
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["WhereTable"]

Predicate = Union[pc.Expression, Callable[[pa.Table], object]]
#: rows a where evaluates at once when it is made
_PIECE = 1 << 22


def _mask(result: Any, n: int) -> np.ndarray:
    if isinstance(result, (pa.ChunkedArray, pa.Array)):
        result = pa.compute.fill_null(result, False)
        out = result.to_numpy(zero_copy_only=False) if isinstance(result, pa.Array) \
            else result.combine_chunks().to_numpy(zero_copy_only=False)
    else:
        out = np.asarray(result)
    out = np.asarray(out, dtype=bool).ravel()
    if out.size != n:
        raise OperationError(f"filter predicate returned {out.size} values for {n} rows")
    return out


class WhereTable(_Op):
    """The parent's rows for which a predicate holds, under the parent's row keys and storage.

    The predicate is a pyarrow compute expression (``pc.field("x") > 3``; null counts as false)
    or a callable ``values -> boolean array`` (evaluated on `columns` of the rows when given).
    Each cycle evaluates it only on the parent's added rows and, when a column the predicate
    reads was modified, on the modified rows' new and previous values (the previous ones say
    whether the row was in, without a lookup in the row set)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, predicate: Predicate,
                 columns: Optional[Sequence[str]] = None):
        if isinstance(predicate, pc.Expression):
            used = expression_columns(predicate, parent.schema)
            if columns is None:
                columns = used or [parent.schema.names[0]]
        elif not callable(predicate):
            raise OperationError(f"table {name!r}: a filter is a pyarrow Expression or a callable, "
                            f"got {type(predicate).__name__}")
        self.predicate = predicate
        self.columns = column_names(parent.schema, columns) if columns is not None else None
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k in ("AddOnly", "BlinkTable")}
            # a parent that can tell which of its rows pass without reading them (a history
            # table's locations, by their partition values) leaves only the rest to evaluate
            prune = getattr(parent, "prune", None)
            pruned = prune(predicate) if prune is not None and isinstance(predicate, pc.Expression) else None
            kept = pruned[0].bitmap() | BitMap64() if pruned is not None else BitMap64()
            rest = pruned[1] if pruned is not None else parent.rowset
            # evaluated in pieces: memory follows a piece, not the parent (a history's billion rows)
            for first in range(0, len(rest), _PIECE):
                keys = rest.subset_by_positions(first, first + _PIECE - 1).keys()
                kept |= _bitmap(keys[self._passes(keys)])
            self._bm = kept
            self._rs = None

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return self.parent.slots(keys)

    def stable_rows(self, rows: RowSet) -> RowSet:
        # read through the parent's storage under its keys: the parent's stable rows stay so here
        return self.parent.stable_rows(rows) if self.store is self.parent.store else RowSet()

    def _passes(self, keys: np.ndarray, extra: Optional[pa.Table] = None) -> np.ndarray:
        """Whether the parent's rows `keys` (then the rows of `extra`, values of the same columns) pass."""
        if keys.size == 0 and extra is None:
            return np.zeros(0, dtype=bool)
        values = self.parent.gather(self.columns, keys)
        if extra is not None:
            values = pa.concat_tables([values, extra])
        n = values.num_rows
        if n == 0:
            return np.zeros(0, dtype=bool)
        if isinstance(self.predicate, pc.Expression):
            result = _evaluate(values, [self.predicate], ["_"]).column(0).combine_chunks()
        else:
            result = self.predicate(values)
        return _mask(result, n)

    def _prev_values(self, mkeys: np.ndarray) -> Optional[pa.Table]:
        """The previous values of the parent's modified rows, in the columns the filter reads (None
        when the parent keeps none)."""
        try:
            prev = self.parent.prev_gather(self.columns, mkeys)
        except (RuntimeError, KeyError):
            return None
        names = self.columns if self.columns is not None else self.parent.schema.names
        if prev.schema.names != list(names) or any(f.type != self.parent.schema.field(c).type
                                                   for f, c in zip(prev.schema, names)):
            return None
        return prev

    def _follow(self, step: int, up: TableUpdate) -> TableUpdate:
        # the row set is read only when the parent removed or shifted rows, or modified rows
        # without changing what the filter reads
        removed_bm = self._bm & _rs_bitmap(up.removed, copy=False) if not up.removed.is_empty() else BitMap64()
        if len(removed_bm):
            self._commit(_bm_keys(removed_bm), _EMPTY)
        shifted = RowSetShiftData()
        moved_old, moved_new = _EMPTY, _EMPTY
        if not up.shifted.is_empty():
            sh = up.shifted
            parts = []
            bm = self._bm
            for s, e, d in zip(sh.starts.tolist(), sh.ends.tolist(), sh.deltas.tolist()):  # per shift range
                rng = BitMap64()
                rng.add_range(s, e + 1)
                part = bm & rng
                if len(part):
                    parts.append((part, d))
            if parts:
                moved_old = np.concatenate([_bm_keys(p) for p, _ in parts])
                moved_new = np.concatenate([_bm_keys(p) + d for p, d in parts])
                self._commit(moved_old, moved_new)
                shifted = _restrict_shifts(sh, moved_old)
        self._moves = (moved_old, moved_new) if moved_old.size else None
        add_p = up.added.keys()
        modified, leaving = _EMPTY, _EMPTY
        if not up.modified.is_empty() and (self.columns is None or set(self.columns) & up.modified_columns):
            mkeys = up.modified.keys()
            # one evaluation for the added rows, the modified ones, and (when the parent has them)
            # the modified rows' previous values: a row was in this table exactly when they passed,
            # which spares a lookup in the row set (its cost grows with the key space the change
            # is spread over)
            prev = self._prev_values(mkeys)
            passes = self._passes(np.concatenate((add_p, mkeys)), extra=prev)
            entering = add_p[passes[:add_p.size]]
            mpass = passes[add_p.size:add_p.size + mkeys.size]
            if prev is not None:
                was = passes[add_p.size + mkeys.size:]
            else:
                inside = _bm_keys(self._bm & _rs_bitmap(up.modified, copy=False))
                was = np.isin(mkeys, inside, assume_unique=True)
            modified = mkeys[was & mpass]
            leaving = mkeys[was & ~mpass]
            entering = np.concatenate((entering, mkeys[~was & mpass]))
        else:
            entering = add_p[self._passes(add_p)]
            modified = (_bm_keys(self._bm & _rs_bitmap(up.modified, copy=False)) if not up.modified.is_empty()
                        else _EMPTY)
        removed = _bm_keys(removed_bm)
        if leaving.size:
            # back to pre-shift keys
            pre = leaving.copy()
            if moved_new.size:
                i = np.searchsorted(moved_new, leaving)
                hit = i < moved_new.size
                hit[hit] = moved_new[i[hit]] == leaving[hit]
                pre[hit] = moved_old[i[hit]]
                # rows that moved and then left are not moves of this table
                stay = ~np.isin(moved_new, leaving, assume_unique=True)
                moved_old, moved_new = moved_old[stay], moved_new[stay]
                self._moves = (moved_old, moved_new) if moved_old.size else None
                shifted = _restrict_shifts(shifted, moved_old)
            removed = np.concatenate((removed, pre))
        added = RowSet.from_keys(entering)
        self._commit(leaving, added)
        mod = RowSet.from_keys(modified)
        return TableUpdate(added=added, removed=RowSet.from_keys(removed), modified=mod,
                           shifted=shifted,
                           modified_columns=ModifiedColumnSet(up.modified_columns if not mod.is_empty() else ()))


register_operation("where", WhereTable)
