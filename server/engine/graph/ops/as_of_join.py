"""aj and raj: each left row with the right row of its key whose stamp is the closest at or before
(aj) or at or after (raj) its own, incrementally on both sides.

Rules, written as Deephaven writes them (left stamp OP right stamp): `>=` (aj: the right row with
the greatest stamp not after the left row's; among equal stamps the last row), `>` (aj, strictly
before), `<=` (raj: the least stamp not before; among equal stamps the first row), `<` (raj,
strictly after). Stamps order null first and NaN last, -0.0 equal to 0.0; an Instant stamp may
meet a long one (epoch nanoseconds), as in Deephaven. Exact-match columns (`on`) are matched first,
by key group (`KeySpace`), as in the other joins.

The result has the left table's rows, row keys and shifts. Each left row keeps the right row it
matched as a *slot* of the join's copy of the added right columns (`KeyMap` left row key -> slot),
so that a right row's removal or change keeps its old values readable for the cycle's previous
values. What a cycle recomputes: the left rows it added or whose key or stamp changed, and every
left row of each key group in which the right table added, removed or changed a row (found through
the left side's members). A match is found for many rows at once: the stamps of the rows and of
the right rows of their groups are ranked together, and each left row is searched for among its
group's right rows sorted by (group, rank, row key).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import distinct_sorted, group_extremes, unique
from tickwire.server.engine.graph.column_store import ColumnStore, check_hashable, equal_mask
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.join_keys import (
    JoinSide,
    KeySpace,
    check_keys,
    group_range,
    java_type,
    unknown_columns,
)
from tickwire.server.engine.graph.ops.natural_join import LeftRowsJoin, _JoinStore, right_columns, take_two
from tickwire.server.engine.graph.order import check_sortable
from tickwire.server.engine.graph.table_update import TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["AsOfJoinTable", "RULES"]

RULES = (">=", ">", "<=", "<")


def _kind(t: pa.DataType) -> str:
    return "instant" if pa.types.is_timestamp(t) else "long" if t == pa.int64() else str(t)


def _ranks(values: pa.Array) -> np.ndarray:
    """Dense ranks of values in stamp order: null first, NaN last (equal values, equal ranks)."""
    if len(values) == 0:
        empty: np.ndarray = _EMPTY.copy()
        return empty
    if pa.types.is_floating(values.type):  # Arrow sorts NaN with the nulls: ranked here instead
        valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        v = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64) + 0.0
        cls = np.where(~valid, 0, np.where(np.isnan(v), 2, 1))
        v = np.where(cls == 1, v, 0.0)
        order = np.lexsort((v, cls))
        sc, sv = cls[order], v[order]
        step = np.ones(order.size, dtype=np.int64)
        step[1:] = (sc[1:] != sc[:-1]) | (sv[1:] != sv[:-1])
        ranks = np.empty(order.size, dtype=np.int64)
        ranks[order] = np.cumsum(step)
        out: np.ndarray = ranks
        return out
    if pa.types.is_boolean(values.type):
        values = values.cast(pa.int8())
    order = pc.array_sort_indices(values, order="ascending", null_placement="at_start").to_numpy()
    sv = values.take(pa.array(order))
    valid = np.asarray(sv.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    step = np.ones(order.size, dtype=np.int64)
    if order.size > 1:
        differs = np.asarray(pc.not_equal(sv.slice(1), sv.slice(0, order.size - 1)).fill_null(True)
                             .to_numpy(zero_copy_only=False), dtype=bool)
        step[1:] = differs & (valid[1:] | valid[:-1])
    ranks = np.empty(order.size, dtype=np.int64)
    ranks[order] = np.cumsum(step)
    return ranks


_SIGN = np.uint64(1 << 63)
_U64_TOP = np.uint64(0xFFFFFFFFFFFFFFFF)


def _order_keys(values: pa.Array) -> Optional[np.ndarray]:
    """Unsigned keys in the stamps' order (-0.0 as 0.0, NaN last) for integer, Instant and float
    stamps without nulls (their stamp words); None for other types or when a null is present
    (ranked by `_ranks`)."""
    if values.null_count or not _words_type(values.type):
        return None
    return _stamp_words(values)


def _words_type(t: pa.DataType) -> bool:
    """Stamps of this type have order words (`_stamp_words`)."""
    return bool(pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_floating(t))


def _stamp_words(values: pa.Array) -> np.ndarray:
    """Stamps (integer, Instant or float) as uint64 words in their order: null lowest, NaN
    highest, -0.0 as 0.0, an Instant as its epoch nanoseconds; equal stamps have equal words, and a
    null shares the word of the lowest value (the words bound the stamps, `_order_keys` ranks them)."""
    t = values.type
    if pa.types.is_timestamp(t):
        values = values.cast(pa.int64())
    valid = values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else None
    if pa.types.is_floating(t):
        v = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64) + 0.0
        v[np.isnan(v)] = np.nan
        bits = v.view(np.uint64)
        words = np.where(bits & _SIGN, ~bits, bits | _SIGN)
    elif pa.types.is_unsigned_integer(t):
        words = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.uint64)
    else:
        words = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64).view(np.uint64) ^ _SIGN
    if valid is not None:
        words[~np.asarray(valid, dtype=bool)] = 0
    out: np.ndarray = words
    return out


def _joint_ranks(left: pa.Array, right: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Ranks of the left and right stamps in one order (equal stamps, equal ranks). With order
    keys only the right stamps are sorted (a cycle rematches many left rows against the few
    right rows of their groups): right stamps rank 2, 4, ... by their distinct values, a left
    stamp equal to one takes its rank and one between two takes the odd rank between them."""
    lk = _order_keys(left)
    rk = _order_keys(right) if lk is not None else None
    if lk is None or rk is None:
        ranks = _ranks(pa.concat_arrays([left, right]))
        return ranks[:len(left)], ranks[len(left):]
    return _key_ranks(lk, rk)


def _key_ranks(lk: np.ndarray, rk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`_joint_ranks` of stamps given as order keys."""
    u = np.unique(rk)
    rrank = 2 * (np.searchsorted(u, rk) + 1)
    i = np.searchsorted(u, lk)
    eq = u[np.minimum(i, u.size - 1)] == lk if u.size else np.zeros(lk.size, dtype=bool)
    lrank = 2 * i + 1 + eq
    return lrank.astype(np.int64), rrank.astype(np.int64)


class AsOfJoinTable(LeftRowsJoin):
    """`left` with the columns `joins` of the `right` row of its `on` key whose stamp (`stamp`:
    (left column, right column)) is the closest one allowed by `rule` (see the module docstring)."""

    def __init__(self, graph: "UpdateGraph", name: str, left: Table, right: Table,
                 on: Sequence[tuple[str, str]], stamp: tuple[str, str], rule: str = ">=",
                 joins: Optional[Sequence[tuple[str, str]]] = None):
        if rule not in RULES:
            raise OperationError(f"table {name!r}: unknown as-of rule {rule!r} (one of {', '.join(RULES)})")
        on = [(str(a), str(b)) for a, b in on]
        check_keys(name, left, right, on)
        ls, rs = str(stamp[0]), str(stamp[1])
        if ls not in left.schema.names:
            raise unknown_columns(left, [ls])
        if rs not in right.schema.names:
            raise unknown_columns(right, [rs])
        lt, rt = left.schema.field(ls).type, right.schema.field(rs).type
        self._epoch = lt != rt  # an Instant stamp against a long one: compared as epoch nanoseconds
        if lt != rt and not ({_kind(lt), _kind(rt)} == {"instant", "long"}):
            what = "aj" if rule in (">=", ">") else "raj"
            raise OperationError(f"Can not {what}() with different stamp types: left={java_type(lt)}, "
                                 f"right={java_type(rt)}")
        if not check_sortable(lt) or not check_hashable(lt):
            raise OperationError(f"table {name!r}: stamp column {ls!r} has type {lt}, which cannot be ordered")
        self.on, self.stamp, self.rule = on, (ls, rs), rule
        # as Deephaven: right match columns named unlike their left ones (exact-match columns, then
        # the stamp) come first under their own names, unless the added columns rename them
        base = right_columns(name, left, right, on + [(ls, ls)], joins)
        sources = {c for _n, c in base}
        matched = [b for a, b in on if a != b] + ([rs] if rs != ls else [])
        front = [c for c in dict.fromkeys(matched) if (c, c) in base or c not in sources]
        clash = [c for c in front if c in left.schema.names]
        if clash:
            raise OperationError(f"Conflicting column names [{', '.join(clash)}]")
        self.joins = [(c, c) for c in front] + [(n, c) for n, c in base if not (n == c and c in front)]
        self.left, self.right = left, right
        self.left_names = set(left.schema.names)
        rfields = [right.schema.field(c).with_name(n) for n, c in self.joins]
        self.space = KeySpace([left.schema.field(a).type for a, _b in on], reuse=True)
        # with stamps that have order words, the left side's members are ordered by stamp within
        # a group and each right slot keeps its row's stamp word (`_slot_words`), so that a
        # right-side change rematches only the left rows between the stamps it changed and the
        # next unchanged right stamp (`_stamp_bounds`)
        self._ordered = _words_type(lt) and _words_type(rt)
        self.lside = JoinSide(self.space, left, [a for a, _b in on],
                              order=(ls, _stamp_words) if self._ordered else None)
        self.rside = JoinSide(self.space, right, [b for _a, b in on])
        self.values = ColumnStore(pa.schema(rfields))  # right slot -> the right row's added columns
        self.match = KeyMap()                           # left row key -> right slot (-1: none)
        self._slot_of = KeyMap()                        # right row key -> slot
        self._free = _EMPTY.copy()
        self._dying = _EMPTY.copy()                     # slots of removed right rows, freed after the cycle
        self._nslots = 0
        self._slot_words = np.zeros(0, dtype=np.uint64)  # right slot -> its row's stamp word (when ordered)
        self._lup: Optional[TableUpdate] = None
        # previous values: (rows whose match changed, their old slots, slots rewritten, their old values)
        self._pinfo: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, pa.Table]] = None
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, left, pa.schema(list(left.schema) + rfields), others=[right])
            self.store = _JoinStore(self)
            self.attributes = {k: v for k, v in left.attributes.items() if k in ("AddOnly", "AppendOnly")}
            radd = right.rowset.keys()
            self.rside.follow(TableUpdate(added=right.rowset))
            self._new_right(radd)
            lc = self.lside.follow(TableUpdate(added=left.rowset))
            self._rematch(lc.added, lc.added_groups)
            self._update = None

    def right_values(self, keys: np.ndarray, names: Sequence[str]) -> pa.Table:
        return self.slot_values(self.match.get(keys), names)

    # -- right slots ------------------------------------------------------------------------------
    def slot_values(self, slots: np.ndarray, names: Sequence[str]) -> pa.Table:
        """The added columns `names` of right slots (nulls for -1)."""
        have = slots >= 0
        got = self.values.gather(slots[have], names)
        if have.all():
            return got
        idx = np.full(slots.size, -1, dtype=np.int64)
        idx[have] = np.arange(int(have.sum()), dtype=np.int64)
        take = pa.array(idx, mask=idx < 0)
        return pa.Table.from_arrays([c.combine_chunks().take(take) for c in got.columns], schema=got.schema)

    def _new_right(self, keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        take = min(keys.size, self._free.size)
        slots = np.concatenate((self._free[self._free.size - take:],
                                np.arange(self._nslots, self._nslots + keys.size - take, dtype=np.int64)))
        self._free = self._free[:self._free.size - take]
        self._nslots += keys.size - take
        self.values.ensure(self._nslots)
        self.values.write(slots, self._right_values(keys))
        self._slot_of.set(keys, slots)
        self._stamp_slots(slots, keys)

    def _stamp_slots(self, slots: np.ndarray, keys: np.ndarray) -> None:
        """Keeps the stamp words of right rows `keys` at their slots (when ordered)."""
        if not self._ordered or slots.size == 0:
            return
        if self._slot_words.size < self._nslots:
            grown = np.zeros(max(self._nslots, 2 * self._slot_words.size, 1024), dtype=np.uint64)
            grown[:self._slot_words.size] = self._slot_words
            self._slot_words = grown
        self._slot_words[slots] = _stamp_words(self.right.gather([self.stamp[1]], keys).column(0).combine_chunks())

    def _right_values(self, keys: np.ndarray) -> pa.Table:
        got = self.right.gather([c for _n, c in self.joins], keys)
        return pa.Table.from_arrays(got.columns, schema=self.values.schema)

    # -- matching ---------------------------------------------------------------------------------
    def _rematch(self, keys: np.ndarray, groups: np.ndarray, G: Optional[np.ndarray] = None,
                 right_rows: Optional[tuple[np.ndarray, np.ndarray, np.ndarray]] = None,
                 words: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
        """Finds the match of left rows `keys` (distinct; groups `groups`, which are among `G`,
        sorted and distinct, when given, whose right rows (group, row key, stamp word) are
        `right_rows` when given; `words`: the left rows' stamp words, when known); returns their
        old and new slots. Only rows whose match changed are written."""
        old = self.match.get(keys)
        if keys.size == 0:
            return old, old
        if G is None:
            G = unique(groups)
        rw: Optional[np.ndarray] = None
        if right_rows is not None:
            rg, rk, rw = right_rows
        else:
            rg, rk = self.rside.rows_of(G)
        new = np.full(keys.size, -1, dtype=np.int64)
        if rk.size:
            if words is not None and rw is not None and words.all() and rw.all():
                # stamp words without a zero (null, or the lowest value) are the stamps' order keys
                lrank, rrank = _key_ranks(words, rw)
            else:
                ls, rs = self.stamp
                lstamp = self.left.gather([ls], keys).column(0).combine_chunks()
                rstamp = self.right.gather([rs], rk).column(0).combine_chunks()
                if self._epoch:
                    lstamp, rstamp = lstamp.cast(pa.int64()), rstamp.cast(pa.int64())
                lrank, rrank = _joint_ranks(lstamp, rstamp)
            width = int(max(lrank.max(), rrank.max())) + 2
            order = np.lexsort((rk, rrank, rg))
            rg_sorted = rg[order]
            rcomp = rg_sorted * width + rrank[order]
            lcomp = groups * width + lrank
            pos = np.searchsorted(rcomp, lcomp, side="right" if self.rule in (">=", "<") else "left")
            if self.rule in (">=", ">"):
                pos = pos - 1
            ok = (pos >= 0) & (pos < rcomp.size)
            ok[ok] = rg_sorted[pos[ok]] == groups[ok]
            slots = self._slot_of.get(rk[order])  # once per right row, however many left rows match it
            new[ok] = slots[pos[ok]]
        diff = new != old
        self.match.set(keys[diff], new[diff])
        return old, new

    def _stamp_bounds(self, groups: np.ndarray, words: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Given the (group, stamp word) of every right row a cycle added, removed or changed:
        the groups, sorted and distinct; for each the range [lo, hi] of stamp words outside which
        no left row's match can have changed; and the right rows of the groups (group, row key,
        stamp word).
        For aj the range runs from the least changed stamp to the first unchanged right stamp
        after the greatest (a left row at or past it matches that row or a later one, as before);
        for raj it is the mirror image."""
        G, least, greatest, _n = group_extremes(groups, words)
        rg, rk = self.rside.rows_of(G)
        which = np.searchsorted(G, rg)
        rw = self._slot_words[self._slot_of.get(rk)]
        if self.rule in (">=", ">"):
            hi = np.full(G.size, _U64_TOP)
            past = np.flatnonzero(rw > greatest[which])
            if past.size:   # the least stamp past the greatest changed one, per group
                at, nearest, _g, _n = group_extremes(which[past], rw[past])
                hi[at] = nearest
            return G, least, hi, (rg, rk, rw)
        lo = np.zeros(G.size, dtype=np.uint64)
        ahead = np.flatnonzero(rw < least[which])
        if ahead.size:   # the greatest stamp before the least changed one, per group
            at, _l, nearest, _n = group_extremes(which[ahead], rw[ahead])
            lo[at] = nearest
        return G, lo, greatest, (rg, rk, rw)

    # -- the cycle ------------------------------------------------------------------------------
    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        self.space.begin_cycle()
        lup = updates.get(self.left.name)
        rup = updates.get(self.right.name)
        self._lup = lup
        redo_k: list[np.ndarray] = []   # left rows to match again
        redo_g: list[np.ndarray] = []
        mods: list[np.ndarray] = []
        cols: set[str] = set()
        rnames = [n for n, _c in self.joins]
        if lup is not None:
            lc = self.lside.follow(lup)
            rem = lup.removed.keys()
            if rem.size:
                self.match.delete(rem)
            if lc.shift_old.size:
                self.match.remap(lc.shift_old, lc.shift_new)
            self.match.set(lc.added, np.full(lc.added.size, -1, dtype=np.int64))
            redo_k.append(lc.added)
            redo_g.append(lc.added_groups)
            if not lup.modified.is_empty():
                mk = lup.modified.keys()
                mods.append(mk)
                cols |= set(lup.modified_columns)
                if {self.stamp[0], *(a for a, _b in self.on)} & lup.modified_columns:
                    redo_k.append(mk)
                    redo_g.append(self.lside.group_of.get(mk))
            self._moves = (lc.shift_old, lc.shift_new) if lc.shift_old.size else None
        rewritten, old_vals = _EMPTY, self.values.gather(_EMPTY)
        right_rows = None
        left_words = None
        if rup is not None:
            rem = rup.removed.keys()
            mk = rup.modified.keys()
            stamp_moved = bool(mk.size) and bool({self.stamp[1], *(b for _a, b in self.on)} & rup.modified_columns)
            value_cols = {c for _n, c in self.joins} & rup.modified_columns if mk.size else set()
            # the right rows that changed, by (group, stamp word): removed ones read before they go
            ranged = self._ordered and not stamp_moved
            changed_g: list[np.ndarray] = []
            changed_w: list[np.ndarray] = []
            if ranged and rem.size:
                changed_g.append(self.rside.group_of.get(rem))
                changed_w.append(self._slot_words[self._slot_of.get(rem)])
            rc = self.rside.follow(rup)
            touched = [rc.touched]
            if rem.size:
                self._dying = np.concatenate((self._dying, self._slot_of.get(rem)))
                self._slot_of.delete(rem)
            if rc.shift_old.size:
                self._slot_of.remap(rc.shift_old, rc.shift_new)
            if mk.size:
                if stamp_moved or value_cols:
                    touched.append(self.rside.group_of.get(mk))
                    if ranged:
                        changed_g.append(touched[-1])
                        changed_w.append(self._slot_words[self._slot_of.get(mk)])
                    elif self._ordered:   # a stamp or key that moved: the slots keep the new stamps
                        self._stamp_slots(self._slot_of.get(mk), mk)
                if value_cols:
                    slots = self._slot_of.get(mk)
                    new_vals = self._right_values(mk)
                    before = self.values.gather(slots)
                    same = np.ones(mk.size, dtype=bool)
                    for i in range(new_vals.num_columns):
                        same &= equal_mask(before.column(i).combine_chunks(), new_vals.column(i).combine_chunks())
                    if not same.all():
                        ch = ~same
                        rewritten = slots[ch]
                        old_vals = before.filter(pa.array(ch))
                        self.values.write(rewritten, new_vals.filter(pa.array(ch)))
            self._new_right(rup.added.keys())
            if ranged:
                if rc.added.size:
                    changed_g.append(rc.added_groups)
                    changed_w.append(self._slot_words[self._slot_of.get(rc.added)])
                if changed_g:
                    G, lo, hi, right_rows = self._stamp_bounds(np.concatenate(changed_g), np.concatenate(changed_w))
                    assert self.lside.members is not None
                    g, k, left_words = group_range(self.lside.members, G, lo, hi, self.lside.hints)
                    redo_k.append(k)
                    redo_g.append(g)
            else:
                G = unique(np.concatenate(touched))
                if G.size:
                    g, k = self.lside.rows_of(G)
                    redo_k.append(k)
                    redo_g.append(g)
        moved_k, moved_from = _EMPTY, _EMPTY
        if redo_k:
            if len(redo_k) == 1 and lup is None:
                # the rows of the groups the right side changed, alone: distinct, ordered by group
                k_u, g = redo_k[0], redo_g[0]
                if right_rows is not None:   # the right rows of every group the change touched
                    old, new = self._rematch(k_u, g, G, right_rows, left_words)
                else:
                    old, new = self._rematch(k_u, g, distinct_sorted(g))
            else:
                k_all = np.concatenate(redo_k)
                g_all = np.concatenate(redo_g)
                k_u, first = np.unique(k_all, return_index=True)
                old, new = self._rematch(k_u, g_all[first])
            changed = old != new
            if rewritten.size:
                changed |= np.isin(new, rewritten)
            if lup is not None and not lup.added.is_empty():
                changed &= ~lup.added.contains(k_u)
            if changed.any():
                mods.append(k_u[changed])
                cols |= set(rnames)
            swap = old != new
            if lup is not None and not lup.added.is_empty():
                swap &= ~lup.added.contains(k_u)
            moved_k, moved_from = k_u[swap], old[swap]
        self._pinfo = (moved_k, moved_from, np.sort(rewritten), old_vals.take(pa.array(np.argsort(rewritten))))
        return self._left_update(lup, mods, cols)

    def end_cycle(self) -> None:
        LeftRowsJoin.end_cycle(self)
        if self._dying.size:
            self._free = np.concatenate((self._free, self._dying))
            self._dying = _EMPTY.copy()

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """Previous values of this cycle's modified rows: the left table's previous values, and
        the right values of the slot each row matched before the cycle, as they were."""
        k = self._prev_keys(keys)
        names = column_names(self.schema, columns)
        now = self.gather(names, k)
        if k.size == 0:
            return now
        cols = dict(zip(names, now.columns))
        self._left_prev(names, k, cols)
        rnames = [n for n in names if n not in self.left_names]
        if rnames and self._pinfo is not None:
            moved, moved_from, rewritten, old = self._pinfo
            slots = self.match.get(k)
            if moved.size:
                order = np.argsort(moved)
                ms, mf = moved[order], moved_from[order]
                i = np.minimum(np.searchsorted(ms, k), ms.size - 1)
                hit = ms[i] == k
                slots = np.where(hit, mf[i], slots)
            vals = self.slot_values(slots, rnames)
            if rewritten.size:
                j = np.minimum(np.searchsorted(rewritten, slots), rewritten.size - 1)
                hit = (rewritten[j] == slots) & (slots >= 0)
                vals = take_two(vals, old.select(rnames), hit, j[hit])
            cols.update(zip(rnames, vals.columns))
        return pa.Table.from_arrays([cols[n] for n in names], schema=pa.schema([self.schema.field(n) for n in names]))


def _as_of_join(graph: "UpdateGraph", name: str, left: Table, right: Table, on: Sequence[tuple[str, str]],
                stamp: tuple[str, str], rule: str = ">=", joins: Optional[Sequence[tuple[str, str]]] = None) -> Table:
    return AsOfJoinTable(graph, name, left, right, on, stamp, rule, joins)


register_operation("as_of_join", _as_of_join)
