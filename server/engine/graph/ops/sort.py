"""sort: the parent's rows in the order of some of its columns, under keys of its own."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.ops.base import (
    _EMPTY,
    _bitmap,
    _Op,
    _shifts_from_moves,
    _unregistered_on_error,
    shifted_rows,
)
from tickwire.server.engine.graph.order import OrderIndex, SortKeys
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["SortTable"]


class SortTable(_Op):
    """The parent's rows ordered by `columns` (each ascending or descending), ties in parent row
    key order; nulls sort first ascending (last descending) and NaN after every number. See the
    module docstring for the key space and shifts; `spacing` fixes the free keys per row (by
    default they follow the table's size, see `OrderIndex.spacing`)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, columns: Union[str, Sequence[str]],
                 descending: Union[bool, Sequence[bool]] = False, spacing: Optional[int] = None):
        cols = [columns] if isinstance(columns, str) else list(columns)
        if not cols:
            raise OperationError(f"table {name!r}: sort needs at least one column")
        column_names(parent.schema, cols)
        desc = [bool(descending)] * len(cols) if isinstance(descending, (bool, np.bool_)) else \
            [bool(d) for d in descending]
        if len(desc) != len(cols):
            raise OperationError(f"table {name!r}: {len(desc)} descending flags for {len(cols)} sort columns")
        self.sort_columns = cols
        self.descending = desc
        self.encoder = SortKeys(parent.schema, cols, desc)
        with graph.lock, _unregistered_on_error(graph, self):
            super().__init__(graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k == "BlinkTable"}
            pkeys = parent.rowset.keys()
            values = parent.gather(cols, pkeys)
            self.encoder.needs_more_words(values)
            self.index = OrderIndex(self.encoder.nwords, spacing)
            okeys = self.index.build(self.encoder.encode(values, pkeys))
            self._bm = _bitmap(okeys)
            self._rs = None

    def _parent_keys(self, keys: np.ndarray) -> np.ndarray:
        return self.index.id_at(keys)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return self.parent.slots(self.index.id_at(np.asarray(keys, dtype=np.int64)))

    def _edge_keys(self, n: int, front: bool) -> np.ndarray:
        return self.index.first_keys(n) if front else self.index.last_keys(n)

    def _words(self, pkeys: np.ndarray) -> list[np.ndarray]:
        return self.encoder.encode(self.parent.gather(self.sort_columns, pkeys), pkeys)

    def _follow(self, step: int, up: TableUpdate) -> TableUpdate:
        idx, parent = self.index, self.parent
        sort_cols = set(self.sort_columns)
        # 1. rows the parent removed (pre-shift parent keys)
        rem_p = up.removed.keys()
        rem_o = idx.key_of(rem_p)
        if np.any(rem_o < 0):
            raise RuntimeError(f"table {self.name!r}: the parent removed rows this table does not have")
        idx.delete(rem_o)
        # 2. rows the parent shifted: new parent keys, same place in the order
        if not up.shifted.is_empty():
            old_p, new_p = shifted_rows(parent, up)
            if old_p.size:
                idx.set_last_word(idx.key_of(old_p), new_p)
        add_p = up.added.keys()
        mod_p = up.modified.keys()
        sort_mod = bool(mod_p.size) and bool(sort_cols & up.modified_columns)
        add_vals = parent.gather(self.sort_columns, add_p)
        mod_vals = parent.gather(self.sort_columns, mod_p) if sort_mod else None
        # 3. longer strings than the encoding holds: every row is re-encoded (their order does not
        # change); rows whose sort values were modified leave their place first
        grew = self.encoder.needs_more_words(add_vals)
        if mod_vals is not None:
            grew = self.encoder.needs_more_words(mod_vals) or grew
        # 4. modified rows: those whose sort values changed leave their place
        stay_p, move_p, move_o = mod_p, _EMPTY, _EMPTY
        if sort_mod:
            cur_o = idx.key_of(mod_p)
            if grew:
                changed = np.ones(mod_p.size, dtype=bool)
            else:
                have = idx.words_at(cur_o)
                changed = np.zeros(mod_p.size, dtype=bool)
                for a, b in zip(have, self.encoder.encode(mod_vals, mod_p)):
                    changed |= a != b
            stay_p, move_p, move_o = mod_p[~changed], mod_p[changed], cur_o[changed]
            idx.delete(move_o)
        if grew and len(idx):
            okeys = idx.keys()
            idx.reword(self.encoder.nwords, self._words(idx.id_at(okeys)), okeys)
        move_words = None
        if move_p.size:
            assert mod_vals is not None  # rows move only when their sort values were modified
            move_words = self.encoder.encode(mod_vals.filter(pa.array(changed)), move_p)
        # 5. new rows and moving rows go in; a moving row keeps its key when it is still between
        # the same neighbours
        add_words = self.encoder.encode(add_vals, add_p)
        if move_words is not None:
            ins_words = [np.concatenate((a, b)) for a, b in zip(add_words, move_words)]
            prefer = np.concatenate((np.full(add_p.size, -1, dtype=np.int64), move_o))
        else:
            ins_words, prefer = add_words, None
        new_o, mo, mn, brk, kept_all = idx.insert(ins_words, prefer)
        add_o = new_o[:add_p.size]
        moved_new_o = new_o[add_p.size:]
        kept = kept_all[add_p.size:]
        out_old, out_new = move_o[~kept], moved_new_o[~kept]
        stay_o = idx.key_of(np.concatenate((stay_p, move_p[kept])))
        removed = np.concatenate((rem_o, out_old))
        added = np.concatenate((add_o, out_new))
        shifted = _shifts_from_moves(mo, mn, brk)
        self._moves = (mo, mn) if mo.size else None
        added_rs, removed_rs = RowSet.from_keys(added), RowSet.from_keys(removed)
        if mo.size:
            self._commit(removed_rs, _EMPTY)
            self._commit(mo, mn)
            self._commit(_EMPTY, added_rs)
        else:
            self._commit(removed_rs, added_rs)
        modified = RowSet.from_keys(stay_o)
        return TableUpdate(added=added_rs, removed=removed_rs, modified=modified, shifted=shifted,
                           modified_columns=ModifiedColumnSet(up.modified_columns if not modified.is_empty() else ()))


register_operation("sort", SortTable)
