"""What the joins share: one space of key groups for all their inputs, and each input's rows by group.

A join matches rows of several tables on key columns (`on` pairs, possibly named differently on
each side, of one type). `KeySpace` gives every distinct key tuple a group id the first time any
input shows it (hashed in bulk, `groups_of`), so a group's state (a right row, counts) lives in
numpy arrays indexed by group. With `reuse`, a group that no input has rows of any more gives its
id back once many have (`GroupIds`: from a later cycle, `begin_cycle`), so a join over keys that
come and go (orders by id) holds state for its live keys, not for every key it has seen; the
owner's per-group state must be what a new group's is whenever every side is empty (the owner
resets the rest in `on_new`). `JoinSide` follows one input's updates: each
row's group (a `KeyMap` from row key to group), the number of rows per group and, when asked for,
the rows of each group in row-key order (an `OrderIndex` of (group + 1, row key)), so that a
change to one side finds the other side's rows of the groups it touched without reading the table.
With `order` (a column and its encoding as uint64 words in its order), the members are ordered
by (group + 1, word, row key) instead, so that the rows of a group whose value of that column lies
in a range are found without reading the others (an as-of join's stamps, `group_range`).

This module reads its input tables only through `gather` and the updates it is given; it keeps no
row values of its own.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.protocol.schema import deephaven_type_for
from tickwire.server.engine.errors import OperationError, UnknownColumnError
from tickwire.server.engine.graph.arrays import group_extremes, unique
from tickwire.server.engine.graph.column_store import ColumnStore, check_hashable, groups_of
from tickwire.server.engine.graph.group_ids import GroupIds
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import _EMPTY, shifted_rows
from tickwire.server.engine.graph.order import MEMBERS_BUDGET, NONE_HI, NONE_LO, OrderIndex
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.graph.tables import Table

__all__ = ["KeySpace", "JoinSide", "SideChange", "check_keys", "epoch_pair", "unknown_columns", "java_type",
           "group_members", "group_edges", "group_range", "GroupHints"]

_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)


def unknown_columns(table: Table, names: Sequence[str]) -> UnknownColumnError:
    """Deephaven's words for columns a table does not have."""
    return UnknownColumnError(f"Unknown column names [{', '.join(names)}], available column names are "
                              f"[{', '.join(table.schema.names)}]")


def java_type(t: pa.DataType) -> str:
    """A column type as Deephaven prints a join's key types: primitives by name, others as classes."""
    try:
        name = deephaven_type_for(t)
    except Exception:  # noqa: BLE001 - a type Deephaven has no name for prints as Arrow's
        return str(t)
    if name == "java.lang.Boolean":
        return "boolean"
    return f"class {name}" if "." in name else name


def epoch_pair(a: pa.DataType, b: pa.DataType) -> bool:
    """An Instant against a long: Deephaven compares them as epoch nanoseconds in some joins."""
    return bool((pa.types.is_timestamp(a) and b == pa.int64()) or (pa.types.is_timestamp(b) and a == pa.int64()))


def check_keys(name: str, left: Table, right: Table, on: Sequence[tuple[str, str]], epoch: bool = False) -> None:
    """The key pairs exist on both sides with one type each (`epoch`: or an Instant and a long),
    and can be hashed."""
    missing = [lc for lc, _rc in on if lc not in left.schema.names]
    if missing:
        raise unknown_columns(left, missing)
    missing = [rc for _lc, rc in on if rc not in right.schema.names]
    if missing:
        raise unknown_columns(right, missing)
    for lc, rc in on:
        lt, rt = left.schema.field(lc).type, right.schema.field(rc).type
        if lt != rt and not (epoch and epoch_pair(lt, rt)):
            raise OperationError(f"Mismatched join types, {lc}={rc}: {java_type(lt)} != {java_type(rt)}")
        if not check_hashable(lt):
            raise OperationError(f"table {name!r}: key column {lc!r} has type {lt}, which cannot be a key")


class KeySpace:
    """Group ids of the distinct key tuples of a join's inputs (see the module docstring). With no
    key columns there is one group, 0."""

    def __init__(self, types: Sequence[pa.DataType], reuse: bool = False):
        self.names = [f"__k{i}" for i in range(len(types))]
        self.schema = pa.schema([pa.field(n, t) for n, t in zip(self.names, types)])
        self.index = KeyIndex()
        self.store = ColumnStore(self.schema)
        self.n = 0 if types else 1   # every group id is below this
        # called with the ids of groups just made (their key values already stored)
        self.on_new: list[Callable[[np.ndarray], None]] = []
        self.sides: list["JoinSide"] = []
        self.ids: Optional[GroupIds] = GroupIds(self.index, self.store, self.names) if reuse and types else None

    def emptied(self, groups: np.ndarray) -> None:
        """Groups one side has just lost its last row of (the others may have rows)."""
        if self.ids is not None and groups.size:
            self.ids.emptied(groups)

    def begin_cycle(self) -> None:
        """Before the cycle's first group is made: groups that have had no rows on any side since
        an earlier cycle give their ids back, once there are many."""
        if self.ids is not None:
            self.ids.release(self._empty_everywhere)

    def _empty_everywhere(self, groups: np.ndarray) -> np.ndarray:
        empty = np.ones(groups.size, dtype=bool)
        for side in self.sides:
            empty &= side.counts(groups) == 0
        return empty

    def groups(self, values: pa.Table) -> np.ndarray:
        """The group of each row of `values` (the key columns, in key order, any names)."""
        if not self.names:
            return np.zeros(values.num_rows, dtype=np.int64)
        vals = pa.Table.from_arrays([c.combine_chunks() for c in values.columns], schema=self.schema)

        def make(kv: pa.Table) -> np.ndarray:
            if self.ids is not None:
                new = self.ids.take(kv.num_rows)
                self.n = self.ids.made
            else:
                new = np.arange(self.n, self.n + kv.num_rows, dtype=np.int64)
                self.n += kv.num_rows
            self.store.ensure(self.n)
            self.store.write(new, kv)
            for fn in self.on_new:
                fn(new)
            return new
        gids: np.ndarray = groups_of(self.index, self.store, self.names, vals, make)
        return gids

    def key_values(self, groups: np.ndarray) -> pa.Table:
        return self.store.gather(np.asarray(groups, dtype=np.int64))

    def describe(self, group: int) -> str:
        """A group's key values as text (for error messages)."""
        if not self.names:
            return "[]"
        row = self.key_values(np.array([group])).to_pylist()[0]
        vals = [_java_text(row[n]) for n in self.names]
        return vals[0] if len(vals) == 1 else "[" + ", ".join(vals) + "]"


def _java_text(v: object) -> str:
    """A key value as Java's toString prints it (what Deephaven's messages show)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if v != v:
            return "NaN"
        if v in (float("inf"), float("-inf")):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    return str(v)


class SideChange:
    """What one cycle did to one input, by group: rows removed (pre-shift keys), added, and
    modified so that they changed group (post-shift keys, old and new group); `touched` is every
    group that gained or lost a row."""

    __slots__ = ("removed", "removed_groups", "added", "added_groups", "moved", "moved_from", "moved_to",
                 "shift_old", "shift_new", "touched")

    def __init__(self) -> None:
        self.removed = self.removed_groups = self.added = self.added_groups = _EMPTY
        self.moved = self.moved_from = self.moved_to = _EMPTY
        self.shift_old = self.shift_new = _EMPTY
        self.touched = _EMPTY

    def counts_before(self, side: "JoinSide", groups: np.ndarray) -> np.ndarray:
        """How many rows `side` had in each of `groups` (sorted, distinct) before this change."""
        before: np.ndarray = side.counts(groups).copy()
        if groups.size == 0:
            return before
        for g, sign in ((self.added_groups, -1), (self.moved_to, -1), (self.removed_groups, 1), (self.moved_from, 1)):
            if g.size:
                i = np.searchsorted(groups, g)
                hit = (i < groups.size)
                hit[hit] = groups[i[hit]] == g[hit]
                np.add.at(before, i[hit], sign)
        return before

    def arrived(self) -> tuple[np.ndarray, np.ndarray]:
        """(row keys, groups) of the rows that are in a group they were not in before the cycle."""
        return np.concatenate((self.added, self.moved)), np.concatenate((self.added_groups, self.moved_to))


class JoinSide:
    """One input of a join, by key group: each row's group, rows per group and (with `members`)
    the rows of each group in row-key order, or with `order` ((column, encoder of its values as
    uint64 words in its order)) in (word, row key) order."""

    def __init__(self, space: KeySpace, table: Table, keys: Sequence[str], members: bool = True,
                 order: Optional[tuple[str, Callable[[pa.Array], np.ndarray]]] = None):
        self.space = space
        self.table = table
        self.keys = list(keys)
        self.order = order if members else None
        self.group_of = KeyMap()
        self.count = np.zeros(max(1024, space.n), dtype=np.int64)
        nwords = 3 if self.order is not None else 2
        self.members: Optional[OrderIndex] = (OrderIndex(nwords, budget=MEMBERS_BUDGET, members=True)
                                              if members else None)
        # the members keys of each group's first and last row, as last known (-1: not known),
        # checked before use (`GroupHints`)
        self.hints = GroupHints(self.members, self.count.size) if self.members is not None else None
        space.sides.append(self)

    def _grow(self) -> None:
        n = self.space.n
        if n <= self.count.size:
            return
        size = self.count.size
        while size < n:
            size *= 2
        grown = np.zeros(size, dtype=np.int64)
        grown[:self.count.size] = self.count
        self.count = grown
        if self.hints is not None:
            self.hints.grow(size)

    def counts(self, groups: np.ndarray) -> np.ndarray:
        self._grow()
        out: np.ndarray = self.count[groups]
        return out

    def groups_of_rows(self, keys: np.ndarray) -> np.ndarray:
        """The current group of each row (-1 for a row the side does not have)."""
        return self.group_of.get(keys)

    def _groups_and_words(self, keys: np.ndarray, words: bool) -> tuple[np.ndarray, np.ndarray]:
        """The group of each row and (`words`, with `order`) its order word, read in one gather."""
        names = list(self.keys)
        if words and self.order is not None:
            names.append(self.order[0])
        if not names:
            return np.zeros(keys.size, dtype=np.int64), _EMPTY
        vals = self.table.gather(names, keys)
        w = _EMPTY
        if words and self.order is not None:
            w = self.order[1](vals.column(len(self.keys)).combine_chunks())
        if not self.keys:
            return np.zeros(keys.size, dtype=np.int64), w
        vals = vals.select(list(range(len(self.keys))))
        if any(f.type != t for f, t in zip(vals.schema, self.space.schema.types)):  # an Instant as a long
            vals = pa.Table.from_arrays([c.cast(t) for c, t in zip(vals.columns, self.space.schema.types)],
                                        names=vals.column_names)
        g = self.space.groups(vals)
        self._grow()
        return g, w

    def _member_words(self, groups: np.ndarray, keys: np.ndarray, words: np.ndarray) -> list[np.ndarray]:
        """The members index's words of rows (group, order word when ordered, row key)."""
        head = [(groups + 1).astype(np.uint64)]
        if self.order is not None:
            head.append(words.astype(np.uint64))
        return head + [keys.astype(np.uint64)]

    def order_words(self, keys: np.ndarray) -> np.ndarray:
        """The order word of each of these rows as the members index holds it (with `order`)."""
        assert self.members is not None and self.order is not None
        return self.members.words_at(self.members.key_of(keys))[1].astype(np.uint64)

    def follow(self, up: TableUpdate, before: Optional[Callable[[np.ndarray, np.ndarray], np.ndarray]] = None
               ) -> SideChange:
        """Follows one update of the input. `before(groups, keys)`, when given: the members key of
        the element just before each added row (-1 where unknown), to spare the index's search."""
        ch = SideChange()
        touched = []
        # (members words, groups) of rows to put in the index, in one insert at the end (one search
        # of the index for all); `hint`: the key of the element before each added row (-1: unknown)
        put: list[tuple[list[np.ndarray], np.ndarray]] = []
        hint: Optional[np.ndarray] = None
        rem = up.removed.keys()
        if rem.size:
            g = self.group_of.get(rem)
            if np.any(g < 0):
                raise RuntimeError(f"join input {self.table.name!r} removed rows the join does not have")
            self.group_of.delete(rem)
            np.subtract.at(self.count, g, 1)
            if self.members is not None:
                self.members.delete(self.members.key_of(rem))
            ch.removed, ch.removed_groups = rem, g
            touched.append(g)
        if not up.shifted.is_empty():
            old, new = shifted_rows(self.table, up)
            if old.size:
                self.group_of.remap(old, new)
                if self.members is not None:
                    self.members.set_last_word(self.members.key_of(old), new)
                ch.shift_old, ch.shift_new = old, new
        mod = up.modified.keys()
        regroup = bool(self.keys) and bool(set(self.keys) & up.modified_columns)
        reorder = self.order is not None and self.members is not None and self.order[0] in up.modified_columns
        if mod.size and (regroup or reorder):
            g_old = self.group_of.get(mod)
            if regroup:
                g_new, w_new = self._groups_and_words(mod, reorder)
            else:
                g_new, w_new = g_old, self._groups_and_words(mod, True)[1]
            moved = g_new != g_old
            # rows that take another place among the members: another group, or another word
            replace = moved | (self.order_words(mod) != w_new) if reorder else moved
            if moved.any():
                mk, go, gn = mod[moved], g_old[moved], g_new[moved]
                self.group_of.set(mk, gn)
                np.subtract.at(self.count, go, 1)
                np.add.at(self.count, gn, 1)
                ch.moved, ch.moved_from, ch.moved_to = mk, go, gn
                touched += [go, gn]
            if self.members is not None and replace.any():
                if not reorder:   # the words of a row that keeps its place are read from the index
                    w_new = self.order_words(mod) if self.order is not None else _EMPTY
                rk = mod[replace]
                self.members.delete(self.members.key_of(rk))
                put.append((self._member_words(g_new[replace], rk,
                                               w_new[replace] if self.order is not None else _EMPTY), g_new[replace]))
        add = up.added.keys()
        if add.size:
            g, w = self._groups_and_words(add, True)
            self.group_of.set(add, g)
            np.add.at(self.count, g, 1)
            if self.members is not None:
                hint = before(g, add) if before is not None and self.order is None else None
                put.append((self._member_words(g, add, w), g))
            ch.added, ch.added_groups = add, g
            touched.append(g)
        if put:
            assert self.hints is not None
            words, groups = joined(put)
            if hint is not None:   # the added rows come last
                hint = np.concatenate((np.full(groups.size - hint.size, -1, dtype=np.int64), hint))
            self.hints.insert(words, groups, self.count, before=hint)
        self._grow()
        ch.touched = unique(np.concatenate(touched)) if touched else _EMPTY
        if self.space.ids is not None:
            left = [g for g in (ch.removed_groups, ch.moved_from) if g.size]
            if left:
                g = unique(np.concatenate(left))
                self.space.emptied(g[self.count[g] == 0])
        return ch

    def rows_of(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group, row key) of every row of `groups` (sorted, distinct), ordered by both."""
        assert self.members is not None
        self._grow()   # groups another side has just made
        return group_members(self.members, groups, self.hints)

    def edge(self, groups: np.ndarray, front: bool) -> np.ndarray:
        """The first (front) or last row key of each group (-1 when it has none)."""
        assert self.members is not None
        return group_edges(self.members, groups, front)


def joined(parts: list[tuple[list[np.ndarray], np.ndarray]]) -> tuple[list[np.ndarray], np.ndarray]:
    """(words, groups) of batches of elements (each its words and groups), in order, for one
    insert into a members index: one search of the index for all of them."""
    if len(parts) == 1:
        return parts[0]
    return [np.concatenate(ws) for ws in zip(*(p[0] for p in parts))], np.concatenate([p[1] for p in parts])


def _tops(m: OrderIndex, n: int) -> list[np.ndarray]:
    """The largest value for every word after the first: a query after every element tied with
    it on the first word."""
    return [np.full(n, _U64_MAX) for _ in range(m.K - 1)]


def group_members(m: OrderIndex, groups: np.ndarray, hints: Optional["GroupHints"] = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """In an OrderIndex of (group + 1, ..., row key): (group, row key) of every element of
    `groups` (sorted, distinct), ordered by both. `hints`: the index's GroupHints, which spare
    the searches for the groups' bounds where they hold."""
    groups = np.asarray(groups, dtype=np.int64)
    keys, which = _group_keys(m, groups, hints)
    if keys.size == 0:
        return _EMPTY, _EMPTY
    return groups[which], m.id_at(keys)


def _group_bounds(m: OrderIndex, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Searched for: the key of each group's first and last element, and whether it has any."""
    n = groups.size
    # one search for both ends: the element after group - 1's and the last of the group's
    pred, succ = m.locate([np.concatenate((groups, groups + 1)).astype(np.uint64)] + _tops(m, 2 * n))
    first, last = succ[:n], pred[n:]
    ok = (first != NONE_HI) & (last != NONE_LO) & (first <= last)
    return first, last, ok


def _group_keys(m: OrderIndex, groups: np.ndarray, hints: Optional["GroupHints"] = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """The element keys of `groups` (sorted, distinct) in order, and the index in `groups` of each."""
    if groups.size == 0 or len(m) == 0:
        return _EMPTY, _EMPTY
    if hints is None:
        first, last, ok = _group_bounds(m, groups)
    else:
        first, last, ok = hints.bounds(groups)
        miss = np.flatnonzero(~ok)
        if miss.size:
            f, lst, has = _group_bounds(m, groups[miss])
            hints.found(groups[miss], np.where(has, f, -1), np.where(has, lst, -1))
            first[miss], last[miss], ok[miss] = f, lst, has
    return m.keys_between(np.where(ok, first, 0), np.where(ok, last, -1))


#: slots a check of a group's first-element hint looks back for the element before it, in turn
_HINT_BACK = (16, 256)


class GroupHints:
    """The keys of each group's first and last element in an OrderIndex of (group + 1, ...,
    row key), as last known (-1: not known), so that a group's members are read from a few slots
    instead of two binary searches of the whole index (tens of millions of slots on a large
    table, where each step misses the cache). Kept through inserts (the new elements and the moves
    an insert reports), rebuilt from the index when it is laid out afresh (`OrderIndex.layouts`),
    and checked against the index before use: a hint that does not hold is searched for and set
    again (`found`)."""

    def __init__(self, m: OrderIndex, size: int = 1024):
        self.m = m
        self.first = np.full(size, -1, dtype=np.int64)
        self.last = np.full(size, -1, dtype=np.int64)
        self.layout = m.layouts

    def grow(self, size: int) -> None:
        if size <= self.first.size:
            return
        for name in ("first", "last"):
            grown = np.full(size, -1, dtype=np.int64)
            old = getattr(self, name)
            grown[:old.size] = old
            setattr(self, name, grown)

    def _current(self) -> None:
        """Rebuilt when the index was laid out afresh since (every key changed)."""
        if self.m.layouts == self.layout:
            return
        self.layout = self.m.layouts
        self.first[:] = -1
        self.last[:] = -1
        keys = self.m.keys()
        if keys.size == 0:
            return
        g = self.m.word_at(0, keys).astype(np.int64) - 1
        self.grow(int(g.max()) + 1)
        start = np.ones(g.size, dtype=bool)
        start[1:] = g[1:] != g[:-1]
        end = np.ones(g.size, dtype=bool)
        end[:-1] = start[1:]
        self.first[g[start]] = keys[start]
        self.last[g[end]] = keys[end]

    def insert(self, words: list[np.ndarray], groups: np.ndarray, count: np.ndarray,
               before: Optional[np.ndarray] = None) -> None:
        """Inserts elements of `groups` into the index (`OrderIndex.insert`) and keeps the hints;
        `count`: the groups' element counts, the new ones included."""
        keys, moved_old, moved_new, _brk, _kept = self.m.insert(words, before=before)
        self._inserted(keys, groups, moved_old, moved_new, count)

    def _inserted(self, keys: np.ndarray, groups: np.ndarray, moved_old: np.ndarray, moved_new: np.ndarray,
                  count: np.ndarray) -> None:
        """After an insert of elements (their keys and groups) that moved others (old and new
        keys)."""
        if self.m.layouts != self.layout:
            self._current()
            return
        if moved_old.size:
            gm = self.m.word_at(0, moved_new).astype(np.int64) - 1
            for arr in (self.first, self.last):
                hit = arr[gm] == moved_old
                arr[gm[hit]] = moved_new[hit]
        if keys.size == 0:
            return
        G, lo, hi, lengths = group_extremes(groups, keys)
        fresh = count[G] == lengths   # the group had no element before
        f, last = self.first[G], self.last[G]
        self.first[G] = np.where(fresh, lo, np.where(f >= 0, np.minimum(f, lo), -1))
        self.last[G] = np.where(fresh, hi, np.where(last >= 0, np.maximum(last, hi), -1))

    def found(self, groups: np.ndarray, first: np.ndarray, last: np.ndarray) -> None:
        """The bounds of groups just searched for (-1 for a group without elements)."""
        self.first[groups] = first
        self.last[groups] = last

    def bounds(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The hinted first and last element keys of `groups`, and whether each pair holds: both
        are elements of the group, the slot after the last belongs to another group (an element
        of it, or a free slot, which copies the element after it), and so does the nearest
        element before the first (looked for among a few slots: the free slots before an element
        copy it)."""
        self._current()
        self.grow(int(groups.max()) + 1)
        m = self.m
        f, last = self.first[groups], self.last[groups]
        lo_k, hi_k = m.lo + m.base, m.hi + m.base
        ok = (f >= lo_k) & (last <= hi_k) & (f <= last)
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            return f, last, ok
        W0, src = m.W[0], m.src
        g1 = (groups[idx] + 1).astype(np.uint64)
        fs, ls = f[idx] - m.base, last[idx] - m.base
        good = (src[fs] == f[idx]) & (W0[fs] == g1) & (src[ls] == last[idx]) & (W0[ls] == g1)
        good &= (ls == m.hi) | (W0[np.minimum(ls + 1, m.hi)] != g1)
        before = np.maximum(fs - 1, m.lo)
        first_ok = (fs == m.lo) | (W0[before] != g1)
        # the slot before copies the first (a free slot) or is an element of the group: the
        # nearest element before, among a few slots and then more (after deletes a run of free
        # slots can be long); not found, the hint is searched for
        look = np.flatnonzero(good & ~first_ok)
        for width in _HINT_BACK:
            if look.size == 0:
                break
            back = fs[look][:, None] - np.arange(1, width + 1)[None, :]   # nearest first
            inside = back >= m.lo
            bk = np.maximum(back, m.lo)
            element = inside & (src[bk] == bk + m.base)
            has = element.any(axis=1)
            nearest = bk[np.arange(look.size), element.argmax(axis=1)]
            first_ok[look[has]] = W0[nearest[has]] != g1[look[has]]
            look = look[~has]
        ok[idx] = good & first_ok
        return f, last, ok


def group_edges(m: OrderIndex, groups: np.ndarray, front: bool, hints: Optional[GroupHints] = None) -> np.ndarray:
    """In an OrderIndex of (group + 1, ..., row key): the first (front) or last row key of each
    group (-1 when it has none); `hints` (the index's GroupHints) spare the search where they hold."""
    groups = np.asarray(groups, dtype=np.int64)
    out = np.full(groups.size, -1, dtype=np.int64)
    if groups.size == 0 or len(m) == 0:
        return out
    at = np.arange(groups.size)
    if hints is not None:
        first, last, held = hints.bounds(groups)
        out[held] = m.id_at((first if front else last)[held])
        at = np.flatnonzero(~held)
        if at.size == 0:
            return out
    g = groups[at]
    if front:
        _p, k = m.locate([g.astype(np.uint64)] + _tops(m, g.size))
        ok = k != NONE_HI
    else:
        k, _s = m.locate([(g + 1).astype(np.uint64)] + _tops(m, g.size))
        ok = k != NONE_LO
    w = m.words_at(k[ok])
    same = w[0].astype(np.int64) - 1 == g[ok]
    out[at[np.flatnonzero(ok)[same]]] = w[-1][same].astype(np.int64)
    return out


def group_range(m: OrderIndex, groups: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                hints: Optional[GroupHints] = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """In an OrderIndex of (group + 1, word, row key): (group, row key, word) of every element of
    each of `groups` (sorted, distinct) whose word is in [lo[i], hi[i]], ordered by group and word.
    The groups' elements are read in one pass over their slots (as `group_members` does) and
    filtered on the word: a search inside a group would halve on two words per step."""
    groups = np.asarray(groups, dtype=np.int64)
    keys, which = _group_keys(m, groups, hints)
    if keys.size == 0:
        return _EMPTY, _EMPTY, np.zeros(0, dtype=np.uint64)
    w = m.word_at(1, keys)
    inside = (w >= np.asarray(lo, dtype=np.uint64)[which]) & (w <= np.asarray(hi, dtype=np.uint64)[which])
    keys, which = keys[inside], which[inside]
    return groups[which], m.id_at(keys), w[inside]
