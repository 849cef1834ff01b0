"""Tables of the update graph: the common base and static tables.

Every table has a name, an Arrow schema, a row set (`rowset`), the step of its last change
(`last_step`), attributes, listeners, and reads its values in bulk (`gather`). During a cycle a
changed table also exposes `prev_rowset` (its row set before the cycle) and `prev_gather` (the
values its modified rows had before the cycle). The source tables are in `sources.py`, the derived
tables in the `ops` package.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence, Union

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.errors import InputTypeError, SchemaMismatchError
from tickwire.server.engine.graph.aggspec import Agg
from tickwire.server.engine.graph.column_store import ColumnStore
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ROW_KEY, TableUpdate, column_names

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import TableFailure, UpdateGraph

__all__ = ["SchemaMismatchError", "Table", "StaticTable", "conform", "as_table", "register_operation", "unique_name",
           "column_pairs"]

log = logging.getLogger(__name__)

Listener = Callable[["Table", TableUpdate, int], None]
#: what a table reads and writes rows of: a RowSet, or row keys (an int64 array or a sequence)
Rows = Union[RowSet, npt.ArrayLike]
#: table input: a pyarrow Table, a RecordBatch or a sequence of RecordBatches
TableInput = Union[pa.Table, pa.RecordBatch, Sequence[pa.RecordBatch]]
#: one column of a view or select: a name, or a (new name, column name or Expression) pair
ColumnSpec = Union[str, tuple[str, Union[str, pc.Expression]]]
#: the columns of a view or select: one, a sequence of them, or a dict new name -> column name or Expression
ColumnSpecs = Union[ColumnSpec, Sequence[ColumnSpec], Mapping[str, Union[str, pc.Expression]]]


class RowStore(Protocol):
    """Where a table's values are read by storage slot: a ColumnStore, or a view's reading of its
    parent's values."""

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table: ...

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array: ...


def as_table(data: TableInput) -> pa.Table:
    """A pyarrow Table from a Table, a RecordBatch or a sequence of RecordBatches."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, (list, tuple)) and data and all(isinstance(b, pa.RecordBatch) for b in data):
        return pa.Table.from_batches(list(data))
    raise InputTypeError(f"expected a pyarrow Table or RecordBatch, got {type(data).__name__}")


def conform(table_name: str, schema: pa.Schema, data: TableInput, names: Optional[Sequence[str]] = None) -> pa.Table:
    """Checks `data` against `schema` (or only its columns `names`) and returns it with the
    columns in schema order and one chunk per column. Raises SchemaMismatchError."""
    t = as_table(data)
    want = list(names) if names is not None else list(schema.names)
    have = t.column_names
    if len(set(have)) != len(have):
        dup = next(n for n in have if have.count(n) > 1)
        raise SchemaMismatchError(f"table {table_name!r}: input has column {dup!r} more than once")
    missing = [n for n in want if n not in have]
    if missing:
        raise SchemaMismatchError(f"table {table_name!r}: input is missing column {missing[0]!r} "
                                  f"(type {schema.field(missing[0]).type})")
    wanted = set(want)
    extra = [n for n in have if n not in wanted]
    if extra:
        raise SchemaMismatchError(f"table {table_name!r}: input has column {extra[0]!r} "
                                  f"(type {t.schema.field(extra[0]).type}) that the table does not have")
    for n in want:
        got, expected = t.schema.field(n).type, schema.field(n).type
        if got != expected:
            raise SchemaMismatchError(f"table {table_name!r}: column {n!r} has type {got}, "
                                      f"expected {expected}")
    if have != want:
        t = t.select(want)
    return t.combine_chunks()


# The derived-table operations by name, `make(graph, name, parent, *args) -> Table`: each module
# of tickwire.server.engine.graph.ops registers its own when imported (the package imports them all), so
# this module, which they build on, imports none of them.
_operations: dict[str, Callable[..., "Table"]] = {}


def register_operation(operation: str, make: Callable[..., "Table"]) -> None:
    """Makes `make(graph, name, parent, *args)` the table that `Table.<operation>(*args, name=...)` returns."""
    _operations[operation] = make


#: join columns: "A" (the same name on both sides), "A=B" (A on the left, B on the right) or (A, B)
ColumnPairs = Union[str, tuple[str, str], Sequence[Union[str, tuple[str, str]]]]


def column_pairs(specs: Optional[ColumnPairs]) -> list[tuple[str, str]]:
    """Join columns as (left or output name, right name) pairs; see `ColumnPairs`."""
    if specs is None:
        return []
    if isinstance(specs, (str, tuple)):
        specs = [specs]
    out = []
    for s in specs:
        if isinstance(s, tuple):
            a, b = str(s[0]), str(s[1])
        elif "=" in s:  # "A==B" reads as "A=B", as Deephaven reads it
            a, b = (x.strip() for x in (s.split("==", 1) if "==" in s else s.split("=", 1)))
        else:
            a = b = s.strip()
        if not a or not b:
            raise InputTypeError(f"malformed join column {s!r}")
        out.append((a, b))
    return out


def unique_name(graph: "UpdateGraph", base: str) -> str:
    """`base`, or `base#2`, `base#3`, ... : the first name no table of the graph has."""
    with graph.lock:
        if base not in graph.tables:
            return base
        i = 2
        while f"{base}#{i}" in graph.tables:
            i += 1
        return f"{base}#{i}"


class Table:
    """A table in the update graph: a row set, column values, attributes and listeners."""

    is_refreshing = True
    # a session's table (an export or what it derives from): never resolvable or listed by name
    hidden: bool = False
    # a system table (the performance tables): resolved by name, listed only on request
    system: bool = False
    # a TableFailure once a derived table's computation (or its parent's) raised: it no longer
    # updates and its contents are not served (see UpdateGraph)
    failure: Optional["TableFailure"] = None

    def __init__(self, graph: "UpdateGraph", name: str, schema: pa.Schema, parents: Sequence["Table"] = ()):
        if not isinstance(schema, pa.Schema):
            raise TypeError(f"table {name!r}: schema must be a pyarrow Schema, got {type(schema).__name__}")
        self.graph = graph
        self.name = name
        self.schema = schema
        self.rowset = RowSet()
        self.prev_rowset: Optional[RowSet] = None
        self.last_step = 0
        self.attributes: dict[str, object] = {}
        self.listeners: list[Listener] = []
        self.parents: tuple[Table, ...] = tuple(parents)
        self.depth: int = 1 + max((p.depth for p in self.parents), default=-1)
        self.store: RowStore = ColumnStore(schema)
        # previous values of this cycle's modified rows: (sorted row keys, values)
        self._prev: Optional[tuple[np.ndarray, pa.Table]] = None
        graph.add_table(self)

    # -- reading ----------------------------------------------------------------------------------
    def stable_rows(self, rows: RowSet) -> RowSet:
        """Those of `rows` (the table's rows now, read under the graph's lock) whose values no
        cycle will change and that `gather` may read without the lock: a long DoGet reads them in
        pieces after releasing it. None here; see StaticTable, HistoryTable, WhereTable."""
        return RowSet()

    @property
    def size(self) -> int:
        return len(self.rowset)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """Storage slot of each row key."""
        return keys

    def gather(self, columns: Optional[Sequence[str]] = None, rowset: Optional[Rows] = None) -> pa.Table:
        """Values of `rowset` (a RowSet or an array of row keys; default: every row) in that order,
        as one Arrow table built in bulk. Call under the graph's lock (or from a listener) for
        values consistent with `rowset`."""
        names = column_names(self.schema, columns)
        if rowset is None:
            rowset = self.rowset
        keys = rowset.keys() if isinstance(rowset, RowSet) else np.asarray(rowset, dtype=np.int64).ravel()
        return self.store.gather(self.slots(keys), names)

    def gather_with_keys(self, columns: Optional[Sequence[str]] = None, rowset: Optional[Rows] = None,
                         key_column: str = ROW_KEY) -> pa.Table:
        """Like `gather`, with the row keys as a first int64 column `key_column` (the state form
        `apply_update` works on)."""
        if rowset is None:
            rowset = self.rowset
        keys = rowset.keys() if isinstance(rowset, RowSet) else np.asarray(rowset, dtype=np.int64).ravel()
        values = self.gather(columns, keys)
        return values.add_column(0, pa.field(key_column, pa.int64(), nullable=False), [pa.array(keys, pa.int64())])

    def gather_column(self, name: str, rowset: Optional[Rows] = None) -> pa.Array:
        return self.gather([name], rowset).column(0).combine_chunks()

    def to_arrow(self, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The whole table, read under the graph's lock."""
        with self.graph.lock:
            return self.gather(columns)

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """During this table's cycle: the values the modified rows (`keys`, post-shift row keys;
        default all of them) had before the cycle."""
        if self._prev is None:
            raise RuntimeError(f"table {self.name!r}: previous values exist only during a cycle that modified it")
        names = column_names(self.schema, columns)
        pkeys, values = self._prev
        want = pkeys if keys is None else (keys.keys() if isinstance(keys, RowSet)
                                            else np.asarray(keys, dtype=np.int64).ravel())
        idx = np.searchsorted(pkeys, want)
        if idx.size and (np.any(idx >= pkeys.size) or np.any(pkeys[np.minimum(idx, pkeys.size - 1)] != want)):
            raise KeyError(f"table {self.name!r}: previous values exist only for rows modified this cycle")
        return values.select(names).take(pa.array(idx, type=pa.int64()))

    # -- listening ------------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> Listener:
        """`fn(table, update, step)` runs in the cycle thread after each cycle that changed the table."""
        with self.graph.lock:
            self.listeners.append(fn)
        return fn

    def remove_listener(self, fn: Listener) -> None:
        with self.graph.lock:
            if fn in self.listeners:
                self.listeners.remove(fn)

    # -- derived tables (made by the operations of tickwire.server.engine.graph.ops) -------------------
    def _derive(self, operation: str, name: Optional[str], *args: Any) -> "Table":
        make = _operations.get(operation)
        if make is None:
            raise RuntimeError(f"no operation {operation!r} is registered "
                               f"(tickwire.server.engine.graph.ops registers them)")
        return make(self.graph, name or unique_name(self.graph, f"{self.name}.{operation}"), self, *args)

    def where(self, predicate: Union[pc.Expression, Callable[[pa.Table], Any]], name: Optional[str] = None,
              columns: Optional[Sequence[str]] = None) -> "Table":
        """The rows for which `predicate` holds: a pyarrow compute Expression (``pc.field("x") > 3``)
        or a callable ``values -> boolean array`` (given `columns` of the rows when set)."""
        return self._derive("where", name, predicate, columns)

    def sort(self, columns: Union[str, Sequence[str]], descending: Union[bool, Sequence[bool]] = False,
             name: Optional[str] = None, spacing: Optional[int] = None) -> "Table":
        """The rows ordered by `columns` (a name or names; `descending` a flag or one per column),
        ties in this table's row order. `spacing`: free row keys kept per row (default: they follow
        the table's size); a small one makes rows move as shifts more often."""
        return self._derive("sort", name, columns, descending, spacing)

    def view(self, columns: ColumnSpecs, name: Optional[str] = None) -> "Table":
        """Columns kept, renamed or computed: names, ``(new_name, column)`` and ``(name, Expression)``
        pairs, or a dict; computed columns are evaluated when read."""
        return self._derive("view", name, columns)

    def select(self, columns: ColumnSpecs, name: Optional[str] = None, row_variables: bool = False) -> "Table":
        """Like `view`, with the computed columns stored (computed once per change). With
        `row_variables`, expressions may read each row's position (fields "i" int32, "ii" int64)
        and row key ("k"), as Deephaven's formulas do: for static and append-only tables only."""
        return self._derive("select_numbered" if row_variables else "select", name, columns)

    def head(self, n: int, name: Optional[str] = None) -> "Table":
        """The first n rows."""
        return self._derive("head", name, n)

    def tail(self, n: int, name: Optional[str] = None) -> "Table":
        """The last n rows."""
        return self._derive("tail", name, n)

    def last_by(self, keys: Union[str, Sequence[str]], name: Optional[str] = None) -> "Table":
        """The latest row of each distinct value of `keys` (a keyed table)."""
        return self._derive("last_by", name, keys)

    def agg_by(self, aggs: Sequence[Agg], by: Union[str, Sequence[str]] = (), name: Optional[str] = None,
               preserve_empty: bool = False, initial_groups: Optional[pa.Table] = None,
               column_order: Optional[Sequence[str]] = None) -> "Table":
        """One row per distinct value of `by` (for no `by`, one row while the table has rows) with
        the aggregations `aggs` (`Agg("sum", "Qty", "Total")`, ...) of its rows, as Deephaven's
        agg_by answers: groups in the order they were first seen, each keeping its row."""
        return self._derive("agg_by", name, list(aggs), [by] if isinstance(by, str) else list(by),
                            preserve_empty, initial_groups, column_order)

    def agg_all_by(self, kind: str, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        """Aggregation `kind` ("sum", "avg", "min", "max", "first", "last", "median", "std", "var",
        "abs_sum", "count_distinct", "distinct", "unique", "group") of every column not in `by`."""
        keys = [by] if isinstance(by, str) else list(by)
        return self.agg_by([Agg(kind, c) for c in self.schema.names if c not in keys], keys, name)

    def sum_by(self, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        return self.agg_all_by("sum", by, name)

    def avg_by(self, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        return self.agg_all_by("avg", by, name)

    def min_by(self, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        return self.agg_all_by("min", by, name)

    def max_by(self, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        return self.agg_all_by("max", by, name)

    def median_by(self, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        return self.agg_by([Agg("median", c, average_evenly_divided=True) for c in self.schema.names
                            if c not in ([by] if isinstance(by, str) else list(by))], by, name)

    def first_by(self, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        return self.agg_all_by("first", by, name)

    def count_by(self, column: str, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        """The number of rows of each group, in column `column`."""
        return self.agg_by([Agg("count", name=column)], by, name)

    def select_distinct(self, columns: Union[str, Sequence[str]], name: Optional[str] = None) -> "Table":
        """The distinct values of `columns`, in the order first seen."""
        return self.agg_by([], columns, name)

    # -- joins (tickwire.server.engine.graph.ops.natural_join, where_in, merge, as_of_join) -------
    def natural_join(self, right: "Table", on: ColumnPairs, joins: Optional[ColumnPairs] = None,
                     name: Optional[str] = None, match: str = "error") -> "Table":
        """Each row with the columns `joins` ("New=Old" or names; None: every non-key column) of
        the `right` row whose `on` columns ("Left=Right" or names) equal its own; nulls where none
        has. `match`: "error" (a key with two right rows fails), "first", "last", "exactly_one"."""
        return self._derive("natural_join", name, right, column_pairs(on),
                            None if joins is None else column_pairs(joins), match)

    def exact_join(self, right: "Table", on: ColumnPairs, joins: Optional[ColumnPairs] = None,
                   name: Optional[str] = None) -> "Table":
        """Like natural_join, and every row must have exactly one right row."""
        return self._derive("exact_join", name, right, column_pairs(on),
                            None if joins is None else column_pairs(joins))

    def where_in(self, right: "Table", on: ColumnPairs, name: Optional[str] = None,
                 inverted: bool = False) -> "Table":
        """The rows whose `on` columns equal some row of `right`'s (`inverted`: of no row)."""
        return self._derive("where_in", name, right, column_pairs(on), inverted)

    def where_not_in(self, right: "Table", on: ColumnPairs, name: Optional[str] = None) -> "Table":
        return self.where_in(right, on, name, inverted=True)

    def join(self, right: "Table", on: Optional[ColumnPairs] = None, joins: Optional[ColumnPairs] = None,
             name: Optional[str] = None, reserve_bits: int = 10) -> "Table":
        """Cross join: each row once per `right` row whose `on` columns equal its own (every right
        row without `on`), with the columns `joins` (None: every right column not matched)."""
        return self._derive("cross_join", name, right, column_pairs(on),
                            None if joins is None else column_pairs(joins), reserve_bits)

    def aj(self, right: "Table", on: ColumnPairs, joins: Optional[ColumnPairs] = None, name: Optional[str] = None,
           rule: str = ">=") -> "Table":
        """As-of join: `on` is exact-match columns then the stamp column last ("Ts", "Ts=RTs",
        or with the rule in it as Deephaven writes it: "Ts>=RTs", "Ts>RTs"); each row gets the
        columns `joins` (None: every right column that is not matched) of the right row of its key
        with the greatest stamp at or before its own (`rule` ">": strictly before), nulls where
        none has."""
        return self._as_of(right, on, joins, name, rule)

    def raj(self, right: "Table", on: ColumnPairs, joins: Optional[ColumnPairs] = None, name: Optional[str] = None,
            rule: str = "<=") -> "Table":
        """Reverse as-of join: the right row with the least stamp at or after the row's ("Ts<=RTs";
        "<": strictly after)."""
        return self._as_of(right, on, joins, name, rule)

    def _as_of(self, right: "Table", on: ColumnPairs, joins: Optional[ColumnPairs], name: Optional[str],
               rule: str) -> "Table":
        specs = [on] if isinstance(on, (str, tuple)) else list(on)
        if not specs:
            raise InputTypeError("an as-of join needs a stamp column")
        last = specs[-1]
        if isinstance(last, str):
            for r in ("<=", ">=", "<", ">"):
                if r in last:
                    a, b = last.split(r, 1)
                    last, rule = (a.strip(), b.strip()), r
                    break
        stamp = column_pairs([last])[0]
        return self._derive("as_of_join", name, right, column_pairs(specs[:-1]), stamp, rule,
                            None if joins is None else column_pairs(joins))

    def multi_join(self, inputs: Sequence[tuple["Table", ColumnPairs, Optional[ColumnPairs]]],
                   name: Optional[str] = None) -> "Table":
        """One row per key of several tables: `inputs` are (table, on ("Out=Own" or names), joins
        (None: every column not a key)), this table first; each input has at most one row per key."""
        specs = [(t, column_pairs(on), None if joins is None else column_pairs(joins)) for t, on, joins in inputs]
        if not specs or specs[0][0] is not self:
            raise InputTypeError("multi_join: the first input is the table it is called on")
        return self._derive("multi_join", name, specs)

    def snapshot_when(self, trigger: "Table", stamps: Optional[ColumnPairs] = None, initial: bool = False,
                      incremental: bool = False, history: bool = False, name: Optional[str] = None) -> "Table":
        """This table as it was when `trigger` last changed, with the trigger's last row in the
        columns `stamps` ("New=Old" or names; None: all of them); see the snapshot_when module."""
        return self._derive("snapshot_when", name, trigger, None if stamps is None else column_pairs(stamps),
                            initial, incremental, history)

    def update_by(self, ops: Any, by: Union[str, Sequence[str]] = (), name: Optional[str] = None) -> "Table":
        """This table with cumulative, exponential and rolling operations per bucket of `by` (an
        operation or a list of them, made by the functions of `tickwire.server.engine.updateby`:
        ``t.update_by([cum_sum("Total=Qty"), ema_tick(10, "Ema=Px")], by="Sym")``)."""
        ops = list(ops) if isinstance(ops, (list, tuple)) else [ops]
        return self._derive("update_by", name, ops, [by] if isinstance(by, str) else list(by))

    def merge(self, others: Sequence["Table"], name: Optional[str] = None) -> "Table":
        """This table's rows, then each of `others`' (tables of the same columns)."""
        return self._derive("merge", name, [self, *others])

    # -- cycle hooks (called by the graph under its lock) ---------------------------------------
    def take_pending(self) -> list[Any]:
        """Called with the graph's intake lock held: the input queued since the last cycle."""
        return []

    def apply_pending(self, step: int, ops: list[Any]) -> Optional[TableUpdate]:
        """Sources: applies queued input; returns the cycle's update (None when nothing changed)."""
        return None

    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        """Derived tables: follows the parents' updates of this cycle."""
        return None

    def end_cycle(self) -> None:
        self._prev = None
        self.prev_rowset = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, rows={len(self.rowset)}, last_step={self.last_step})"


class StaticTable(Table):
    """A table that never changes."""

    is_refreshing = False
    store: ColumnStore

    def __init__(self, graph: "UpdateGraph", name: str, data: TableInput):
        data = as_table(data).combine_chunks()
        super().__init__(graph, name, data.schema)
        n = data.num_rows
        self.store.ensure(n)
        self.store.write(np.arange(n, dtype=np.int64), data)
        self.rowset = RowSet.range(0, n - 1)
        self.attributes = {"IsFlat": True}  # row keys are positions, as Deephaven marks its flat tables
        self.data = data

    def stable_rows(self, rows: RowSet) -> RowSet:
        return rows  # its data is immutable

    def gather(self, columns: Optional[Sequence[str]] = None, rowset: Optional[Rows] = None) -> pa.Table:
        """Contiguous row ranges are zero-copy slices of the table's data; other row sets a take."""
        data = self.data.select(column_names(self.schema, columns))
        if rowset is None:
            rowset = self.rowset
        if isinstance(rowset, RowSet) and rowset.is_single_range:
            return data.slice(rowset.first(), len(rowset)) if rowset else data.slice(0, 0)
        keys = rowset.keys() if isinstance(rowset, RowSet) else np.asarray(rowset, dtype=np.int64).ravel()
        return data.take(pa.array(keys, type=pa.int64()))
