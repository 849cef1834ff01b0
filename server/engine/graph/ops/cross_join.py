"""join (cross join): each left row once for every right row of its key (every right row without
keys), left rows in order, each one's right rows in right row-key order, incrementally on both sides.

Row keys: a left row's block. Left row key k gives the rows `((k - base) << bits) + j` for
j < (right rows of its group): `bits` (at least `reserve_bits`, 10 by default, as Deephaven
reserves) is widened when a group outgrows it, and `base` keeps a left table whose keys live high
(a sort's) inside the 62 bits left for them. A left shift is a shift of whole blocks. When a key
group's right rows change, each of its left rows' blocks is removed and added again (cost: the left
rows of the changed groups, found through the left side's members, times their right rows); a left
row modified without changing its key or group is a modification of its block. Widening `bits`
re-lays every row out: the update then removes every row and adds them all again.

Values are read through the row keys: left columns from the left row `(key >> bits) + base`, right
columns from the j-th right row of its group (nothing is copied).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.ops.base import _EMPTY, _bm_keys, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.join_keys import JoinSide, KeySpace, SideChange, check_keys
from tickwire.server.engine.graph.ops.natural_join import right_columns
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["CrossJoinTable"]

_KEY_BITS = 62


def _ragged(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner index, position within owner) of every element of blocks of `sizes`."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    owner = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    starts = np.cumsum(sizes) - sizes
    return owner, np.arange(total, dtype=np.int64) - starts[owner]


class _CrossStore:
    def __init__(self, join: "CrossJoinTable"):
        self.join = join

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        j = self.join
        names = list(columns) if columns is not None else j.schema.names
        keys = np.asarray(slots, dtype=np.int64)
        lk = j.left_key(keys)
        got: dict[str, pa.ChunkedArray] = {}
        lnames = [n for n in names if n in j.left_names]
        rnames = [n for n in names if n not in j.left_names]
        if lnames:
            got.update(zip(lnames, j.left.gather(lnames, lk).columns))
        if rnames:
            rk = j.right_rows(lk, keys & ((1 << j.bits) - 1))
            src = j.right.gather([j.added[n] for n in rnames], rk)
            got.update(zip(rnames, src.columns))
        return pa.Table.from_arrays([got[n] for n in names], schema=pa.schema([j.schema.field(n) for n in names]))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class CrossJoinTable(_Op):
    """Each row of `left` with every row of `right` whose `on` columns equal its own (see the
    module docstring)."""

    def __init__(self, graph: "UpdateGraph", name: str, left: Table, right: Table,
                 on: Sequence[tuple[str, str]] = (), joins: Optional[Sequence[tuple[str, str]]] = None,
                 reserve_bits: int = 10):
        on = [(str(a), str(b)) for a, b in on]
        check_keys(name, left, right, on)
        if not 1 <= int(reserve_bits) <= 31:
            raise OperationError(f"table {name!r}: reserve_bits must be between 1 and 31, got {reserve_bits}")
        self.on = on
        self.joins = right_columns(name, left, right, on, joins)
        self.added = dict(self.joins)
        self.left, self.right = left, right
        self.left_names = set(left.schema.names)
        self.reserve = int(reserve_bits)
        self.bits = self.reserve
        self.base = 0
        self.space = KeySpace([left.schema.field(a).type for a, _b in on], reuse=True)
        self.lside = JoinSide(self.space, left, [a for a, _b in on])
        self.rside = JoinSide(self.space, right, [b for _a, b in on])
        self._lup: Optional[TableUpdate] = None
        rfields = [right.schema.field(c).with_name(n) for n, c in self.joins]
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, left, pa.schema(list(left.schema) + rfields), others=[right])
            self.store = _CrossStore(self)
            self.rside.follow(TableUpdate(added=right.rowset))
            self.lside.follow(TableUpdate(added=left.rowset))
            self._layout()
            self._commit(_EMPTY, self._all_rows())
            self._rs = None

    # -- row keys -------------------------------------------------------------------------------
    def left_key(self, keys: np.ndarray) -> np.ndarray:
        out: np.ndarray = (np.asarray(keys, dtype=np.int64) >> self.bits) + self.base
        return out

    def right_rows(self, lkeys: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The right row at position `pos` of the group of each left row."""
        g = self.lside.group_of.get(lkeys)
        if g.size == 0:
            empty: np.ndarray = _EMPTY.copy()
            return empty
        mg, mk = self.rside.rows_of(unique(g))
        out: np.ndarray = mk[np.searchsorted(mg, g) + pos]
        return out

    def _blocks(self, lkeys: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        owner, j = _ragged(sizes)
        out: np.ndarray = ((lkeys[owner] - self.base) << self.bits) + j
        return out

    def _layout(self) -> None:
        """Chooses `bits` and `base` for the current rows."""
        counts = self.rside.counts(np.arange(self.space.n, dtype=np.int64))
        widest = int(counts.max()) if counts.size else 0
        self.bits = max(self.reserve, (max(widest, 1) - 1).bit_length())
        keys = self.left.rowset.keys()
        room = 1 << (_KEY_BITS - self.bits)
        self.base = max(0, int(keys.min()) - room // 2) if keys.size else 0
        if keys.size and int(keys.max()) - self.base >= room:
            raise OperationError(f"table {self.name!r}: the left table's row keys span more than {room} "
                                 f"(with {self.bits} bits per left row for the right rows)")

    def _fits(self, lkeys: np.ndarray, sizes: np.ndarray) -> bool:
        if sizes.size and int(sizes.max()) > (1 << self.bits):
            return False
        if lkeys.size:
            rel = lkeys - self.base
            if int(rel.min()) < 0 or int(rel.max()) >= (1 << (_KEY_BITS - self.bits)):
                return False
        return True

    def _all_rows(self) -> np.ndarray:
        lk = self.left.rowset.keys()
        return self._blocks(lk, self.rside.counts(self.lside.group_of.get(lk)))

    # -- the cycle ------------------------------------------------------------------------------
    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        self.space.begin_cycle()
        lup = updates.get(self.left.name)
        rup = updates.get(self.right.name)
        self._lup = lup
        lc = self.lside.follow(lup) if lup is not None else SideChange()
        rc = self.rside.follow(rup) if rup is not None else SideChange()
        RG = rc.touched
        if rup is not None and not rup.modified.is_empty() and set(self.added.values()) & rup.modified_columns:
            RG = unique(np.concatenate((RG, self.rside.group_of.get(rup.modified.keys()))))
        before = rc.counts_before(self.rside, RG)

        def old_size(groups: np.ndarray) -> np.ndarray:
            out: np.ndarray = self.rside.counts(groups).copy()
            if RG.size and groups.size:
                i = np.minimum(np.searchsorted(RG, groups), RG.size - 1)
                hit = RG[i] == groups
                out[hit] = before[i[hit]]
            return out

        def pre_key(keys: np.ndarray) -> np.ndarray:
            if lc.shift_new.size == 0 or keys.size == 0:
                return keys
            i = np.minimum(np.searchsorted(lc.shift_new, keys), lc.shift_new.size - 1)
            hit = lc.shift_new[i] == keys
            return np.where(hit, lc.shift_old[i], keys)

        # left rows whose block is removed and added again: key changed, or group's right rows changed
        redo = lc.moved
        if RG.size:
            _g, members = self.lside.rows_of(RG)
            if members.size and lc.added.size:
                members = members[~np.isin(members, lc.added)]
            redo = unique(np.concatenate((redo, members)))
        redo_old_g = self.lside.group_of.get(redo)
        if lc.moved.size:
            i = np.searchsorted(np.sort(lc.moved), redo)
            order = np.argsort(lc.moved)
            ms = lc.moved[order]
            i = np.minimum(i, ms.size - 1)
            hit = ms[i] == redo
            redo_old_g = np.where(hit, lc.moved_from[order][i], redo_old_g)
        new_keys = np.concatenate((lc.added, redo))
        new_sizes = self.rside.counts(self.lside.group_of.get(new_keys))
        if not self._fits(new_keys, new_sizes):
            return self._relayout()
        gone = np.concatenate((self._blocks(lc.removed, old_size(lc.removed_groups)),
                               self._blocks(pre_key(redo), old_size(redo_old_g))))
        come = self._blocks(new_keys, new_sizes)
        # shifted left rows that keep their block: shifts of whole blocks
        shifted = RowSetShiftData()
        mo, mn = _EMPTY, _EMPTY
        if lc.shift_old.size:
            keep = ~np.isin(lc.shift_new, redo)
            so, sn = lc.shift_old[keep], lc.shift_new[keep]
            sizes = self.rside.counts(self.lside.group_of.get(sn))
            mo, mn = self._blocks(so, sizes), self._blocks(sn, sizes)
            sh = lup.shifted if lup is not None else RowSetShiftData()
            mask = (1 << self.bits) - 1
            top = self.base + (1 << (_KEY_BITS - self.bits)) - 1
            st, en = np.clip(sh.starts, self.base, top), np.clip(sh.ends, self.base, top)
            ok = st <= en
            shifted = RowSetShiftData((st[ok] - self.base) << self.bits, ((en[ok] - self.base) << self.bits) | mask,
                                      sh.deltas[ok] << self.bits)
        self._moves = (mo, mn) if mo.size else None
        mod_keys = _EMPTY
        cols: set[str] = set()
        if lup is not None and not lup.modified.is_empty():
            lm = lup.modified.keys()
            lm = lm[~np.isin(lm, redo)]
            if lm.size:
                mod_keys = self._blocks(lm, self.rside.counts(self.lside.group_of.get(lm)))
                cols = set(lup.modified_columns)
        if gone.size == 0 and come.size == 0 and mod_keys.size == 0 and mo.size == 0:
            return None
        self._commit(gone, _EMPTY)
        if mo.size:
            self._commit(mo, mn)
        self._commit(_EMPTY, come)
        mod = RowSet.from_keys(np.sort(mod_keys))
        return TableUpdate(added=RowSet.from_keys(np.sort(come)), removed=RowSet.from_keys(np.sort(gone)),
                           shifted=shifted, modified=mod,
                           modified_columns=ModifiedColumnSet([c for c in self.schema.names if c in cols]
                                                              if not mod.is_empty() else ()))

    def _relayout(self) -> TableUpdate:
        """Every row out and in again under a new layout (a group outgrew its bits)."""
        gone = _bm_keys(self._bm)
        self._layout()
        come = self._all_rows()
        self._moves = None
        self._commit(gone, _EMPTY)
        self._commit(_EMPTY, come)
        return TableUpdate(added=RowSet.from_keys(np.sort(come)), removed=RowSet.from_keys(gone))

    def end_cycle(self) -> None:
        _Op.end_cycle(self)
        self._lup = None

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """Previous values of this cycle's modified rows: rows of left rows modified in place,
        whose right rows did not change."""
        k = self._prev_keys(keys)
        names = column_names(self.schema, columns)
        now = self.gather(names, k)
        lnames = [n for n in names if n in self.left_names]
        lup = self._lup
        if k.size == 0 or not lnames or lup is None or lup.modified.is_empty():
            return now
        prev = self.left.prev_gather(lnames, self.left_key(k))
        cols = dict(zip(names, now.columns))
        cols.update(zip(lnames, prev.columns))
        return pa.Table.from_arrays([cols[n] for n in names], schema=now.schema)


def _cross_join(graph: "UpdateGraph", name: str, left: Table, right: Table, on: Sequence[tuple[str, str]] = (),
                joins: Optional[Sequence[tuple[str, str]]] = None, reserve_bits: int = 10) -> Table:
    return CrossJoinTable(graph, name, left, right, on, joins, reserve_bits)


register_operation("cross_join", _cross_join)
