"""Deephaven's input tables: TableService.CreateInputTable makes one, InputTableService changes its rows.

CreateInputTable takes the columns of an Arrow schema (`schema`, an IPC schema message) or of an
exported table (`source_table_id`: only its columns, none of its rows, as in Deephaven) and makes
a session-owned table of one of three kinds:

- in-memory append-only: an append table; every add appends its rows;
- in-memory key-backed (`key_columns`): a keyed table; an add replaces the rows of the keys it
  names and appends the others (within one add the last row of a key wins, at the place of that
  key's first row), and a delete removes the rows of the keys it names (null keys included;
  keys that are not in the table are ignored);
- blink: a blink table; each add's rows are the table's rows for one cycle.

AddTableToInputTable writes the rows of another exported table of the session (its columns must be
the input table's, by name and Deephaven type, in any order); DeleteTableFromInputTable removes the
keys of another exported table (the key columns only) from a key-backed input table. Each returns
once a cycle has applied the change, so a later call of the client sees it. Refusals are
Deephaven's: INVALID_ARGUMENT with Deephaven's message ("Table can't be used as an input table",
"Provided tables's columns are not compatible: ...", "Provided input table does not support
delete.", "Invalid Key Table Definition: ..."), where Deephaven itself answers some of them with
an opaque "Details Logged w/ID" message.

An input table is marked as Deephaven marks it, so that the web client offers to edit it: the
table attribute "InputTable" (a value that is not sent: `deephaven:unsent.attribute.InputTable`),
`deephaven:inputtable.isKey` / `deephaven:inputtable.isValue` on its fields, and the schema
metadata `deephaven:tableMetadata`, a base64 DeephavenTableMetadata naming each column's kind.
An append-only table also has the attributes AddOnly, AppendOnly and IsFlat; a blink table
BlinkTable and IsFlat.
"""
from __future__ import annotations

import base64
import itertools
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

from tickwire.protocol.proto import inputtable_pb2, table_pb2
from tickwire.protocol.proto.methods import INPUT_TABLE_SERVICE
from tickwire.protocol.schema import DH_COMPONENT_TYPE, DH_TYPE, deephaven_type_for, ipc_encapsulated_schema
from tickwire.server.engine import CatalogError, Engine, OperationError, Table, TableSpec
from tickwire.server.engine.publishing import TableWire
from tickwire.server.services.context import ServerContext
from tickwire.server.services.exports import claim, export
from tickwire.server.services.rpc import CallError, service_handlers
from tickwire.server.services.sessions import ExportClaim

__all__ = ["InputTableService", "InputTable", "create_input_table", "input_table_for", "input_table_of",
           "INPUT_TABLE_ATTRIBUTE", "TABLE_METADATA"]

#: the table attribute that marks an input table (Deephaven's Table.INPUT_TABLE_ATTRIBUTE)
INPUT_TABLE_ATTRIBUTE = "InputTable"
#: the schema metadata key of the base64 DeephavenTableMetadata the web client reads
TABLE_METADATA = b"deephaven:tableMetadata"
IS_KEY = b"deephaven:inputtable.isKey"
IS_VALUE = b"deephaven:inputtable.isValue"

_KIND = table_pb2.CreateInputTableRequest.InputTableKind
_COLUMN = inputtable_pb2.InputTableColumnInfo
_counter = itertools.count(1)


@dataclass(frozen=True)
class InputTable:
    """The value of an input table's "InputTable" attribute: its kind ("append", "keyed" or
    "blink") and its key and value columns."""

    kind: str
    keys: tuple[str, ...]
    values: tuple[str, ...]


def input_table_of(table: Table) -> Optional[InputTable]:
    """The input-table description of `table`, or None when it is not an input table."""
    info = table.attributes.get(INPUT_TABLE_ATTRIBUTE)
    return info if isinstance(info, InputTable) else None


def _dh_type(f: pa.Field) -> tuple[str, Optional[bytes]]:
    """(Deephaven type, component type) of a column: Deephaven compares columns by these."""
    md = f.metadata or {}
    explicit = md.get(DH_TYPE)
    return (explicit.decode() if explicit else deephaven_type_for(f.type)), md.get(DH_COMPONENT_TYPE)


def _table_metadata(keys: tuple[str, ...], values: tuple[str, ...]) -> bytes:
    info = inputtable_pb2.InputTableMetadata()
    for name in keys:
        info.column_info[name].kind = _COLUMN.KIND_KEY
    for name in values:
        info.column_info[name].kind = _COLUMN.KIND_VALUE
    raw = inputtable_pb2.DeephavenTableMetadata(input_table_metadata=info).SerializeToString(deterministic=True)
    return base64.b64encode(raw)


def input_table_schema(columns: pa.Schema, keys: tuple[str, ...]) -> pa.Schema:
    """The schema of an input table with `columns` (their types, and their Deephaven type when one
    is given) and `keys`: each field marked key or value, the table's DeephavenTableMetadata."""
    fields = []
    for f in columns:
        md = {k: v for k, v in (f.metadata or {}).items() if k in (DH_TYPE, DH_COMPONENT_TYPE)}
        md[IS_KEY if f.name in keys else IS_VALUE] = b"true"
        fields.append(pa.field(f.name, f.type, nullable=True, metadata=md))
    values = tuple(n for n in columns.names if n not in keys)
    return pa.schema(fields, metadata={TABLE_METADATA: _table_metadata(keys, values)})


def _request_columns(req) -> Optional[pa.Schema]:
    """The columns a request's `schema` names (None when it names a source table instead)."""
    if req.WhichOneof("definition") != "schema":
        return None
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(req.schema))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError) as exc:
        raise CallError(f"CreateInputTable: schema is not an Arrow IPC schema message: {exc}",
                        "INVALID_ARGUMENT") from None
    if not len(schema):
        raise CallError("CreateInputTable: the schema has no columns", "INVALID_ARGUMENT")
    return schema


def _check_request(req) -> None:
    """What Deephaven checks before anything else (after the result ticket)."""
    if req.WhichOneof("definition") is None:
        raise CallError("Must specify one of schema and source_table_id", "INVALID_ARGUMENT")
    if req.kind.WhichOneof("kind") is None:
        raise CallError("Unrecognized InputTableKind", "INVALID_ARGUMENT")


def make_input_table(engine: Engine, req, columns: pa.Schema) -> Table:
    """A new (unregistered by name: hidden) input table of the request's kind with `columns`."""
    kind = req.kind.WhichOneof("kind")
    names = list(columns.names)
    keys: tuple[str, ...] = ()
    attributes: dict[str, object]
    if kind == "in_memory_key_backed":
        keys = tuple(dict.fromkeys(req.kind.in_memory_key_backed.key_columns))  # a key named twice counts once
        missing = [k for k in keys if k not in names]
        if missing:
            raise CallError(f"Missing key columns in definition: [{', '.join(missing)}], available columns: "
                            f"[{', '.join(names)}]", "INVALID_ARGUMENT")
        if not keys:
            raise CallError("CreateInputTable: an in-memory key-backed input table needs at least one key column",
                            "INVALID_ARGUMENT")
        table_kind, attributes = "keyed", {}
    elif kind == "in_memory_append_only":
        table_kind, attributes = "append", {"AddOnly": True, "AppendOnly": True, "IsFlat": True}
    else:
        table_kind, attributes = "blink", {"BlinkTable": True, "IsFlat": True}
    values = tuple(n for n in names if n not in keys)
    attributes[INPUT_TABLE_ATTRIBUTE] = InputTable(table_kind, keys, values)
    schema = input_table_schema(columns, keys)
    name = engine.unique_name(f"__input_table.{table_kind}.{next(_counter)}")
    spec = TableSpec(name, table_kind, schema, keys=keys, hidden=True, durable=False, attributes=attributes)
    try:
        table = engine.create(spec)
    except (CatalogError, OperationError) as exc:
        raise CallError(f"CreateInputTable: {exc}", "INVALID_ARGUMENT") from None
    return table


def _creation_response(result_ticket: bytes, table: Table) -> table_pb2.ExportedTableCreationResponse:
    resp = table_pb2.ExportedTableCreationResponse(success=True, is_static=not table.is_refreshing, size=table.size,
                                                   schema_header=ipc_encapsulated_schema(TableWire(table).schema))
    resp.result_id.ticket.ticket = result_ticket
    return resp


def input_table_for(ctx: ServerContext, req, source: Optional[Table]) -> Table:
    """The session-owned input table a CreateInputTableRequest asks for (`source`: the table its
    source_table_id names, when it names one). Runs off the event loop."""
    _check_request(req)
    columns = _request_columns(req) if source is None else source.schema
    assert columns is not None  # a schema request without one raised in _request_columns
    return ctx.ops.adopt(make_input_table(ctx.engine, req, columns))


def create_input_table(ctx: ServerContext):
    """The handler of TableService.CreateInputTable: the result ticket is claimed before anything
    is awaited, as for every one-shot operation, then the source table (when one is named) is
    waited for and the input table made and exported."""

    def make(req, source: Optional[Table], result: ExportClaim) -> table_pb2.ExportedTableCreationResponse:
        table = input_table_for(ctx, req, source)
        export(ctx.ops, result, table)
        return _creation_response(req.result_id.ticket, table)

    async def handler(req, context):
        session = ctx.session_of(context)
        try:
            if not req.result_id.ticket:
                raise CallError("CreateInputTable: No result ticket supplied", "FAILED_PRECONDITION")
            _check_request(req)
            result = claim(session, req.result_id.ticket)
        except BaseException:
            await ctx.send_session_header(context, session)
            raise
        with result:  # an error fails the claim: calls waiting for the ticket hear the same status
            await ctx.send_session_header(context, session)
            source = None
            if req.WhichOneof("definition") == "source_table_id":
                ref = req.source_table_id
                if ref.WhichOneof("ref") != "ticket":  # a batch_offset names nothing outside a Batch
                    raise CallError("CreateInputTable: source_table_id must be a ticket", "INVALID_ARGUMENT")
                source = await ctx.resolve(ref.ticket.ticket, session)
            return await ctx.run(make, req, source, result)

    return handler


# -- adding and deleting rows -----------------------------------------------------------------------

def _incompatible(target: pa.Schema, names: list[str], other: pa.Schema) -> list[str]:
    """Deephaven's "Table definition incompatibilities" of `other` against `target`'s columns `names`."""
    problems = []
    for n in names:
        if n not in other.names:
            problems.append(f"this column '{n}' is missing in other")
    for n in other.names:
        if n not in names:
            problems.append(f"other column '{n}' is missing in this")
    for n in names:
        if n in other.names:
            mine, theirs = _dh_type(target.field(n)), _dh_type(other.field(n))
            if mine[0] != theirs[0]:
                problems.append(f"column '{n}' is different ...\n\t    {n}: this dataType '{_short(mine[0])}' does "
                                f"not match other dataType '{_short(theirs[0])}'")
            elif mine[1] != theirs[1]:
                problems.append(f"column '{n}' is different ...\n\t    {n}: this componentType "
                                f"'{(mine[1] or b'').decode()}' does not match other componentType "
                                f"'{(theirs[1] or b'').decode()}'")
    return problems


def _short(dh_type: str) -> str:
    return dh_type.rpartition(".")[2] if dh_type.startswith("java.lang.") else dh_type


def _as_columns(data: pa.Table, target: pa.Schema, names: list[str]) -> pa.Table:
    """`data` with the columns `names` of `target`, in its order and Arrow types (the types of
    one Deephaven type may still differ in Arrow: timestamp units, string widths)."""
    data = data.select(names)
    want = pa.schema([target.field(n).remove_metadata() for n in names])
    if data.schema.remove_metadata() != want:
        try:
            data = data.cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise CallError(f"Provided tables's columns are not compatible: {exc}", "INVALID_ARGUMENT") from None
    return data


class InputTableService:
    """AddTableToInputTable and DeleteTableFromInputTable (see the module documentation)."""

    def __init__(self, ctx: ServerContext):
        self.ctx = ctx

    def handlers(self) -> dict:
        return service_handlers(INPUT_TABLE_SERVICE, {
            "AddTableToInputTable": (self.add_to_input_table, None, None),
            "DeleteTableFromInputTable": (self.delete_from_input_table, None, None),
        })

    async def _tables(self, context, target_ticket, other_ticket, other: str) -> tuple[Table, InputTable, Table]:
        session = await self.ctx.authenticate(context)
        if not target_ticket.ticket:
            raise CallError("inputTable: no ticket supplied", "INVALID_ARGUMENT")
        if not other_ticket.ticket:
            raise CallError(f"{other}: no ticket supplied", "INVALID_ARGUMENT")
        target = await self.ctx.resolve(target_ticket.ticket, session)
        source = await self.ctx.resolve(other_ticket.ticket, session)
        info = input_table_of(target)
        if info is None:
            raise CallError("Table can't be used as an input table", "INVALID_ARGUMENT")
        return target, info, source

    async def add_to_input_table(self, req, context):
        target, info, source = await self._tables(context, req.input_table, req.table_to_add, "tableToAdd")
        problems = _incompatible(target.schema, list(target.schema.names), source.schema)
        if problems:
            raise CallError("Provided tables's columns are not compatible: Table definition incompatibilities: \n\t"
                            + "\n\t".join(problems), "INVALID_ARGUMENT")
        await self.ctx.run(self._add, target, source)
        return inputtable_pb2.AddTableResponse()

    def _add(self, target: Table, source: Table) -> None:
        engine = self.ctx.engine
        _step, data = engine.snapshot(source)
        if data.num_rows:  # an add is a modification of every row of a key already there, as in Deephaven
            engine.write(target, _as_columns(data, target.schema, list(target.schema.names)), restate=True)

    async def delete_from_input_table(self, req, context):
        target, info, source = await self._tables(context, req.input_table, req.table_to_remove, "tableToRemove")
        if info.kind == "append":
            raise CallError("Provided input table does not support delete.", "INVALID_ARGUMENT")
        problems = []
        for k in info.keys:
            if k not in source.schema.names:
                problems.append(f'Key Column "{k}" does not exist.\n')
            elif _dh_type(source.schema.field(k)) != _dh_type(target.schema.field(k)):
                problems.append(f'Key Column "{k}" is not compatible.\n')
        extra = [n for n in source.schema.names if n not in info.keys]
        if extra:
            problems.append(f"Unknown key columns: [{', '.join(extra)}]")
        if problems:
            raise CallError("Invalid Key Table Definition: " + "".join(problems), "INVALID_ARGUMENT")
        if info.kind != "keyed":
            raise CallError("Provided input table does not support delete.", "INVALID_ARGUMENT")
        await self.ctx.run(self._delete, target, source, list(info.keys))
        return inputtable_pb2.DeleteTableResponse()

    def _delete(self, target: Table, source: Table, keys: list[str]) -> None:
        engine = self.ctx.engine
        _step, data = engine.snapshot(source)
        if data.num_rows:
            engine.write(target, None, delete=_as_columns(data, target.schema, keys))
