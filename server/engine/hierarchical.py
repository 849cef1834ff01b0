"""Rollups: aggregations of a table at each level of its group-by columns, and views of their
expanded rows, as Deephaven's grid shows them ("Rollup rows").

A rollup of `source` by group-by columns g1..gn is n + 1 aggregated tables of the update graph,
the levels: level k is `source.agg_by(aggs, [g1..gk])` (level 0 has one row, the grand total).
Each level aggregates the source itself, so every aggregation kind works the same at every level
and ticks incrementally with the source.

A row of level k sits at depth k + 1 (depth 0 is a notional root above the total row). Its node
key is its depth and its first k group-by values; its children are the rows of level k + 1 with
the same first k group-by values, ordered by the rollup's sorts (ties in the level's own order,
which is the order in which each group first appeared). Rows of level n have no children.

`RollupView` is a derived table of the update graph whose parents are the levels: its rows are
the rows visible for a set of expansion directives, flattened depth first (a row, then the rows
of its expanded children), at row keys 0..size-1, with two leading columns, `__DEPTH__` (int32)
and `__EXPANDED__` (bool: true for an expanded row, false for a row that could be expanded, null
for a row without children), then the group-by columns (null beyond the row's depth), then the
aggregated columns. A rollup with constituents also expands the rows of level n, to the source
rows they aggregate (depth n + 2, in the source's order or sorted by the columns the sorted
aggregated columns read), which fill the constituent columns (the source's columns, named
CONSTITUENT_PREFIX + their name) and leave the others null; the source is then a parent of the
view too. Each cycle in which a level changed it recomputes its rows (vectorised over
the levels' rows) and reports the difference against its previous rows by position: the rows
whose values changed as modified, the rows beyond the previous size as added, the rows beyond
the new size as removed. Any Barrage subscription (whole table or viewport) can follow it.

Expansion directives are Deephaven's key-table actions: `EXPAND` (1) expands a node,
`EXPAND_ALL` (3) expands it and its descendants (until one is contracted, or expanded alone,
which stops the expansion of its own descendants), `CONTRACT` (4) keeps it collapsed, and
`EXPAND_TO_DEPTH_BASE` + m - 1 expands it and m - 1 levels below it. The root and the total row are
expanded unless a directive says otherwise. A directive naming a node that does not exist, or
whose parent is not expanded, has no effect; of several directives for one node the last counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Table, unique_name

if TYPE_CHECKING:
    from tickwire.server.engine.graph.ops.aggregate import Agg

__all__ = ["ROW_DEPTH", "ROW_EXPANDED", "CONSTITUENT_PREFIX", "EXPAND", "EXPAND_ALL", "CONTRACT",
           "EXPAND_TO_DEPTH_BASE", "Rollup", "RollupHandle", "RollupView", "Directives", "make_rollup",
           "expanded_rows", "view_schema"]

ROW_DEPTH = "__DEPTH__"
ROW_EXPANDED = "__EXPANDED__"
#: the view's name of a constituent column: this prefix and the source column's name (Deephaven's
#: clients see the source's name: see the service's descriptor)
CONSTITUENT_PREFIX = "__CONSTITUENT__"
EXPAND, EXPAND_ALL, CONTRACT = 1, 3, 4
EXPAND_TO_DEPTH_BASE = 0x70
_NONE = -1  # no directive
_ALL = np.iinfo(np.int64).max  # expanding every level below


@dataclass(frozen=True)
class Rollup:
    """What a rollup is: its source (filtered, when filters were applied), aggregations, group-by
    columns, level tables (level k grouped by the first k group-by columns) and sorts (column,
    descending) ordering each node's children."""

    source: Table
    aggs: tuple["Agg", ...]
    group_by: tuple[str, ...]
    levels: tuple[Table, ...]
    sorts: tuple[tuple[str, bool], ...] = ()
    schema: pa.Schema = field(default_factory=pa.schema)
    constituents: bool = False

    def constituent_sorts(self) -> list[tuple[str, bool]]:
        """The sorts of the constituent rows: a group-by column's own, an aggregated column's input
        column's (none for a column without one, such as a count)."""
        inputs = {a.name: a.column for a in self.aggs}
        out = []
        for c, desc in self.sorts:
            src = c if c in self.group_by else inputs.get(c)
            if src is not None:
                out.append((src, desc))
        return out

    def with_sorts(self, sorts: Sequence[tuple[str, bool]]) -> "Rollup":
        for column, _desc in sorts:
            if column not in self.schema.names or column in (ROW_DEPTH, ROW_EXPANDED) or \
                    column.startswith(CONSTITUENT_PREFIX):
                raise OperationError(f"cannot sort a rollup by {column!r}: not a column of its rows",
                                     "INVALID_ARGUMENT")
        return replace(self, sorts=tuple(sorts))


def view_schema(source: pa.Schema, group_by: Sequence[str], level: pa.Schema,
                constituents: bool = False) -> pa.Schema:
    """The columns of a rollup's rows: depth, expanded, the group-by columns (nullable), the
    aggregated columns of the deepest level, then with `constituents` every source column (named
    CONSTITUENT_PREFIX + its name)."""
    fields = [pa.field(ROW_DEPTH, pa.int32()), pa.field(ROW_EXPANDED, pa.bool_())]
    fields += [source.field(g).with_nullable(True) for g in group_by]
    fields += [f for f in level if f.name not in group_by]
    if constituents:
        fields += [pa.field(CONSTITUENT_PREFIX + f.name, f.type) for f in source]
    return pa.schema(fields)


def make_rollup(source: Table, aggs: Sequence["Agg"], group_by: Sequence[str], name: str,
                constituents: bool = False) -> Rollup:
    """The levels of a rollup of `source` (call inside the engine's `writing()`); OperationError
    for a group-by column the source lacks or that is also an aggregation's output. With
    `constituents`, the rows of the deepest level expand to the source rows they aggregate."""
    group_by = tuple(group_by)
    for g in group_by:
        if g not in source.schema.names:
            raise OperationError(f"unknown group-by column {g!r}", "INVALID_ARGUMENT")
    if len(set(group_by)) != len(group_by):
        raise OperationError(f"a group-by column is named twice: {list(group_by)}", "INVALID_ARGUMENT")
    outputs = [a.name for a in aggs]
    clash = [o for o in outputs if o in group_by or o in (ROW_DEPTH, ROW_EXPANDED)]
    if clash:
        raise OperationError(f"aggregation output {clash[0]!r} is also a group-by or structural column",
                             "INVALID_ARGUMENT")
    levels: list[Table] = []
    try:
        for k in range(len(group_by) + 1):
            levels.append(source.agg_by(list(aggs), list(group_by[:k]),
                                        name=unique_name(source.graph, f"{name}.level{k}")))
    except BaseException:
        for t in reversed(levels):
            t.graph.remove_table(t.name)
        raise
    schema = view_schema(source.schema, group_by, levels[-1].schema, constituents)
    return Rollup(source, tuple(aggs), group_by, tuple(levels), (), schema, constituents)


class RollupHandle(Table):
    """The table an exported rollup is held by: no rows, the rollup's columns; its parents are the
    levels, so holding it keeps them (and what they derive from) alive. `rollup` describes it."""

    def __init__(self, name: str, rollup: Rollup):
        self.rollup = rollup
        super().__init__(rollup.source.graph, name, rollup.schema, parents=rollup.levels)
        self.is_refreshing = rollup.source.is_refreshing

    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        return None


# -- expansion directives ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Directives:
    """Expansion directives: for each, its depth (>= 1), the group-by values of its node (a table
    of the group-by columns; values beyond depth - 1 are ignored) and its action byte."""

    depths: np.ndarray
    keys: pa.Table
    actions: np.ndarray

    @staticmethod
    def none(group_by: Sequence[str], schema: pa.Schema) -> "Directives":
        return Directives(np.zeros(0, np.int32), pa.table({g: pa.array([], schema.field(g).type) for g in group_by}),
                          np.zeros(0, np.int16))

    @staticmethod
    def from_key_table(keys: pa.Table, group_by: Sequence[str], schema: pa.Schema,
                       action_column: Optional[str]) -> "Directives":
        """The directives of a key table (Deephaven's: the group-by columns, `__DEPTH__` and
        optionally a byte action column, every row EXPAND without it). OperationError when a
        column is missing or of a type that cannot be read as the rollup's."""
        need = list(group_by) + [ROW_DEPTH] + ([action_column] if action_column else [])
        missing = [c for c in need if c not in keys.column_names]
        if missing:
            raise OperationError(f"key table is missing column {missing[0]!r} (it needs {need})", "INVALID_ARGUMENT")
        cols = {}
        for g in group_by:
            try:
                cols[g] = keys.column(g).cast(schema.field(g).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise OperationError(f"key table column {g!r} cannot be read as {schema.field(g).type}: {exc}",
                                     "INVALID_ARGUMENT") from None
        depth = keys.column(ROW_DEPTH).cast(pa.int32()).fill_null(-1).to_numpy()
        if action_column:
            act = keys.column(action_column).cast(pa.int16()).fill_null(EXPAND).to_numpy()
            # Deephaven's bytes are signed: expand-to-depth codes are 0x70 .. 0x7f
        else:
            act = np.full(keys.num_rows, EXPAND, np.int16)
        table = pa.table(cols) if cols else pa.table({"_": pa.nulls(keys.num_rows)}).drop(["_"])
        return Directives(np.asarray(depth, np.int32), table, np.asarray(act, np.int16))


# -- the flattened rows ---------------------------------------------------------------------------

def _codes(columns: Sequence[pa.Array]) -> np.ndarray:
    """One int64 id per row such that rows with equal values (nulls equal to nulls) share ids."""
    n = len(columns[0])
    if n == 0:
        return np.zeros(0, np.int64)
    parts = []
    for col in columns:
        enc = pc.dictionary_encode(col, null_encoding="encode")
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        parts.append(enc.indices.to_numpy(zero_copy_only=False).astype(np.int64))
    if len(parts) == 1:
        only: np.ndarray = parts[0]
        return only
    _u, inverse = np.unique(np.stack(parts, axis=1), axis=0, return_inverse=True)
    return np.asarray(inverse, np.int64).ravel()


def _match(left: pa.Table, right: pa.Table, names: Sequence[str]) -> np.ndarray:
    """For each row of `left`, the index of the row of `right` with the same values of `names`
    (right's rows are distinct on them), or -1."""
    if not names:
        return np.zeros(left.num_rows, np.int64) if right.num_rows else np.full(left.num_rows, -1, np.int64)
    both = [pa.concat_arrays([_array(right.column(c)), _array(left.column(c))]) for c in names]
    ids = _codes(both)
    lut = np.full(int(ids.max()) + 1 if ids.size else 0, -1, np.int64)
    lut[ids[:right.num_rows]] = np.arange(right.num_rows)
    found: np.ndarray = lut[ids[right.num_rows:]]
    return found


def _array(col: "pa.Array | pa.ChunkedArray") -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _ranks(level: pa.Table, sorts: Sequence[tuple[str, bool]]) -> np.ndarray:
    """The position of each row of `level` in its sorted order (stable; Deephaven's nulls are
    smaller than every value: first ascending, last descending)."""
    n = level.num_rows
    if not sorts or n == 0:
        return np.arange(n, dtype=np.int64)
    cols, keys = {}, []
    for i, (c, desc) in enumerate(sorts):
        if c not in level.column_names:  # a group-by column below this level: null on all its rows
            continue
        order = "descending" if desc else "ascending"
        col = _array(level.column(c))
        cols[f"n{i}"] = pc.is_valid(col)
        cols[f"v{i}"] = col
        keys += [(f"n{i}", order), (f"v{i}", order)]
    if not keys:
        return np.arange(n, dtype=np.int64)
    order_idx = pc.sort_indices(pa.table(cols), sort_keys=keys).to_numpy()
    rank = np.empty(n, np.int64)
    rank[order_idx] = np.arange(n)
    return rank


def expanded_rows(rollup: Rollup, levels: Sequence[pa.Table], directives: Directives) -> pa.Table:
    """The rows of `rollup` visible for `directives`, flattened depth first, given the levels'
    current rows (`levels[k]`: the group-by columns g1..gk then the aggregated columns)."""
    group_by = rollup.group_by
    n = len(group_by)
    schema = rollup.schema
    sizes = [t.num_rows for t in levels]
    parent = [np.zeros(sizes[0], np.int64)]  # level 0's parent: the root
    for k in range(1, n + 1):
        parent.append(_match(levels[k], levels[k - 1], group_by[:k - 1]))
    # actions per row: the total row is expanded by default, then the directives in order
    actions = [np.full(s, _NONE, np.int16) for s in sizes]
    if sizes[0]:
        actions[0][0] = EXPAND
    for d in np.unique(directives.depths):
        if not 1 <= d <= n + 1:
            continue
        sel = np.flatnonzero(directives.depths == d)
        rows = _match(directives.keys.take(pa.array(sel)), levels[d - 1], group_by[:d - 1])
        keep = rows >= 0
        rows, acts = rows[keep], directives.actions[sel][keep]
        if rows.size:
            # the last directive for a row counts
            _u, last = np.unique(rows[::-1], return_index=True)
            actions[d - 1][rows[::-1][last]] = acts[::-1][last]
    # expanded flags, remaining depth of automatic expansion and visibility, level by level
    expanded: list[np.ndarray] = []
    visible: list[np.ndarray] = []
    parent_remaining = np.zeros(1, np.int64)
    parent_open = np.ones(1, bool)  # the root is expanded and visible
    for k in range(n + 1):
        a = actions[k].astype(np.int64)
        pr = parent_remaining[parent[k]] if sizes[k] else np.zeros(0, np.int64)
        inherited = np.where(pr == _ALL, _ALL, np.maximum(pr - 1, 0))
        to_depth = a >= EXPAND_TO_DEPTH_BASE
        exp = np.where((a == EXPAND) | (a == EXPAND_ALL) | to_depth, True, np.where(a == CONTRACT, False, pr > 0))
        rem = np.select([a == EXPAND, a == EXPAND_ALL, to_depth, a == CONTRACT],
                        [0, _ALL, a - EXPAND_TO_DEPTH_BASE, 0], inherited)
        if k == n and not rollup.constituents:  # no children
            exp = np.zeros(sizes[k], bool)
            rem = np.zeros(sizes[k], np.int64)
        vis = parent_open[parent[k]] if sizes[k] else np.zeros(0, bool)
        expanded.append(exp)
        visible.append(vis)
        parent_remaining = np.where(exp, rem, 0)
        parent_open = vis & exp
    # depth-first order: each row's path of ranks from the total row down, -1 below its depth
    ranks = [_ranks(levels[k], rollup.sorts) for k in range(n + 1)]
    height = n + 2 if rollup.constituents else n + 1
    paths, parts = [], []
    for k in range(n + 1):
        idx = np.flatnonzero(visible[k])
        path = np.full((height, idx.size), -1, np.int64)
        anc = idx
        for j in range(k, -1, -1):
            path[j] = ranks[j][anc]
            if j:
                anc = parent[j][anc]
        paths.append(path)
        parts.append(_rows_of_level(levels[k], k, idx, expanded[k][idx], rollup))
    if rollup.constituents and parent_open.any():
        # the source rows under the expanded rows of the deepest level, in the source's order
        source = rollup.source
        keys = source.rowset.keys()
        under = _match(source.gather(list(group_by), keys), levels[n], group_by) if n else np.zeros(keys.size, np.int64)
        sel = np.flatnonzero(parent_open[under])
        rows_c = source.gather(None, keys[sel])
        rank_c = _ranks(rows_c, rollup.constituent_sorts())
        path = np.full((height, sel.size), -1, np.int64)
        path[n + 1] = rank_c
        anc = under[sel]
        for j in range(n, -1, -1):
            path[j] = ranks[j][anc]
            if j:
                anc = parent[j][anc]
        paths.append(path)
        parts.append(_constituent_rows(rows_c, n, schema))
    allpaths = np.concatenate(paths, axis=1) if paths else np.zeros((height, 0), np.int64)
    order = np.lexsort(allpaths[::-1]) if allpaths.shape[1] else np.zeros(0, np.int64)
    rows = pa.concat_tables(parts).combine_chunks()
    return rows.take(pa.array(order, pa.int64())) if rows.num_rows else rows


def _rows_of_level(level: pa.Table, k: int, idx: np.ndarray, exp: np.ndarray, rollup: Rollup) -> pa.Table:
    group_by, schema = rollup.group_by, rollup.schema
    n = len(group_by)
    take = pa.array(idx, pa.int64())
    m = idx.size
    arrays = [pa.array(np.full(m, k + 1, np.int32)),
              pa.array(exp, pa.bool_(), mask=np.full(m, k == n and not rollup.constituents))]
    for f in schema:
        if f.name in (ROW_DEPTH, ROW_EXPANDED):
            continue
        if (f.name in group_by and group_by.index(f.name) >= k) or f.name.startswith(CONSTITUENT_PREFIX):
            arrays.append(pa.nulls(m, f.type))
        else:
            arrays.append(_array(level.column(f.name)).take(take).cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _constituent_rows(rows: pa.Table, n: int, schema: pa.Schema) -> pa.Table:
    """Source rows as rows of the view: depth n + 2, no expanded flag, only the constituent columns."""
    m = rows.num_rows
    arrays = [pa.array(np.full(m, n + 2, np.int32)), pa.nulls(m, pa.bool_())]
    for f in schema:
        if f.name in (ROW_DEPTH, ROW_EXPANDED):
            continue
        if f.name.startswith(CONSTITUENT_PREFIX):
            arrays.append(_array(rows.column(f.name[len(CONSTITUENT_PREFIX):])).cast(f.type))
        else:
            arrays.append(pa.nulls(m, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


# -- the view table ----------------------------------------------------------------------------------

class _ArrowRows:
    """A RowStore over one Arrow table whose row i is row key i."""

    def __init__(self, table: pa.Table):
        self.table = table

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        t = self.table if columns is None else self.table.select(list(columns))
        return t.take(pa.array(np.asarray(slots, np.int64)))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return _array(self.table.column(name)).take(pa.array(np.asarray(slots, np.int64)))


def _changed(old: pa.Array, new: pa.Array) -> np.ndarray:
    """Per position, whether the values differ (nulls equal to nulls, NaN to NaN)."""
    if len(old) == 0:
        return np.zeros(0, bool)
    if pa.types.is_nested(old.type):  # no element-wise comparison: every row, when any differs
        return np.full(len(old), not old.equals(new), bool)
    eq = pc.fill_null(pc.equal(old, new), False)
    same = pc.or_(eq, pc.and_(pc.is_null(old), pc.is_null(new)))
    if pa.types.is_floating(old.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(old), pc.is_nan(new)), False))
    differs: np.ndarray = ~same.to_numpy(zero_copy_only=False)
    return differs


class RollupView(Table):
    """The expanded rows of a rollup (see the module docstring): a derived table of its levels and,
    when its directives come from a key table (`keys`, with `action_column`), of that table too:
    the directives are read again whenever it changes."""

    def __init__(self, name: str, rollup: Rollup, keys: Optional[Table] = None,
                 action_column: Optional[str] = None):
        self.rollup = rollup
        self.keys = keys
        self.action_column = action_column
        self.directives = self._read_directives()
        rows = self._compute()  # before joining the graph: a refusal leaves nothing behind
        # with constituents the source is a parent too: its rows show, changed or not in the levels
        parents = (rollup.levels + ((rollup.source,) if rollup.constituents else ()) +
                   ((keys,) if keys is not None and keys.is_refreshing else ()))
        super().__init__(rollup.source.graph, name, rollup.schema, parents=parents)
        self.is_refreshing = rollup.source.is_refreshing or (keys is not None and keys.is_refreshing)
        self._rows = _ArrowRows(rows)
        self.store = self._rows
        self.rowset = RowSet.range(0, rows.num_rows - 1)

    def _read_directives(self) -> Directives:
        group_by, schema = self.rollup.group_by, self.rollup.source.schema
        if self.keys is None or self.keys.size == 0:
            return Directives.none(group_by, schema)
        return Directives.from_key_table(self.keys.gather(), group_by, schema, self.action_column)

    def _compute(self) -> pa.Table:
        return expanded_rows(self.rollup, [t.gather() for t in self.rollup.levels], self.directives)

    @property
    def rows(self) -> pa.Table:
        """The current rows (call under the engine's lock)."""
        return self._rows.table

    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        if self.keys is not None and self.keys.name in updates:
            self.directives = self._read_directives()
        old = self._rows.table
        new = self._compute()
        n_old, n_new = old.num_rows, new.num_rows
        m = min(n_old, n_new)
        changed = np.zeros(m, bool)
        columns = []
        for name in self.schema.names:
            diff = _changed(_array(old.column(name))[:m], _array(new.column(name))[:m])
            if diff.any():
                changed |= diff
                columns.append(name)
        modified = np.flatnonzero(changed).astype(np.int64)
        if modified.size == 0 and n_old == n_new:
            return None
        self._prev = (modified, old.take(pa.array(modified)))
        self._rows = _ArrowRows(new)
        self.store = self._rows
        self.prev_rowset = self.rowset
        self.rowset = RowSet.range(0, n_new - 1)
        return TableUpdate(added=RowSet.range(m, n_new - 1) if n_new > m else RowSet(),
                           removed=RowSet.range(m, n_old - 1) if n_old > m else RowSet(),
                           modified=RowSet.from_keys(modified) if modified.size else RowSet(),
                           modified_columns=ModifiedColumnSet.of(columns if modified.size else ()))
