"""head_by and tail_by: the first (or last) n rows of each group of key columns, incremental.

As Deephaven answers `headBy(n, keys)` / `tailBy(n, keys)` (an aggregation grouping every other
column, cut to n, ungrouped): the key columns come first, then the others in the parent's order;
the groups follow in the order they were first seen (the order agg_by gives them, a group that
empties and comes back soon keeps its place; once many have emptied their places go to new keys,
as agg_by's do: `GroupIds`), and each group's rows in the parent's order. The key
columns show the group's key (the value its first row had: -0.0 and 0.0, NaN and NaN are one key).

Groups are found as agg_by finds them (key columns hashed in bulk, `KeyIndex`, the group keys in a
`ColumnStore`), and the rows of each group are kept in order in an `OrderIndex` of
(group + 1, parent row key), so the first or last n rows of a group are one ordered lookup and a
scan of about n elements.

Row keys: the row at rank r (0-based, within the rows shown for its group) of group g has the key
``g << bits | r``, where ``bits`` is the number of bits of n - 1 (capped at 31: a group shows at
most 2**31 rows), so each group owns a fixed block of keys and never moves while it has rows.
When a row before others in the shown window leaves (or one comes in), the rows after it move to
their new ranks: that is reported as shifts within the group's block, the row pushed out of the
window as removed and the one coming into it as added. A cycle looks only at the groups it touches (a row added,
removed, modified, or moved to another group), at about n rows each.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError, UnknownColumnError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, check_hashable, groups_of
from tickwire.server.engine.graph.group_ids import GroupIds
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error, shifted_rows
from tickwire.server.engine.graph.order import MEMBERS_BUDGET, NONE_HI, NONE_LO, OrderIndex
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["HeadTailByTable"]

_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
MAX_BITS = 31  # a group shows at most 2**31 rows


def _ranges(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner index, rank) of each element of the concatenated ranges [0, counts[i])."""
    total = int(counts.sum())
    owner = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    rank = np.arange(total, dtype=np.int64) - first[owner]
    return owner, rank


class _GroupedStore:
    """What a head_by table reads: key columns from its groups, the others from the parent's rows.
    Its slots are its own row keys."""

    def __init__(self, table: "HeadTailByTable"):
        self.table = table

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        return self.table.values_at(np.asarray(slots, dtype=np.int64), columns)

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class HeadTailByTable(_Op):
    """The first (`head_by`) or last (`tail_by`) n rows of each group of `keys` (see the module
    docstring)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, n: int,
                 keys: Union[str, Sequence[str]] = (), tail: bool = False):
        what = "tail_by" if tail else "head_by"
        keys = [keys] if isinstance(keys, str) else list(keys)
        n = int(n)
        if n <= 0:
            raise OperationError(f"table {name!r}: {what} needs n > 0, got {n}")
        ps = parent.schema
        for k in keys:
            if k not in ps.names:
                raise UnknownColumnError(f"table {name!r}: {what} of unknown key column {k!r}; the table has "
                                         f"{', '.join(ps.names) or 'no columns'}")
            if not check_hashable(ps.field(k).type):
                raise OperationError(f"table {name!r}: key column {k!r} has type {ps.field(k).type}, "
                                     f"which cannot be a key")
        if len(set(keys)) != len(keys):
            raise OperationError(f"table {name!r}: {what}: a key column is named twice in {keys}")
        if keys and len(keys) == len(ps.names):
            raise OperationError(f"table {name!r}: {what} needs a column that is not a key column")
        if parent.attributes.get("BlinkTable"):
            raise OperationError(f"table {name!r}: {what} of blink table {parent.name!r} is not supported "
                                 f"(its rows leave every cycle)")
        self.n = n
        self.front = not tail
        self.keys = keys
        self.key_set = frozenset(keys)
        self.bits = min(MAX_BITS, (min(n, 1 << MAX_BITS) - 1).bit_length())
        schema = pa.schema([ps.field(k) for k in keys] + [f for f in ps if f.name not in self.key_set])
        self._groups = KeyIndex()
        self._group_keys = ColumnStore(pa.schema([ps.field(k) for k in keys]))
        self._ids = GroupIds(self._groups, self._group_keys, keys)  # emptied groups' ids given again
        self._count = np.zeros(1024, dtype=np.int64)   # group -> rows
        self._vis = np.zeros(1024, dtype=np.int64)     # group -> rows shown
        self._gid_of = KeyMap()                        # parent row key -> group
        self._members = OrderIndex(2, budget=MEMBERS_BUDGET, members=True)  # (group + 1, parent row key), in order
        self._src = KeyMap()                           # row key -> parent row key
        self._okey_of = KeyMap()                       # parent row key of a shown row -> row key
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, schema)
            self.store = _GroupedStore(self)
            if not keys:
                self._new_groups(1)
            self._cycle(TableUpdate(added=parent.rowset))
            self._rs = None
            self._update = None

    # -- reading --------------------------------------------------------------------------------
    def _parent_keys(self, keys: np.ndarray) -> np.ndarray:
        pkeys: np.ndarray = self._src.get(np.asarray(keys, dtype=np.int64))
        return pkeys

    def values_at(self, okeys: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The values of the rows at row keys `okeys`: key columns from the groups, the others
        from the parent's rows."""
        names = list(columns) if columns is not None else self.schema.names
        keyed = [n for n in names if n in self.key_set]
        rest = [n for n in names if n not in self.key_set]
        got: dict[str, pa.Array] = {}
        if keyed:
            kv = self._group_keys.gather(okeys >> self.bits, keyed)
            got.update({n: kv.column(n).combine_chunks() for n in keyed})
        if rest:
            p = self.parent
            vals = p.store.gather(p.slots(self._src.get(okeys)), rest)
            got.update({n: vals.column(n).combine_chunks() for n in rest})
        return pa.Table.from_arrays([got[n] for n in names], schema=pa.schema([self.schema.field(n) for n in names]))

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """Previous values of this cycle's modified rows: a shown row keeps its group, so its key
        columns are the group's; the others are the parent's previous values."""
        k = self._prev_keys(keys)
        names = list(columns) if columns is not None else self.schema.names
        rest = [c for c in names if c not in self.key_set]
        if k.size == 0 or not rest:
            return self.gather(names, k)
        prev = self.parent.prev_gather(rest, self._src.get(k))
        now = self.gather([c for c in names if c in self.key_set], k)
        cols = [now.column(c) if c in self.key_set else prev.column(c) for c in names]
        return pa.Table.from_arrays(cols, schema=pa.schema([self.schema.field(c) for c in names]))

    # -- groups ---------------------------------------------------------------------------------
    @property
    def _ngroups(self) -> int:
        return self._ids.made

    def _new_groups(self, m: int) -> np.ndarray:
        if self._ngroups + m - min(m, self._ids.free) > (1 << (63 - self.bits)):
            raise OperationError(f"table {self.name!r}: more groups than row keys for them")
        new = self._ids.take(m)
        size = self._count.size
        while size < self._ngroups:
            size *= 2
        if size > self._count.size:
            for attr in ("_count", "_vis"):
                old = getattr(self, attr)
                grown = np.zeros(size, dtype=np.int64)
                grown[:old.size] = old
                setattr(self, attr, grown)
        self._group_keys.ensure(self._ngroups)
        return new

    def _group_of(self, values: pa.Table) -> np.ndarray:
        """Group of each row of key values, making groups for new keys (in first-row order)."""
        def make(key_vals: pa.Table) -> np.ndarray:
            new = self._new_groups(key_vals.num_rows)
            self._group_keys.write(new, key_vals)
            return new
        gids: np.ndarray = groups_of(self._groups, self._group_keys, self.keys, values, make)
        return gids

    def _shown(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The parent row keys of the rows each of `groups` (sorted, distinct) shows now, in
        order: (index into `groups` of each, parent row key)."""
        m = self._members
        need = np.minimum(self._count[groups], self.n)
        has = need > 0
        groups, need = groups[has], need[has]
        where = np.flatnonzero(has)
        if groups.size == 0:
            return _EMPTY, _EMPTY
        _p, first = m.locate([groups.astype(np.uint64), np.full(groups.size, _U64_MAX)])
        last, _s = m.locate([(groups + 1).astype(np.uint64), np.full(groups.size, _U64_MAX)])
        if np.any(first == NONE_HI) or np.any(last == NONE_LO):
            raise RuntimeError(f"table {self.name!r}: a group with rows has none in the order index")
        out_i: list[np.ndarray] = []
        out_k: list[np.ndarray] = []
        todo = np.arange(groups.size, dtype=np.int64)
        width = 2 * m.spacing * need + 16
        while todo.size:
            f, la, w = first[todo], last[todo], width[todo]
            a = f if self.front else np.maximum(f, la - w + 1)
            b = np.minimum(la, f + w - 1) if self.front else la
            keys, which = m.keys_between(a, b)
            got = np.bincount(which, minlength=todo.size)
            done = (got >= need[todo]) | ((a == f) & (b == la))
            sel = done[which]
            keys, which = keys[sel], which[sel]
            _o, rank = _ranges(got[done])
            # keys/which of the finished ranges, ascending within each: keep the first (or last) need
            cnt = got[which]
            want = need[todo][which]
            keep = rank < want if self.front else rank >= cnt - want
            out_i.append(todo[which[keep]])
            out_k.append(keys[keep])
            todo = todo[~done]
            width[todo] *= 4
        idx = np.concatenate(out_i)
        okeys = np.concatenate(out_k)
        order = np.lexsort((okeys, idx))
        return where[idx[order]], m.id_at(okeys[order])

    # -- the cycle ------------------------------------------------------------------------------
    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        return self._cycle(up)

    def _cycle(self, up: TableUpdate) -> Optional[TableUpdate]:
        parent, members, gid_of = self.parent, self._members, self._gid_of
        self._ids.release(lambda g: self._count[g] == 0)
        touched: list[np.ndarray] = []
        # 1. removed rows (pre-shift keys) leave their groups
        rem_p = up.removed.keys()
        if rem_p.size:
            g = gid_of.get(rem_p)
            if np.any(g < 0):
                raise RuntimeError(f"table {self.name!r}: the parent removed rows this table does not have")
            touched.append(g)
            gid_of.delete(rem_p)
            members.delete(members.key_of(rem_p))
            np.subtract.at(self._count, g, 1)
        # 2. shifted rows: new parent keys, same order
        old_s = new_s = _EMPTY
        if not up.shifted.is_empty():
            old_s, new_s = shifted_rows(parent, up)
            if old_s.size:
                gid_of.remap(old_s, new_s)
                members.set_last_word(members.key_of(old_s), new_s)
        # 3. modified rows whose keys changed group move to it
        mod_p = up.modified.keys()
        moved_p = _EMPTY
        if mod_p.size and self.key_set & up.modified_columns:
            cur = gid_of.get(mod_p)
            new_g = self._group_of(parent.gather(self.keys, mod_p))
            ch = new_g != cur
            if ch.any():
                moved_p, cg, ng = mod_p[ch], cur[ch], new_g[ch]
                touched.extend([cg, ng])
                members.delete(members.key_of(moved_p))
                members.insert([(ng + 1).astype(np.uint64), moved_p.astype(np.uint64)])
                gid_of.set(moved_p, ng)
                np.subtract.at(self._count, cg, 1)
                np.add.at(self._count, ng, 1)
        # 4. added rows join their groups
        add_p = up.added.keys()
        if add_p.size:
            g = self._group_of(parent.gather(self.keys, add_p)) if self.keys else np.zeros(add_p.size, np.int64)
            touched.append(g)
            gid_of.set(add_p, g)
            members.insert([(g + 1).astype(np.uint64), add_p.astype(np.uint64)])
            np.add.at(self._count, g, 1)
        # 5. the rows the touched groups showed (row keys, pre-shift parent keys) ...
        T = unique(np.concatenate(touched)) if touched else _EMPTY
        vis_b = self._vis[T]
        b_i, b_rank = _ranges(vis_b)
        b_g = T[b_i]
        b_okey = (b_g << self.bits) | b_rank
        b_pre = self._src.get(b_okey)
        # ... while shown rows of the other groups follow the parent's shifts
        if rem_p.size:
            self._okey_of.delete(rem_p)
        if old_s.size:
            ok = self._okey_of.get(old_s)
            on = ok >= 0
            if on.any():
                self._okey_of.remap(old_s[on], new_s[on])
                self._src.set(ok[on], new_s[on])
        # 6. ... and the rows they show now
        a_i, a_pkey = self._shown(T)
        a_vis = np.bincount(a_i, minlength=T.size)
        _o, a_rank = _ranges(a_vis)
        a_g = T[a_i]
        a_okey = (a_g << self.bits) | a_rank
        # 7. rows shown before and after (the same rows in the same order within each group)
        gone = np.isin(b_pre, rem_p) if rem_p.size else np.zeros(b_pre.size, dtype=bool)
        b_post = np.where(gone, -1, up.shifted.apply_to_keys(b_pre) if not up.shifted.is_empty() else b_pre)
        if moved_p.size:
            gone |= np.isin(b_post, moved_p)
        b_keep = ~gone & np.isin(b_post, a_pkey)
        a_keep = np.isin(a_pkey, b_post[~gone])
        old_k, new_k = b_okey[b_keep], a_okey[a_keep]
        removed = b_okey[~b_keep]
        added = a_okey[~a_keep]
        mv = old_k != new_k
        shifted = RowSetShiftData()
        moves: Optional[tuple[np.ndarray, np.ndarray]] = None
        if mv.any():
            # runs of rows moving by one amount, never across a group or a row that stays
            d = new_k - old_k
            brk = np.ones(d.size, dtype=bool)
            brk[1:] = (d[1:] != d[:-1]) | ((old_k[1:] >> self.bits) != (old_k[:-1] >> self.bits))
            first = np.flatnonzero(brk)
            last = np.append(first[1:], d.size) - 1
            use = d[first] != 0
            shifted = RowSetShiftData.build(old_k[first[use]], old_k[last[use]], d[first[use]])
            moves = (old_k[mv], new_k[mv])
        # 8. the maps follow
        self._src.delete(b_okey)
        self._okey_of.delete(b_post[~gone])
        if moved_p.size:
            self._okey_of.delete(moved_p)
        self._src.set(a_okey, a_pkey)
        self._okey_of.set(a_pkey, a_okey)
        self._vis[T] = a_vis
        self._ids.emptied(T[self._count[T] == 0])
        modified = _EMPTY
        if mod_p.size:
            mo = self._okey_of.get(mod_p)
            modified = np.setdiff1d(mo[mo >= 0], added)
        self._moves = moves
        removed_rs, added_rs = RowSet.from_keys(np.sort(removed)), RowSet.from_keys(np.sort(added))
        if moves is not None:
            self._commit(removed_rs, _EMPTY)
            self._commit(moves[0], moves[1])
            self._commit(_EMPTY, added_rs)
        else:
            self._commit(removed_rs, added_rs)
        cols = up.modified_columns & set(self.schema.names) if modified.size else set()
        return TableUpdate(added=added_rs, removed=removed_rs, modified=RowSet.from_keys(modified),
                           shifted=shifted, modified_columns=ModifiedColumnSet(cols))


register_operation("head_by", lambda graph, name, parent, n, keys=(): HeadTailByTable(graph, name, parent, n, keys))
register_operation("tail_by", lambda graph, name, parent, n, keys=(): HeadTailByTable(graph, name, parent, n, keys,
                                                                                      tail=True))
