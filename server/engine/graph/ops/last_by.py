"""last_by: the latest row of each distinct key, as a keyed table."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, check_hashable, groups_of
from tickwire.server.engine.graph.group_ids import GroupIds
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error, shifted_rows
from tickwire.server.engine.graph.order import MEMBERS_BUDGET, NONE_LO, OrderIndex
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["LastByTable"]

_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
_REUSE_MIN = 1024   # freed output row keys and group ids are reused once this many (or 1/8) are free


class LastByTable(_Op):
    """One row per distinct value of the key columns: the group's latest row (the one with the
    largest parent row key), as a keyed table. A group gets the next row key when it first
    appears (groups appearing in one cycle are numbered in the order of their first rows, as
    Deephaven orders groups by first appearance) and keeps it while it has rows; a group that
    empties is removed, and one that comes back is a new
    row. The group's row is modified when its latest row changes (every non-key column is then
    reported modified) or when the parent modifies that row (its modified columns).

    Over a parent marked AddOnly (an append table, and what keeps that attribute) the table keeps
    state per group only (its latest row is the largest key added), so its memory follows its
    groups, not its parent's rows. Should such a parent still remove, shift, or move a row to
    another group, the table builds its per-row state from the parent's rows once and goes on
    from there.

    Memory follows the live groups: once many groups have emptied (`_REUSE_MIN`, or an eighth of
    the live ones), their ids are given to new keys, and output row keys freed by removed groups
    are given to new groups (lowest first), at the earliest in the cycle after the one that removed
    them, so that no subscriber takes a new group for an old one. Until then new groups get row
    keys after every other, which is the order Deephaven gives them."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, keys: Union[str, Sequence[str]]):
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys:
            raise OperationError(f"table {name!r}: last_by needs at least one key column")
        for k in column_names(parent.schema, keys):
            if not check_hashable(parent.schema.field(k).type):
                raise OperationError(f"table {name!r}: key column {k!r} has type {parent.schema.field(k).type}, "
                                 f"which cannot be a key")
        self.keys = keys
        self.value_columns = [n for n in parent.schema.names if n not in keys]
        self._groups = KeyIndex()
        self._group_keys = ColumnStore(pa.schema([parent.schema.field(k) for k in keys]))
        # group ids, given again once many groups have emptied (read here: benchmarks set _REUSE_MIN)
        self._ids = GroupIds(self._groups, self._group_keys, keys, minimum=_REUSE_MIN)
        self._gid_of = KeyMap()                       # parent row key -> group
        self._members = OrderIndex(2, budget=MEMBERS_BUDGET, members=True)  # (group, parent row key) in order
        self._rep = np.full(1024, -1, dtype=np.int64)    # group -> its latest parent row key
        self._count = np.zeros(1024, dtype=np.int64)     # group -> rows
        self._okey = np.full(1024, -1, dtype=np.int64)   # group -> output row key
        self._gid_at = np.full(1024, -1, dtype=np.int64)  # output row key -> group
        self._next_okey = 0
        self._dying_o: list[np.ndarray] = []     # output keys removed by the last cycle
        self._free_o = _EMPTY                     # output keys free for new groups, ascending
        self._spare_o: list[np.ndarray] = []     # freed since `_free_o` was sorted (merged on taking)
        self._lean = bool(parent.attributes.get("AddOnly"))   # no per-row state (see the class)
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self._cycle(TableUpdate(added=parent.rowset))
            self._rs = None

    # -- storage --------------------------------------------------------------------------------
    def _grow(self, groups: int) -> None:
        size = self._rep.size
        if groups <= size:
            return
        while size < groups:
            size *= 2
        for name, fill in (("_rep", -1), ("_count", 0), ("_okey", -1)):
            old = getattr(self, name)
            new = np.full(size, fill, dtype=np.int64)
            new[:old.size] = old
            setattr(self, name, new)

    def _reps(self, okeys: np.ndarray) -> np.ndarray:
        reps: np.ndarray = self._rep[self._gid_at[okeys]]
        return reps

    def _parent_keys(self, keys: np.ndarray) -> np.ndarray:
        return self._reps(np.asarray(keys, dtype=np.int64))

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return self.parent.slots(self._reps(np.asarray(keys, dtype=np.int64)))

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        raise RuntimeError(f"table {self.name!r}: last_by does not keep previous values")

    # -- groups ---------------------------------------------------------------------------------
    def _group_of(self, values: pa.Table) -> np.ndarray:
        """Group of each row of key values, creating groups for new keys."""
        def make(key_vals: pa.Table) -> np.ndarray:
            new = self._ids.take(key_vals.num_rows)
            self._grow(self._ngroups)
            self._group_keys.ensure(self._ngroups)
            self._group_keys.write(new, key_vals)
            return new
        gids: np.ndarray = groups_of(self._groups, self._group_keys, self.keys, values, make)
        return gids

    def _new_reps(self, groups: np.ndarray) -> None:
        """Finds the latest row of each group (groups with rows)."""
        if groups.size == 0:
            return
        q = [groups.astype(np.uint64), np.full(groups.size, _U64_MAX, dtype=np.uint64)]
        pred, _ = self._members.locate(q)
        ok = pred != NONE_LO
        w = self._members.words_at(pred[ok])
        same = w[0].astype(np.int64) == groups[ok]
        rep = np.full(groups.size, -1, dtype=np.int64)
        rep[np.flatnonzero(ok)[same]] = w[1][same].astype(np.int64)
        self._rep[groups] = rep

    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        return self._cycle(up)

    def _release(self) -> None:
        """Frees what earlier cycles left: their removed output keys (that update has gone out),
        and, once many groups have emptied, those groups' ids."""
        self._spare_o += self._dying_o
        self._dying_o = []
        dead = self._ids.release(lambda g: (self._count[g] == 0) & (self._okey[g] < 0))  # not come back since
        self._rep[dead] = -1

    @property
    def _ngroups(self) -> int:
        return self._ids.made

    def _free_count(self) -> int:
        return self._free_o.size + sum(a.size for a in self._spare_o)

    def _reuse_threshold(self) -> int:
        return max(_REUSE_MIN, (self._next_okey - self._free_count()) // 8)

    def _output_keys(self, n: int) -> np.ndarray:
        """Row keys for n new groups: freed ones (lowest first) while many are free, else new.
        Keys freed since the last time some were taken are sorted in only then."""
        reused = _EMPTY
        if n and self._free_count() >= self._reuse_threshold():
            if self._spare_o:
                self._free_o = np.sort(np.concatenate([self._free_o, *self._spare_o]))
                self._spare_o = []
            reused, self._free_o = self._free_o[:n], self._free_o[n:]
        fresh = np.arange(self._next_okey, self._next_okey + n - reused.size, dtype=np.int64)
        self._next_okey += fresh.size
        return np.concatenate((reused, fresh))

    def _cycle(self, up: TableUpdate) -> Optional[TableUpdate]:
        self._release()
        if self._lean:
            mod_keys = bool(up.modified.keys().size and set(self.keys) & up.modified_columns)
            if up.removed.keys().size or not up.shifted.is_empty() or mod_keys:
                return self._leave_lean(up)
            return self._lean_cycle(up)
        parent, members, gid_of = self.parent, self._members, self._gid_of
        rec_g: list[np.ndarray] = []       # touched groups, with their latest row before the cycle
        rec_rep: list[np.ndarray] = []     # (post-shift key; -2 when that row left)
        lost: list[np.ndarray] = []        # groups whose latest row left
        # 1. removed rows (pre-shift keys)
        rem_p = up.removed.keys()
        if rem_p.size:
            g = gid_of.get(rem_p)
            if np.any(g < 0):
                raise RuntimeError(f"table {self.name!r}: the parent removed rows this table does not have")
            rep_b = self._rep[g]
            gone = np.isin(rep_b, rem_p)
            rep_b = np.where(gone, -2, up.shifted.apply_to_keys(rep_b))
            rec_g.append(g)
            rec_rep.append(rep_b)
            lost.append(g[gone])
            gid_of.delete(rem_p)
            members.delete(members.key_of(rem_p))
            np.subtract.at(self._count, g, 1)
        # 2. shifted rows: new parent keys
        if not up.shifted.is_empty():
            old, new = shifted_rows(parent, up)
            if old.size:
                g = gid_of.get(old)
                gid_of.remap(old, new)
                members.set_last_word(members.key_of(old), new)
                is_rep = self._rep[g] == old
                self._rep[g[is_rep]] = new[is_rep]
        # 3. modified rows that changed group move to it
        mod_p = up.modified.keys()
        moved_in_p, moved_in_g = _EMPTY, _EMPTY
        if mod_p.size and set(self.keys) & up.modified_columns:
            cur = gid_of.get(mod_p)
            new_g = self._group_of(parent.gather(self.keys, mod_p))
            ch = new_g != cur
            if ch.any():
                mp, cg, ng = mod_p[ch], cur[ch], new_g[ch]
                rec_g.extend([cg, ng])
                rec_rep.extend([self._rep[cg], self._rep[ng]])
                lost.append(cg[self._rep[cg] == mp])
                members.delete(members.key_of(mp))
                np.subtract.at(self._count, cg, 1)
                moved_in_p, moved_in_g = mp, ng
        # 4. added rows (and rows that moved in) join their groups
        add_p = up.added.keys()
        add_g = self._group_of(parent.gather(self.keys, add_p))
        in_p = np.concatenate((add_p, moved_in_p))
        in_g = np.concatenate((add_g, moved_in_g))
        if in_p.size:
            rec_g.append(in_g)
            rec_rep.append(self._rep[in_g])
            gid_of.set(in_p, in_g)
            members.insert([in_g.astype(np.uint64), in_p.astype(np.uint64)])
            np.add.at(self._count, in_g, 1)
            np.maximum.at(self._rep, in_g, in_p)
        # 5. groups whose latest row left find their new latest row
        if lost:
            lg = unique(np.concatenate(lost))
            has = self._count[lg] > 0
            self._rep[lg[~has]] = -1
            self._new_reps(lg[has])
        if not rec_g:
            mod_o = self._modified_reps(mod_p)
            return self._emit(_EMPTY, _EMPTY, mod_o, up, False)
        return self._finish(rec_g, rec_rep, in_p, in_g, mod_p, up)

    def _lean_cycle(self, up: TableUpdate) -> Optional[TableUpdate]:
        """A cycle of an AddOnly parent: added rows, and rows modified in place."""
        add_p, mod_p = up.added.keys(), up.modified.keys()
        if add_p.size == 0:
            return self._emit(_EMPTY, _EMPTY, self._modified_reps(mod_p), up, False)
        add_g = self._group_of(self.parent.gather(self.keys, add_p))
        rep_b = self._rep[add_g]
        np.add.at(self._count, add_g, 1)
        np.maximum.at(self._rep, add_g, add_p)
        return self._finish([add_g], [rep_b], add_p, add_g, mod_p, up)

    def _leave_lean(self, up: TableUpdate) -> Optional[TableUpdate]:
        """The AddOnly parent did what an AddOnly table does not: the per-row state is built
        from its current rows, and the output follows from each group's latest row before and
        after (a row that left counts as a changed latest row)."""
        self._lean = False
        parent = self.parent
        old_g = np.flatnonzero(self._okey[:self._ngroups] >= 0)
        rep_b = self._rep[old_g]
        rep_b = np.where(np.isin(rep_b, up.removed.keys()), -2, up.shifted.apply_to_keys(rep_b))
        now_p = parent.rowset.keys()
        now_g = self._group_of(parent.gather(self.keys, now_p))
        self._gid_of = KeyMap()
        self._members = OrderIndex(2, budget=MEMBERS_BUDGET, members=True)
        self._gid_of.set(now_p, now_g)
        self._members.insert([now_g.astype(np.uint64), now_p.astype(np.uint64)])
        self._count[:] = 0
        np.add.at(self._count, now_g, 1)
        self._rep[:] = -1
        np.maximum.at(self._rep, now_g, now_p)
        # groups that had a row come first, so that their latest row before is the one recorded
        return self._finish([old_g, now_g], [rep_b, np.full(now_g.size, -1, dtype=np.int64)],
                            now_p, now_g, up.modified.keys(), up)

    def _finish(self, rec_g: list[np.ndarray], rec_rep: list[np.ndarray], in_p: np.ndarray,
                in_g: np.ndarray, mod_p: np.ndarray, up: TableUpdate) -> Optional[TableUpdate]:
        """The cycle's update from the touched groups (`rec_g`, with their latest rows before the
        cycle in `rec_rep`), the rows that joined groups (`in_p`, `in_g`) and the parent's
        modified rows."""
        # 6. what each touched group's output row does
        allg = np.concatenate(rec_g)
        allrep = np.concatenate(rec_rep)
        G, first = np.unique(allg, return_index=True)
        rep_b = allrep[first]
        existed = self._okey[G] >= 0
        now = self._count[G] > 0
        gone_o = self._okey[G[existed & ~now]]
        self._gid_at[gone_o] = -1
        self._okey[G[existed & ~now]] = -1
        if gone_o.size:
            self._dying_o.append(gone_o)
        emptied = G[~now]
        if emptied.size and self.keys:
            self._ids.emptied(emptied)
        born = G[~existed & now]
        if born.size:
            # new groups in the order of their first rows (all their rows came in this cycle)
            o = np.argsort(in_p, kind="stable")
            firsts_g, firsts_i = np.unique(in_g[o], return_index=True)
            first_row = np.full(self._ngroups, np.iinfo(np.int64).max, dtype=np.int64)
            first_row[firsts_g] = in_p[o][firsts_i]
            born = born[np.argsort(first_row[born], kind="stable")]
        new_o = self._output_keys(born.size)
        if new_o.size:
            size = self._gid_at.size
            while size < self._next_okey:
                size *= 2
            if size > self._gid_at.size:
                grown = np.full(size, -1, dtype=np.int64)
                grown[:self._gid_at.size] = self._gid_at
                self._gid_at = grown
            self._gid_at[new_o] = born
            self._okey[born] = new_o
        both = existed & now
        rep_changed = both & (self._rep[G] != rep_b)
        changed_o = self._okey[G[rep_changed]]
        mod_o = np.union1d(changed_o, self._modified_reps(mod_p))
        return self._emit(new_o, gone_o, mod_o, up, bool(changed_o.size))

    def _modified_reps(self, mod_p: np.ndarray) -> np.ndarray:
        """Output keys of groups whose latest row the parent modified in place."""
        if mod_p.size == 0:
            return _EMPTY
        if self._lean:
            g = self._group_of(self.parent.gather(self.keys, mod_p))
        else:
            g = self._gid_of.get(mod_p)
        ok = g >= 0
        g, p = g[ok], mod_p[ok]
        is_rep = self._rep[g] == p
        okeys: np.ndarray = self._okey[g[is_rep]]
        return okeys

    def _emit(self, added: np.ndarray, removed: np.ndarray, modified: np.ndarray, up: TableUpdate,
              reps_changed: bool) -> TableUpdate:
        self._commit(removed, added)
        modified = np.setdiff1d(modified, added)
        cols: set[str] = set()
        if modified.size:
            cols = set(self.value_columns) if reps_changed else set()
            cols |= up.modified_columns
        return TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(removed),
                           modified=RowSet.from_keys(modified), modified_columns=ModifiedColumnSet(cols))


register_operation("last_by", LastByTable)
