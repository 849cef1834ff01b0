"""natural_join and exact_join: each left row with the columns of the right row that has its key.

The result has the left table's rows, row keys and shifts; its left columns are read from the left
table through those row keys, its right columns from one row per key group (`KeySpace`): the
values of the group's right row, kept per group and rewritten only when the right table changes
that group. A left row reads its group's values through its group (`JoinSide.group_of`), so a
right-side change to k keys rewrites k rows of values and reports the left rows of those groups as
modified (found through the left side's members, never by reading the left table); a left-side
change costs what it changes.

Which right row a group takes (`match`): "error" (Deephaven's default: a key with two right rows
fails the join), "first" or "last" (the right row with the lowest or highest row key), or
"exactly_one" (also fails for a left row without a right row). `exact_join` is "exactly_one".
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, equal_mask
from tickwire.server.engine.graph.ops.base import _EMPTY, _first_keys, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.join_keys import JoinSide, KeySpace, SideChange, check_keys, unknown_columns
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["NaturalJoinTable", "LeftRowsJoin", "MATCHES", "take_two", "right_columns"]

MATCHES = ("error", "first", "last", "exactly_one")


def take_two(a: pa.Table, b: pa.Table, from_b: np.ndarray, b_rows: np.ndarray) -> pa.Table:
    """Rows of `a`, except where `from_b`: there row `b_rows[j]` of `b` (one per True, in order)."""
    if not from_b.any():
        return a
    n = a.num_rows
    idx = np.arange(n, dtype=np.int64)
    idx[from_b] = n + np.asarray(b_rows, dtype=np.int64)
    return pa.concat_tables([a, b.cast(a.schema)]).take(pa.array(idx, type=pa.int64()))


def right_columns(name: str, left: Table, right: Table, on: Sequence[tuple[str, str]],
                  joins: Optional[Sequence[tuple[str, str]]]) -> list[tuple[str, str]]:
    """The (output name, right column) pairs a join adds, as Deephaven reads them: `joins` (an
    output name given twice keeps its first place and its last column), or (None) every right
    column not named like a left key column (so a right key named differently is added); each
    must exist and not collide with a left column."""
    if joins is None:
        keys = {a for a, _b in on}
        joins = [(c, c) for c in right.schema.names if c not in keys]
    missing = [col for _new, col in joins if col not in right.schema.names]
    if missing:
        raise unknown_columns(right, missing)
    clash = [new for new, _col in joins if new in left.schema.names]
    if clash:
        raise OperationError(f"Conflicting column names [{', '.join(dict.fromkeys(clash))}]")
    out: dict[str, str] = {}
    for new, col in joins:
        out[new] = col
    return list(out.items())


class _JoinStore:
    """A left-rows join's values by row key: left columns from the left table, the others from the
    join (`right_values`)."""

    def __init__(self, join: "LeftRowsJoin"):
        self.join = join

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        j = self.join
        names = list(columns) if columns is not None else j.schema.names
        keys = np.asarray(slots, dtype=np.int64)
        got: dict[str, pa.ChunkedArray] = {}
        lnames = [n for n in names if n in j.left_names]
        rnames = [n for n in names if n not in j.left_names]
        if lnames:
            got.update(zip(lnames, j.left.gather(lnames, keys).columns))
        if rnames:
            got.update(zip(rnames, j.right_values(keys, rnames).columns))
        return pa.Table.from_arrays([got[n] for n in names], schema=pa.schema([j.schema.field(n) for n in names]))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class LeftRowsJoin(_Op):
    """A join whose rows are the left table's (its row set, row keys and shifts): natural_join,
    exact_join, aj and raj. Subclasses set `left`, `left_names` and `_lup` (the left table's update
    of the cycle) and give `right_values(keys, names)`."""

    left: Table
    left_names: set[str]
    _lup: Optional[TableUpdate]
    _pinfo: Optional[tuple[Any, ...]]  # the subclass's previous-value bookkeeping of the cycle

    def right_values(self, keys: np.ndarray, names: Sequence[str]) -> pa.Table:
        raise NotImplementedError

    @property
    def rowset(self) -> RowSet:
        return self.left.rowset

    @rowset.setter
    def rowset(self, value: RowSet) -> None:
        pass  # always the left table's

    @property
    def prev_rowset(self) -> Optional[RowSet]:
        if self._update is None:
            return None
        return self.left.prev_rowset if self._lup is not None else self.left.rowset

    @prev_rowset.setter
    def prev_rowset(self, value: Optional[RowSet]) -> None:
        pass

    @property
    def size(self) -> int:
        return self.left.size

    def _edge_keys(self, n: int, front: bool) -> np.ndarray:
        return _first_keys(self.left, n, front)

    def _left_update(self, lup: Optional[TableUpdate], mods: list[np.ndarray], cols: set[str]
                     ) -> Optional[TableUpdate]:
        """The cycle's update: the left table's added, removed and shifted rows, and as modified its
        modified rows with the rows `mods` the right side changed (under the columns `cols`)."""
        mod = RowSet.from_keys(unique(np.concatenate(mods))) if mods else RowSet()
        if lup is None and mod.is_empty():
            return None
        return TableUpdate(added=lup.added if lup is not None else RowSet(),
                           removed=lup.removed if lup is not None else RowSet(),
                           shifted=lup.shifted if lup is not None else RowSetShiftData(),
                           modified=mod,
                           modified_columns=ModifiedColumnSet([c for c in self.schema.names if c in cols]
                                                              if not mod.is_empty() else ()))

    def end_cycle(self) -> None:
        _Op.end_cycle(self)
        self._lup = None
        self._pinfo = None

    def _left_prev(self, names: Sequence[str], k: np.ndarray, cols: dict[str, pa.ChunkedArray]) -> None:
        """Puts in `cols` the previous values of the left columns among `names` of rows `k`: the
        left table's previous values where it modified them."""
        lnames = [n for n in names if n in self.left_names]
        lup = self._lup
        if not lnames or lup is None or lup.modified.is_empty():
            return
        inmod = lup.modified.contains(k)
        if inmod.any():
            prev = self.left.prev_gather(lnames, k[inmod])
            mixed = take_two(self.left.gather(lnames, k), prev, inmod, np.arange(int(inmod.sum())))
            cols.update(zip(lnames, mixed.columns))


class NaturalJoinTable(LeftRowsJoin):
    """`left` with the columns `joins` ((output name, right column) pairs; None: every right column
    that is not a key) of the `right` row whose `on` columns ((left, right) pairs) equal the left
    row's; see the module docstring for `match`."""

    def __init__(self, graph: "UpdateGraph", name: str, left: Table, right: Table,
                 on: Sequence[tuple[str, str]], joins: Optional[Sequence[tuple[str, str]]] = None,
                 match: str = "error", what: str = "natural_join"):
        if match not in MATCHES:
            raise OperationError(f"table {name!r}: unknown match {match!r} (one of {', '.join(MATCHES)})")
        on = [(str(a), str(b)) for a, b in on]
        check_keys(name, left, right, on)
        self.on = on
        self.match = match
        self.what = what
        self.joins = right_columns(name, left, right, on, joins)
        self.left, self.right = left, right
        self.left_names = set(left.schema.names)
        rfields = [right.schema.field(c).with_name(n) for n, c in self.joins]
        self.space = KeySpace([left.schema.field(a).type for a, _b in on], reuse=True)
        self.values = ColumnStore(pa.schema(rfields))   # key group -> the right row's values
        self.space.on_new.append(self._new_groups)
        self._new_groups(np.arange(self.space.n, dtype=np.int64))
        self.lside = JoinSide(self.space, left, [a for a, _b in on])
        self.rside = JoinSide(self.space, right, [b for _a, b in on])
        self._lup: Optional[TableUpdate] = None
        # the cycle's previous values: (rows that changed group, their old groups, groups whose
        # right values changed, those groups' old values)
        self._pinfo: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, pa.Table]] = None
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, left, pa.schema(list(left.schema) + rfields), others=[right])
            self.store = _JoinStore(self)
            self.attributes = {k: v for k, v in left.attributes.items() if k in ("AddOnly", "AppendOnly")}
            rc = self.rside.follow(TableUpdate(added=right.rowset))
            self._refresh(rc.touched)
            lc = self.lside.follow(TableUpdate(added=left.rowset))
            self._check(lc, rc)
            self._update = None

    def _new_groups(self, groups: np.ndarray) -> None:
        if groups.size == 0:
            return
        self.values.ensure(self.space.n)
        self.values.write(groups, pa.Table.from_arrays([pa.nulls(groups.size, f.type) for f in self.values.schema],
                                                       schema=self.values.schema))

    def right_values(self, keys: np.ndarray, names: Sequence[str]) -> pa.Table:
        return self.values.gather(self.lside.group_of.get(keys), names)

    # -- the cycle ------------------------------------------------------------------------------
    def _refresh(self, groups: np.ndarray) -> tuple[np.ndarray, pa.Table]:
        """Takes the right values of `groups` (sorted, distinct) again; returns the groups whose
        values changed and their old values."""
        G = groups
        if G.size == 0:
            return _EMPTY, self.values.gather(_EMPTY)
        rk = self.rside.edge(G, front=self.match != "last")
        has = rk >= 0
        idx = np.full(G.size, -1, dtype=np.int64)
        idx[has] = np.arange(int(has.sum()), dtype=np.int64)
        rcols = [c for _n, c in self.joins]
        got = self.right.gather(rcols, rk[has])
        new = pa.Table.from_arrays([got.column(i).combine_chunks().take(pa.array(idx, mask=idx < 0))
                                    for i in range(len(rcols))], schema=self.values.schema)
        old = self.values.gather(G)
        same = np.ones(G.size, dtype=bool)
        for i in range(len(rcols)):
            same &= equal_mask(old.column(i).combine_chunks(), new.column(i))
        diff = ~same
        changed = G[diff]
        if changed.size:
            mask = pa.array(diff)
            self.values.write(changed, new.filter(mask))
            return changed, old.filter(mask)
        return changed, old.slice(0, 0)

    def _check(self, lc: Optional[SideChange], rc: Optional[SideChange]) -> None:
        """As Deephaven: a duplicate right key fails the join ("error", "exactly_one") only once
        a left row has that key; "exactly_one" also fails for a left row without a right row."""
        if self.match not in ("error", "exactly_one"):
            return
        parts = [rc.touched] if rc is not None else []
        if lc is not None:
            parts.append(lc.arrived()[1])
        if not parts:
            return
        G = unique(np.concatenate(parts))
        used = self.lside.counts(G) > 0
        count = self.rside.counts(G)
        dup = G[used & (count > 1)]
        if dup.size:
            raise OperationError(f"Natural Join found duplicate right key for {self.space.describe(int(dup[0]))}")
        if self.match == "exactly_one":
            bad = G[used & (count == 0)]
            if bad.size:
                raise OperationError(f"Tables don't have one-to-one mapping - no mappings for key "
                                     f"{self.space.describe(int(bad[-1]))}.")

    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        self.space.begin_cycle()
        lup = updates.get(self.left.name)
        rup = updates.get(self.right.name)
        self._lup = lup
        # the left side first: the rows of a group are then found under their new row keys
        lc = self.lside.follow(lup) if lup is not None else None
        rc = self.rside.follow(rup) if rup is not None else None
        changed, old = _EMPTY, self.values.gather(_EMPTY)
        if rc is not None and rup is not None:
            touched = [rc.touched]
            rcols = {c for _n, c in self.joins}
            if not rup.modified.is_empty() and rcols & rup.modified_columns:
                touched.append(self.rside.group_of.get(rup.modified.keys()))
            changed, old = self._refresh(unique(np.concatenate(touched)))
        self._check(lc, rc)
        mods = []
        cols: set[str] = set()
        rnames = [n for n, _c in self.joins]
        if lup is not None and not lup.modified.is_empty():
            mods.append(lup.modified.keys())
            cols |= set(lup.modified_columns)
            assert lc is not None
            if lc.moved.size:
                cols |= set(rnames)
        if changed.size:
            _g, rows = self.lside.rows_of(changed)
            if lup is not None and rows.size and not lup.added.is_empty():
                rows = rows[~lup.added.contains(rows)]
            if rows.size:
                mods.append(rows)
                cols |= set(rnames)
        moved_rows = lc.moved if lc is not None else _EMPTY
        self._pinfo = (np.sort(moved_rows), lc.moved_from[np.argsort(moved_rows)] if lc is not None else _EMPTY,
                       changed, old)
        self._moves = (lc.shift_old, lc.shift_new) if lc is not None and lc.shift_old.size else None
        return self._left_update(lup, mods, cols)

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """Previous values of this cycle's modified rows: the left table's previous values of
        rows it modified, and the right values of each row's group before the cycle."""
        k = self._prev_keys(keys)
        names = column_names(self.schema, columns)
        now = self.gather(names, k)
        if k.size == 0:
            return now
        cols = dict(zip(names, now.columns))
        self._left_prev(names, k, cols)
        rnames = [n for n in names if n not in self.left_names]
        if rnames and self._pinfo is not None:
            moved, moved_from, changed, old = self._pinfo
            g = self.lside.group_of.get(k)
            if moved.size:
                i = np.minimum(np.searchsorted(moved, k), moved.size - 1)
                hit = moved[i] == k
                g = np.where(hit, moved_from[i], g)
            vals = self.values.gather(g, rnames)
            if changed.size:
                j = np.minimum(np.searchsorted(changed, g), changed.size - 1)
                hit = changed[j] == g
                vals = take_two(vals, old.select(rnames), hit, j[hit])
            cols.update(zip(rnames, vals.columns))
        return pa.Table.from_arrays([cols[n] for n in names], schema=pa.schema([self.schema.field(n) for n in names]))


def _natural_join(graph: "UpdateGraph", name: str, left: Table, right: Table, on: Sequence[tuple[str, str]],
                  joins: Optional[Sequence[tuple[str, str]]] = None, match: str = "error") -> Table:
    return NaturalJoinTable(graph, name, left, right, on, joins, match)


def _exact_join(graph: "UpdateGraph", name: str, left: Table, right: Table, on: Sequence[tuple[str, str]],
                joins: Optional[Sequence[tuple[str, str]]] = None) -> Table:
    return NaturalJoinTable(graph, name, left, right, on, joins, "exactly_one", what="exact_join")


register_operation("natural_join", _natural_join)
register_operation("exact_join", _exact_join)
