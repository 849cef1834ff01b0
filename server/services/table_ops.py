"""Deephaven TableService operations on tickwire tables: Sort, Filter, UnstructuredFilter, View,
Select, Update (adding columns), Head, Tail, also inside Batch.

Each operation makes a derived table in the update graph (tickwire.server.engine.graph.ops), which stays
correct incrementally and can be exported, fetched and subscribed to like any other. A derived
table lives while an export holds it (or a derived table built on it); releasing the last export
removes it from the graph. They are hidden: no scope name reaches them, only their session's
export tickets.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import pyarrow as pa

from tickwire.server.engine import Engine, OperationError, Table
from tickwire.server.engine.graph.ops.project import ROW_VARIABLES
from tickwire.server.services.conditions import conditions_expression
from tickwire.server.services.dh_expr import ExpressionError, parse_column_specs, parse_filters
from tickwire.server.services.rpc import CallError, CreationError

__all__ = ["OPERATIONS", "BUILDERS", "EXTRA_SOURCES", "SOURCE_FIELDS", "SOURCE_LISTS", "Builder", "TableOps",
           "register"]

#: a builder of the operations of another module: (TableOps, request, source table) -> a function
#: that makes the derived table (called inside the engine's `writing()`); raises CallError for
#: requests it refuses
Builder = Callable[..., Callable[[], Table]]

# TableService method name -> Batch `op` field name, for the operations served
OPERATIONS = {
    "Sort": "sort", "Filter": "filter", "UnstructuredFilter": "unstructured_filter", "View": "view",
    "Select": "select", "Update": "update", "UpdateView": "update_view", "LazyUpdate": "lazy_update",
    "Head": "head", "Tail": "tail",
}
#: Batch `op` field name -> its builder, for the operations of other modules
BUILDERS: dict[str, Builder] = {}
#: Batch `op` field name -> the request's other TableReference fields the service resolves (when
#: set) and hands to the builder as keyword arguments (the tables they name)
EXTRA_SOURCES: dict[str, tuple[str, ...]] = {}
#: Batch `op` field name -> the request's field naming its main source, when not `source_id`
SOURCE_FIELDS: dict[str, str] = {}
#: Batch `op` field name -> the request's TableReferences of an operation on a list of tables (the
#: service resolves them and hands them to the builder as `sources`; the first is the main source)
SOURCE_LISTS: dict[str, Callable[..., list]] = {}


def register(method: str, field: str, builder: Builder, extra_sources: tuple[str, ...] = (),
             source_field: str = "source_id", source_list: Optional[Callable[..., list]] = None) -> None:
    """Serves TableService `method` (Batch op `field`) with `builder`; `extra_sources` names the
    request's TableReference fields (besides the main source, `source_field`) the builder is given
    as tables; `source_list(request)`, for an operation on a list of tables, their references."""
    OPERATIONS[method] = field
    BUILDERS[field] = builder
    if extra_sources:
        EXTRA_SOURCES[field] = tuple(extra_sources)
    if source_field != "source_id":
        SOURCE_FIELDS[field] = source_field
    if source_list is not None:
        SOURCE_LISTS[field] = source_list

class TableOps:
    """Builds derived tables for TableService requests and keeps session-owned tables alive while held.

    A session-owned table (a derived table made here, or a DoPut export, `adopt`ed) is hidden and
    counted: each export of it is a hold (`hold`/`drop`), and a derived table built on it keeps it
    as a parent. When neither holds it any more it leaves the graph, and its own parents are
    checked the same way. Tables of the global scope are never counted or removed. Every count
    change happens inside the engine's `writing()` (callers run off the event loop)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._holds: dict[Table, int] = {}  # owned table -> holds (exports, running batches)

    @property
    def owned(self) -> int:
        """How many session-owned tables are in the engine."""
        with self.engine.reading():
            return len(self._holds)

    def owns(self, table: Table) -> bool:
        with self.engine.reading():
            return table in self._holds

    # -- lifetime -------------------------------------------------------------------------------
    def adopt(self, table: Table) -> Table:
        """Makes `table` session-owned: hidden, and removed once nothing holds it."""
        with self.engine.writing():
            table.hidden = True
            self._holds.setdefault(table, 0)
        return table

    def hold(self, table: Table) -> None:
        with self.engine.writing():
            if table in self._holds:
                self._holds[table] += 1

    def drop(self, table: Table) -> None:
        """A hold on `table` ended: remove it (and parents made for it) once unused."""
        with self.engine.writing():
            n = self._holds.get(table)
            if n is None:
                return
            self._holds[table] = max(0, n - 1)
            self._collect(table)

    def drop_all(self, tables) -> None:
        with self.engine.writing():
            for t in tables:
                self.drop(t)

    def _collect(self, table: Table) -> None:
        with self.engine.writing():
            todo = [table]
            while todo:
                t = todo.pop()
                if self._holds.get(t, 1) > 0:
                    continue  # held, or not session-owned
                if not self.engine.remove_unused(t):
                    continue  # a derived table still uses it; it goes with that one
                del self._holds[t]
                todo.extend(t.parents)

    def name_for(self, source: Table, op: str) -> str:
        """The name of a derived table made from `source` by `op` (see `_name`)."""
        return self._name(source, op)

    def _name(self, source: Table, op: str) -> str:
        """Exports are not global-scope variables: their tables' names start with "__" (hidden)."""
        base = source.name if source.name.startswith("__") else f"__export.{source.name}"
        return self.engine.unique_name(f"{base}.{op}")

    # -- operations -------------------------------------------------------------------------------
    def build(self, kind: str, req, source: Table, extras: Optional[dict[str, Any]] = None) -> Table:
        """The derived table for operation `kind` (a Batch op field name) on `source`."""
        make: Optional[Callable[[], Table]] = None
        schema = source.schema
        if kind in BUILDERS:
            make = BUILDERS[kind](self, req, source, **(extras or {}))
        elif kind == "sort":
            if not req.sorts:
                raise CallError("Sort: no sort columns", "INVALID_ARGUMENT")
            cols, desc = [], []
            for s in req.sorts:
                if s.column_name not in schema.names:
                    raise CallError(f"Sort: unknown column {s.column_name!r}", "INVALID_ARGUMENT")
                if s.is_absolute:
                    raise CallError("Sort: absolute-value sorting is not supported", "UNIMPLEMENTED")
                if s.direction == 2:
                    raise CallError("Sort: REVERSE is not supported", "UNIMPLEMENTED")
                if s.direction not in (1, -1):  # as Deephaven: UNKNOWN (0) is no direction
                    raise CallError(f"Unexpected sort direction: {s.direction}", "INVALID_ARGUMENT")
                cols.append(s.column_name)
                desc.append(s.direction == -1)

            def make():
                return source.sort(cols, descending=desc, name=self._name(source, "sort"))
        elif kind == "unstructured_filter":
            try:
                where = parse_filters(list(req.filters), schema, clock=self.engine.clock)
            except ExpressionError as exc:
                raise CallError(f"Filter: {exc}", "INVALID_ARGUMENT") from None

            def make():
                return source.where(where, name=self._name(source, "where"))
        elif kind == "filter":
            expr = conditions_expression(req.filters, schema)

            def make():
                return source.where(expr, name=self._name(source, "where"))
        elif kind in ("view", "select", "update", "update_view", "lazy_update"):
            numbered = False  # the formulas read Deephaven's row variables i, ii or k
            try:
                specs = parse_column_specs(list(req.column_specs), schema, clock=self.engine.clock)
            except ExpressionError as exc:
                extra = [f for f in ROW_VARIABLES if f.name not in schema.names]
                try:
                    specs = parse_column_specs(list(req.column_specs), pa.schema(list(schema) + extra),
                                               clock=self.engine.clock)
                except ExpressionError:
                    raise CallError(f"{kind}: {exc}", "INVALID_ARGUMENT") from None
                numbered = True
                if source.is_refreshing and not (source.attributes.get("AppendOnly")
                                                 or source.attributes.get("AddOnly")):
                    raise CallError(f"{kind}: the row variables i, ii and k are served on static and append-only "
                                    f"tables only ({source.name!r} ticks otherwise), as in Deephaven",
                                    "INVALID_ARGUMENT") from None
            columns: list = []
            if kind in ("update", "update_view", "lazy_update"):
                new_names = {name for name, _e, _s in specs}
                columns = [n for n in schema.names if n not in new_names]
            for name, expr, src in specs:
                if expr is not None:
                    columns.append((name, expr))
                elif src == name:
                    columns.append(name)
                else:
                    columns.append((name, src))
            stored = kind in ("select", "update")

            def make():
                name = self._name(source, kind)
                if numbered:  # computed once per row, when it arrives: its position never changes
                    return source.select(columns, name=name, row_variables=True)
                return source.select(columns, name=name) if stored else source.view(columns, name=name)
        elif kind in ("head", "tail"):
            n = int(req.num_rows)
            if n < 0:
                raise CallError(f"{kind}: num_rows must be >= 0, got {n}", "INVALID_ARGUMENT")

            def make():
                name = self._name(source, kind)
                return source.head(n, name=name) if kind == "head" else source.tail(n, name=name)
        if make is None:
            raise CallError(f"TableService operation {kind!r} is not supported", "UNIMPLEMENTED")
        try:
            with self.engine.writing():
                return self.adopt(make())
        except OperationError as exc:  # arguments the operation refuses: said with the operation's name
            raise CreationError(f"{kind} on {source.name!r}: {exc}", exc.code) from None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            # pyarrow refusing the request's expressions (types that do not go together)
            raise CreationError(f"{kind} on {source.name!r}: {exc}", "INVALID_ARGUMENT") from None
