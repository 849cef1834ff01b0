"""Deephaven's HierarchicalTableService for rollups: Rollup, Apply (sorts and filters), View (the
expanded rows, for DoExchange) and ExportSource; and the rollup's descriptor that ObjectService
hands out (`rollup_descriptor`).

A rollup is exported as a `RollupHandle` of the engine (tickwire.server.engine.hierarchical): a
table without rows whose parents are the rollup's levels (one `agg_by` of the source per prefix
of the group-by columns). Apply makes another handle: sorts share the levels, filters (on the
group-by columns only, as Deephaven allows) aggregate the filtered source anew. View makes a
`RollupView`, a derived table of the levels holding the rows the key table's expansions make
visible; the client subscribes to it by DoExchange like to any exported table, whole or by
viewport, and it ticks with the source, and with the key table when that one ticks (an upload's
rows arrive with a cycle: the view shows them from that cycle on).

With `include_constituents` the deepest aggregated rows expand to the source rows they aggregate
(Deephaven's grid asks for them by default); the descriptor names those columns as the source
does, after the aggregated ones (the view's own names for them carry a prefix, as one table
cannot hold two columns of one name).

Refused, each naming what: Tree (UNIMPLEMENTED by the method table's stub), update and format views
in Apply, absolute-value sorts, and the
aggregations Deephaven refuses for rollups (median, percentile, first and last row key).
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa

from tickwire.protocol.proto import hierarchicaltable_pb2, table_pb2
from tickwire.protocol.proto.methods import HIERARCHICAL_TABLE_SERVICE
from tickwire.protocol.schema import ipc_encapsulated_schema
from tickwire.server.engine import OperationError, Table
from tickwire.server.engine.graph.ops import Agg, expression_columns
from tickwire.server.engine.hierarchical import (
    CONSTITUENT_PREFIX,
    ROW_DEPTH,
    ROW_EXPANDED,
    Rollup,
    RollupHandle,
    RollupView,
    make_rollup,
)
from tickwire.server.engine.publishing import TableWire
from tickwire.server.services.aggregations import aggs_of_request
from tickwire.server.services.conditions import conditions_expression
from tickwire.server.services.context import ServerContext
from tickwire.server.services.exports import claim, export
from tickwire.server.services.rpc import CallError, service_handlers
from tickwire.server.services.sessions import Session

__all__ = ["HierarchicalTableService", "rollup_descriptor", "HIERARCHICAL_TABLE_TYPE"]

#: the ObjectService type of rollups and trees
HIERARCHICAL_TABLE_TYPE = "HierarchicalTable"

_UNSUPPORTED = {"median": "Median", "percentile": "Percentile", "first_row_key": "FirstRowKey",
                "last_row_key": "LastRowKey"}

# Deephaven's description of each aggregation kind (AggSpec.description()), for the column metadata
_DESCRIPTIONS = {"abs_sum": "absolute sum", "avg": "average", "first": "first", "last": "last", "max": "max",
                 "min": "min", "std": "standard deviation", "sum": "sum", "var": "variance", "group": "group"}

_TRUE = b"true"
_P = b"deephaven:"


def _description(a: Agg) -> str:
    if a.kind == "count":
        return "count"
    if a.kind in _DESCRIPTIONS:
        kind = _DESCRIPTIONS[a.kind]
    elif a.kind == "count_distinct":
        kind = "count distinct" + (" (counting nulls)" if a.include_nulls else "")
    elif a.kind == "distinct":
        kind = "distinct" + (" (including nulls)" if a.include_nulls else "")
    elif a.kind == "unique":
        kind = "unique" + (" (including nulls)" if a.include_nulls else " (excluding nulls)")
    elif a.kind == "weighted_avg":
        kind = f"average weighted by {a.other}"
    elif a.kind == "weighted_sum":
        kind = f"sum weighted by {a.other}"
    elif a.kind in ("sorted_first", "sorted_last"):
        kind = f"{'first' if a.kind == 'sorted_first' else 'last'} sorted by {a.other}"
    else:
        kind = a.kind
    return f"{a.column} aggregated with {kind}"


def rollup_schema(handle: RollupHandle) -> pa.Schema:
    """The schema of a rollup's rows as Deephaven describes it to its clients: the wire schema with
    the hierarchical-table and rollup markers on each field."""
    rollup = handle.rollup
    base = TableWire(handle).schema
    inputs = {a.name: (a.column or "") for a in rollup.aggs}
    descriptions = {a.name: _description(a) for a in rollup.aggs}
    fields = []
    for f in base:
        md = dict(f.metadata or {})
        if f.name.startswith(CONSTITUENT_PREFIX):  # Deephaven names them as the source does
            name = f.name[len(CONSTITUENT_PREFIX):]
            md[_P + b"rollupTable.isConstituentNodeColumn"] = _TRUE
            if name in rollup.group_by:
                md[_P + b"rollupTable.isGroupByColumn"] = _TRUE
            md.setdefault(_P + b"isSortable", _TRUE)
            fields.append(pa.field(name, f.type, f.nullable, metadata=md))
            continue
        if f.name in (ROW_DEPTH, ROW_EXPANDED):
            md[_P + b"hierarchicalTable.isStructuralColumn"] = _TRUE
            if f.name == ROW_DEPTH:
                md[_P + b"hierarchicalTable.isRowDepthColumn"] = _TRUE
                md[_P + b"hierarchicalTable.isExpandByColumn"] = _TRUE
            else:
                md[_P + b"hierarchicalTable.isRowExpandedColumn"] = _TRUE
        else:
            md[_P + b"rollupTable.isAggregatedNodeColumn"] = _TRUE
            if f.name in rollup.group_by:
                md[_P + b"rollupTable.isGroupByColumn"] = _TRUE
                md[_P + b"hierarchicalTable.isExpandByColumn"] = _TRUE
            else:
                md[_P + b"rollupTable.aggregationInputColumnName"] = inputs.get(f.name, "").encode()
                if f.name in descriptions:
                    md[_P + b"description"] = descriptions[f.name].encode()
        md.setdefault(_P + b"isSortable", _TRUE)
        fields.append(f.with_metadata(md))
    meta = dict(base.metadata or {})
    meta[_P + b"unsent.attribute.ColumnDescriptions"] = b""
    return pa.schema(fields, metadata=meta)


def rollup_descriptor(handle: RollupHandle) -> bytes:
    """The HierarchicalTableDescriptor of a rollup, serialized (what ObjectService answers)."""
    return hierarchicaltable_pb2.HierarchicalTableDescriptor(
        snapshot_schema=ipc_encapsulated_schema(rollup_schema(handle)),
        is_static=not handle.rollup.source.is_refreshing).SerializeToString()


class HierarchicalTableService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.ops = ctx.ops

    def handlers(self) -> dict:
        return service_handlers(HIERARCHICAL_TABLE_SERVICE, {
            "Rollup": (self.rollup, None, None),
            "Apply": (self.apply, None, None),
            "View": (self.view, None, None),
            "ExportSource": (self.export_source, None, None),
        })

    # -- plumbing ---------------------------------------------------------------------------------
    async def _run(self, context, result_ticket: bytes, what: str, make):
        """Claims `result_ticket` before anything is awaited, then awaits `make(session)` (the
        table to export, made off the event loop) and exports it."""
        session = self.ctx.session_of(context)
        try:
            if not result_ticket:
                raise CallError(f"{what}: No result ticket supplied", "FAILED_PRECONDITION")
            result = claim(session, result_ticket)
        except BaseException:
            await self.ctx.send_session_header(context, session)
            raise
        with result:
            await self.ctx.send_session_header(context, session)
            table = await make(session)
            await self.ctx.run(export, self.ops, result, table)
            return table

    async def _handle(self, ticket: bytes, session: Session, what: str) -> RollupHandle:
        t = await self.ctx.resolve(ticket, session)
        if not isinstance(t, RollupHandle):
            raise CallError(f"{what}: the ticket does not name a rollup", "INVALID_ARGUMENT")
        return t

    def _build(self, make, what: str) -> Table:
        """`make()` inside the engine's writing(), its tables session-owned; engine refusals as
        CallErrors naming `what`."""
        engine = self.ctx.engine
        try:
            with engine.writing():
                return make()
        except OperationError as exc:
            raise CallError(f"{what}: {exc}", exc.code) from None
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None

    def _new_rollup(self, source: Table, aggs, group_by, sorts=(), constituents: bool = False) -> RollupHandle:
        """A rollup's levels and handle, adopted (they go when nothing holds them any more)."""
        name = self.ops.name_for(source, "rollup")
        rollup = make_rollup(source, aggs, group_by, name, constituents)
        for level in rollup.levels:
            self.ops.adopt(level)
        if sorts:
            rollup = rollup.with_sorts(sorts)
        return self._handle_of(rollup, name)

    def _handle_of(self, rollup: Rollup, name: str) -> RollupHandle:
        engine = self.ctx.engine
        handle = RollupHandle(engine.unique_name(name), rollup)
        self.ops.adopt(handle)
        return handle

    # -- the calls ---------------------------------------------------------------------------------
    async def rollup(self, req, context):
        async def make(session: Session) -> Table:
            if not req.HasField("source_table_id"):
                raise CallError("Rollup: source_table_id not supplied", "INVALID_ARGUMENT")
            for a in req.aggregations:
                which = a.WhichOneof("type")
                if which == "columns":
                    which = a.columns.spec.WhichOneof("type")
                if which in _UNSUPPORTED:
                    raise CallError(f"Rollup: Agg{_UNSUPPORTED[which]} is not supported for rollup()",
                                    "INVALID_ARGUMENT")
            asked = aggs_of_request(req)
            aggs = [a for a in asked if isinstance(a, Agg) and a.kind != "partition"]
            if len(aggs) != len(asked):
                raise CallError("Rollup: formula and partition aggregations in rollups are not supported",
                                "UNIMPLEMENTED")
            source = await self.ctx.resolve(req.source_table_id.ticket, session)
            group_by = [g.strip() for g in req.group_by_columns]
            for a in aggs:
                for c in (a.column, a.other):
                    if c is not None and c not in source.schema.names:
                        raise CallError(f"Rollup: unknown column {c!r}", "INVALID_ARGUMENT")
            constituents = bool(req.include_constituents)
            return await self.ctx.run(self._build, lambda: self._new_rollup(source, aggs, group_by, (), constituents),
                                      "Rollup")
        await self._run(context, req.result_rollup_table_id.ticket, "Rollup", make)
        return hierarchicaltable_pb2.RollupResponse()

    async def apply(self, req, context):
        async def make(session: Session) -> Table:
            if req.update_views or req.format_views:
                raise CallError("Apply: update views and format views are not supported", "UNIMPLEMENTED")
            handle = await self._handle(req.input_hierarchical_table_id.ticket, session, "Apply")
            rollup = handle.rollup
            sorts = []
            for s in req.sorts:
                if s.is_absolute:
                    raise CallError("Apply: absolute-value sorting is not supported", "UNIMPLEMENTED")
                if s.direction not in (1, -1):
                    raise CallError(f"Apply: unexpected sort direction {s.direction}", "INVALID_ARGUMENT")
                sorts.append((s.column_name, s.direction == -1))
            sorts = sorts or list(rollup.sorts)
            if not req.filters:
                return await self.ctx.run(self._build, lambda: self._handle_of(
                    rollup.with_sorts(sorts), self.ops.name_for(rollup.source, "rollup")), "Apply")
            source = rollup.source
            try:
                expr = conditions_expression(req.filters, source.schema)
                used = expression_columns(expr, source.schema)
            except (pa.ArrowInvalid, pa.ArrowKeyError, KeyError) as exc:
                raise CallError(f"Apply: {exc}", "INVALID_ARGUMENT") from None
            other = [c for c in used if c not in rollup.group_by]
            if other:
                raise CallError(f"Apply: a rollup can be filtered on its group-by columns {list(rollup.group_by)} "
                                f"only, not on {other[0]!r}", "INVALID_ARGUMENT")

            def build() -> Table:
                filtered = self.ops.adopt(source.where(expr, name=self.ops.name_for(source, "where")))
                return self._new_rollup(filtered, list(rollup.aggs), rollup.group_by, sorts, rollup.constituents)
            return await self.ctx.run(self._build, build, "Apply")
        await self._run(context, req.result_hierarchical_table_id.ticket, "Apply", make)
        return hierarchicaltable_pb2.HierarchicalTableApplyResponse()

    async def view(self, req, context):
        async def make(session: Session) -> Table:
            which = req.WhichOneof("target")
            if which == "hierarchical_table_id":
                rollup = (await self._handle(req.hierarchical_table_id.ticket, session, "View")).rollup
            elif which == "existing_view_id":
                existing = await self.ctx.resolve(req.existing_view_id.ticket, session)
                if not isinstance(existing, RollupView):
                    raise CallError("View: existing_view_id does not name a view of a rollup", "INVALID_ARGUMENT")
                rollup = existing.rollup
            else:
                raise CallError("View: no target (hierarchical_table_id or existing_view_id) supplied",
                                "INVALID_ARGUMENT")
            keys: Optional[Table] = None
            action: Optional[str] = None
            if req.HasField("expansions"):
                keys = await self.ctx.resolve(req.expansions.key_table_id.ticket, session)
                if req.expansions.HasField("key_table_action_column"):
                    action = req.expansions.key_table_action_column

            def build() -> Table:
                engine = self.ctx.engine
                view = RollupView(engine.unique_name(self.ops.name_for(rollup.source, "view")), rollup, keys, action)
                return self.ops.adopt(view)
            return await self.ctx.run(self._build, build, "View")
        await self._run(context, req.result_view_id.ticket, "View", make)
        return hierarchicaltable_pb2.HierarchicalTableViewResponse()

    async def export_source(self, req, context):
        async def make(session: Session) -> Table:
            return (await self._handle(req.hierarchical_table_id.ticket, session, "ExportSource")).rollup.source
        table = await self._run(context, req.result_table_id.ticket, "ExportSource", make)
        wire = TableWire(table)
        resp = table_pb2.ExportedTableCreationResponse(success=True, is_static=not table.is_refreshing,
                                                       size=table.size,
                                                       schema_header=ipc_encapsulated_schema(wire.schema))
        resp.result_id.ticket.ticket = req.result_table_id.ticket
        return resp
