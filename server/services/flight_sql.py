"""Arrow Flight SQL on the Flight service, as Deephaven serves it: read-only queries of the global
scope's tables (their names are the SQL table names, with no catalog or schema), for Flight SQL
clients (ADBC's and JDBC's drivers, flightsql-dbapi, any FlightSqlClient).

- `GetFlightInfo` with a CMD descriptor holding a packed Flight SQL command:
  `CommandStatementQuery` and `CommandPreparedStatementQuery` run the SQL (server/services/sql.py
  says which) and answer the result's schema with a ticket; the catalog commands
  (`CommandGetTables`, `CommandGetCatalogs`, `CommandGetDbSchemas`, `CommandGetTableTypes`) answer
  a ticket that reads their table. Other commands are UNIMPLEMENTED, naming the command.
- `DoGet` of such a ticket (route byte 'q', then a packed `TicketStatementQuery` or catalog
  command): a query's result can be read once, by the session that ran it, within
  `QUERY_TIMEOUT_S` of the engine's clock (Deephaven's `FlightSQL.queryTimeout`, 5 s);
  a catalog ticket any number of times.
- `DoAction` `CreatePreparedStatement` / `ClosePreparedStatement`: a statement kept by its session
  until closed or the session ends (no parameters: a statement's text is run as it is).

Errors are said as Deephaven says them, prefixed "Flight SQL: ". What this module must not touch:
the engine's lock and tables' state (it builds tables through TableOps and the engine's public
calls) and the transports (it is called by FlightService with a session already checked)."""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import operator
import re
import secrets
import threading
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError

from tickwire.protocol.proto import flight_pb2, flight_sql_pb2
from tickwire.protocol.schema import ipc_encapsulated_schema
from tickwire.server.engine import Table, TableSpec
from tickwire.server.engine.publishing import TableWire
from tickwire.server.services.context import ServerContext
from tickwire.server.services.dh_expr import ExpressionError, parse_filters
from tickwire.server.services.rpc import CallError
from tickwire.server.services.sessions import ResolveError, Session
from tickwire.server.services.sql import (
    BoolOp,
    Column,
    ColumnItem,
    Compare,
    IsNull,
    Literal,
    LiteralItem,
    Not,
    Select,
    SqlError,
    Star,
    parse_select,
)

__all__ = ["FlightSql", "table_flight_info", "TICKET_ROUTE", "QUERY_TIMEOUT_S", "ACTION_CREATE", "ACTION_CLOSE",
           "TYPE_PREFIX"]

log = logging.getLogger(__name__)

TICKET_ROUTE = b"q"
TYPE_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
ACTION_CREATE = "CreatePreparedStatement"
ACTION_CLOSE = "ClosePreparedStatement"
QUERY_TIMEOUT_S = 5.0
#: unread query results and prepared statements one session may hold; past them the oldest
#: result goes, and a new statement is refused
MAX_PENDING_QUERIES = 64
MAX_PREPARED = 1024
#: the schema a prepared statement's creation answers: a placeholder, as Deephaven's (the
#: result's schema is only known when the statement runs)
_SENTINEL_SCHEMA = pa.schema([pa.field("DO_NOT_USE", pa.string())])
_NOT_OWNER = ("Must use the original session; is the client echoing the authentication token properly? Some "
              "clients may need to explicitly enable cookie-based authentication with the header "
              "x-deephaven-auth-cookie-request=true (namely, Java Flight SQL JDBC drivers, and maybe others).")
_CATALOG_COMMANDS = ("CommandGetTables", "CommandGetCatalogs", "CommandGetDbSchemas", "CommandGetTableTypes")
_KNOWN_COMMANDS = ("CommandGetSqlInfo", "CommandGetXdbcTypeInfo", "CommandGetPrimaryKeys", "CommandGetImportedKeys",
                   "CommandGetExportedKeys", "CommandGetCrossReference", "CommandStatementUpdate",
                   "CommandPreparedStatementUpdate", "CommandStatementSubstraitPlan", "CommandStatementIngest",
                   "CommandStatementQuery", "CommandPreparedStatementQuery") + _CATALOG_COMMANDS


def _error(message: str, code: str) -> CallError:
    return CallError(f"Flight SQL: {message}", code)


@dataclasses.dataclass
class _Query:
    session_id: int
    table: Table
    made: float  # the engine clock's monotonic() when run


@dataclasses.dataclass
class _Prepared:
    session_id: int
    sql: str


def _pack(message, name: str) -> bytes:
    return any_pb2.Any(type_url=TYPE_PREFIX + name, value=message.SerializeToString()).SerializeToString()


def _unpack(raw: bytes, what: str) -> tuple[str, bytes]:
    """(Flight SQL message name, its bytes) of a packed Any; CallError when it is not one."""
    try:
        packed = any_pb2.Any.FromString(raw)
    except DecodeError:
        raise _error(f"{what} is not a packed Flight SQL message", "INVALID_ARGUMENT") from None
    if not packed.type_url.startswith(TYPE_PREFIX):
        raise _error(f"{what} is not a Flight SQL message ({packed.type_url!r})", "INVALID_ARGUMENT")
    return packed.type_url[len(TYPE_PREFIX):], packed.value


def _parse(cls, raw: bytes, what: str):
    try:
        return cls.FromString(raw)
    except DecodeError:
        raise _error(f"{what} cannot be parsed", "INVALID_ARGUMENT") from None


def table_flight_info(table: Table, desc, ticket: bytes) -> flight_pb2.FlightInfo:
    """The FlightInfo of `table`, asked for by FlightDescriptor `desc` and read with `ticket`: its
    Deephaven schema, and its size unless it ticks (Flight's and Flight SQL's GetFlightInfo)."""
    info = flight_pb2.FlightInfo()
    info.schema = ipc_encapsulated_schema(TableWire(table).schema)
    info.flight_descriptor.CopyFrom(desc)
    ep = info.endpoint.add()
    ep.ticket.ticket = ticket
    info.total_records = -1 if table.is_refreshing else table.size
    info.total_bytes = -1
    return info


def is_flight_sql_command(desc) -> bool:
    """Whether a FlightDescriptor is a CMD holding a packed Flight SQL command."""
    if desc.type != flight_pb2.FlightDescriptor.CMD:
        return False
    try:
        return any_pb2.Any.FromString(desc.cmd).type_url.startswith(TYPE_PREFIX + "Command")
    except DecodeError:
        return False


def filter_predicate(pattern: str) -> Callable[[str], bool]:
    """A Flight SQL name pattern: `%` any run of characters, `_` any one; nothing else special;
    an empty pattern matches nothing (names are never empty), as Deephaven reads it."""
    if pattern == "":
        return lambda _name: False
    if pattern == "%":
        return lambda _name: True
    regex = re.compile("".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern),
                       re.S)
    return lambda name: regex.fullmatch(name) is not None


class FlightSql:
    """Flight SQL's commands, tickets and actions for one server (see the module's doc)."""

    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self._lock = threading.Lock()
        self._queries: collections.OrderedDict[bytes, _Query] = collections.OrderedDict()
        self._prepared: dict[bytes, _Prepared] = {}
        self._watched: set[int] = set()  # sessions whose end releases their queries and statements

    # -- lifetime -----------------------------------------------------------------------------------------
    def _watch(self, session: Session) -> None:
        with self._lock:
            if session.id in self._watched:
                return
            self._watched.add(session.id)
        session.on_end(lambda _reason: self._session_ended(session.id))

    def _session_ended(self, session_id: int) -> None:
        with self._lock:
            self._watched.discard(session_id)
            gone = [h for h, q in self._queries.items() if q.session_id == session_id]
            tables = [self._queries.pop(h).table for h in gone]
            for h in [h for h, p in self._prepared.items() if p.session_id == session_id]:
                del self._prepared[h]
        self._drop(tables)

    def _drop(self, tables: list[Table]) -> None:
        for t in tables:
            try:
                self.ctx.ops.drop(t)
            except Exception:  # one table's removal failing leaves the others to go  # noqa: BLE001
                log.exception("releasing a Flight SQL result %r failed", t.name)

    def _expired(self) -> list[Table]:
        """Removes the results not read in time (called with the lock held); their tables."""
        now = self.ctx.clock.monotonic()
        old = [h for h, q in self._queries.items() if now - q.made >= QUERY_TIMEOUT_S]
        return [self._queries.pop(h).table for h in old]

    @property
    def pending(self) -> int:
        """How many query results wait to be read."""
        with self._lock:
            return len(self._queries)

    @property
    def prepared(self) -> int:
        with self._lock:
            return len(self._prepared)

    # -- GetFlightInfo ----------------------------------------------------------------------------------
    async def flight_info(self, desc, session: Session) -> flight_pb2.FlightInfo:
        name, raw = _unpack(desc.cmd, "the descriptor's command")
        if name == "CommandStatementQuery":
            cmd = _parse(flight_sql_pb2.CommandStatementQuery, raw, name)
            if cmd.HasField("transaction_id"):
                raise _error("transaction ids are not supported", "INVALID_ARGUMENT")
            return await self._run(cmd.query, desc, session)
        if name == "CommandPreparedStatementQuery":
            cmd = _parse(flight_sql_pb2.CommandPreparedStatementQuery, raw, name)
            return await self._run(self._statement(cmd.prepared_statement_handle, session).sql, desc, session)
        if name in _CATALOG_COMMANDS:
            command = _parse(getattr(flight_sql_pb2, name), raw, name)
            table = await self.ctx.run(self._catalog_table, name, command)
            try:
                return table_flight_info(table, desc, TICKET_ROUTE + _pack(command, name))
            finally:  # the ticket makes it again when read
                await self.ctx.run(self.ctx.ops.drop, table)
        full = f"arrow.flight.protocol.sql.{name}"
        if name in _KNOWN_COMMANDS:
            raise _error(f"command '{full}' is unimplemented", "UNIMPLEMENTED")
        raise _error(f"command '{full}' is unknown", "INVALID_ARGUMENT")

    async def _run(self, sql: str, desc, session: Session) -> flight_pb2.FlightInfo:
        try:  # off the event loop: a query's text is as long as a message may be
            plan = await self.ctx.run(parse_select, sql)
        except SqlError as exc:
            raise _error(str(exc), exc.code) from None
        table = await self.ctx.run(self._build, plan)
        handle = secrets.token_bytes(16)
        self._watch(session)
        with self._lock:
            stale = self._expired()
            self._queries[handle] = _Query(session.id, table, self.ctx.clock.monotonic())
            mine = [h for h, q in self._queries.items() if q.session_id == session.id]
            for h in mine[:max(0, len(mine) - MAX_PENDING_QUERIES)]:
                stale.append(self._queries.pop(h).table)
        if stale:
            await self.ctx.run(self._drop, stale)
        ticket = flight_sql_pb2.TicketStatementQuery(statement_handle=handle)
        return table_flight_info(table, desc, TICKET_ROUTE + _pack(ticket, "TicketStatementQuery"))

    # -- DoGet ------------------------------------------------------------------------------------------------
    async def open(self, ticket: bytes, session: Session) -> tuple[Table, Callable[[], None]]:
        """The table a 'q' ticket names, and what to call once it has been sent."""
        name, raw = _unpack(ticket[1:], "the ticket")
        if name == "TicketStatementQuery":
            handle = _parse(flight_sql_pb2.TicketStatementQuery, raw, name).statement_handle
            with self._lock:
                stale = self._expired()
                query = self._queries.get(handle)
                if query is not None and query.session_id == session.id:
                    del self._queries[handle]
            if stale:
                await self.ctx.run(self._drop, stale)
            if query is None:
                raise _error("Unable to find Flight SQL query. Flight SQL tickets should be resolved promptly and "
                             "resolved at most once.", "NOT_FOUND")
            if query.session_id != session.id:
                raise _error(_NOT_OWNER, "PERMISSION_DENIED")
            table = query.table
            return table, lambda: self.ctx.ops.drop(table)
        if name in _CATALOG_COMMANDS:
            command = _parse(getattr(flight_sql_pb2, name), raw, name)
            table = await self.ctx.run(self._catalog_table, name, command)
            return table, lambda: self.ctx.ops.drop(table)
        raise _error(f"Invalid ticket, {name}", "FAILED_PRECONDITION")

    # -- DoAction -------------------------------------------------------------------------------------------
    def do_action(self, action, session: Session) -> list[bytes]:
        """The results of a Flight SQL action (bodies of Result messages)."""
        if action.type == ACTION_CREATE:
            name, raw = _unpack(action.body, "the action's body")
            req = _parse(flight_sql_pb2.ActionCreatePreparedStatementRequest, raw, name)
            if req.HasField("transaction_id"):
                raise _error("transaction ids are not supported", "INVALID_ARGUMENT")
            handle = secrets.token_bytes(16)
            self._watch(session)
            with self._lock:
                if sum(1 for p in self._prepared.values() if p.session_id == session.id) >= MAX_PREPARED:
                    raise _error(f"a session may hold {MAX_PREPARED} prepared statements; close some first",
                                 "RESOURCE_EXHAUSTED")
                self._prepared[handle] = _Prepared(session.id, req.query)
            result = flight_sql_pb2.ActionCreatePreparedStatementResult(
                prepared_statement_handle=handle, dataset_schema=ipc_encapsulated_schema(_SENTINEL_SCHEMA))
            return [_pack(result, "ActionCreatePreparedStatementResult")]
        if action.type == ACTION_CLOSE:
            name, raw = _unpack(action.body, "the action's body")
            req = _parse(flight_sql_pb2.ActionClosePreparedStatementRequest, raw, name)
            self._statement(req.prepared_statement_handle, session)
            with self._lock:
                self._prepared.pop(req.prepared_statement_handle, None)
            return []
        raise _error(f"Action type '{action.type}' is unimplemented", "UNIMPLEMENTED")

    def _statement(self, handle: bytes, session: Session) -> _Prepared:
        with self._lock:
            prepared = self._prepared.get(handle)
        if prepared is None:
            raise _error("Unknown Prepared Statement", "NOT_FOUND")
        if prepared.session_id != session.id:
            raise _error(_NOT_OWNER, "PERMISSION_DENIED")
        return prepared

    # -- tables ---------------------------------------------------------------------------------------------
    def _static(self, name: str, data: pa.Table) -> Table:
        engine = self.ctx.engine
        with engine.writing():
            table, _ = engine.get_or_create(TableSpec(engine.unique_name(f"__flightsql.{name}"), "static",
                                                      data=data, hidden=True))
            return self.ctx.ops.adopt(table)

    def _catalog_table(self, name: str, command) -> Table:
        s = pa.string()
        if name == "CommandGetTableTypes":
            return self._static("table_types", pa.table({"table_type": pa.array(["TABLE"], s)}))
        if name == "CommandGetCatalogs":
            return self._static("catalogs", pa.table({"catalog_name": pa.array([], s)}))
        if name == "CommandGetDbSchemas":
            return self._static("db_schemas", pa.table({"catalog_name": pa.array([], s),
                                                        "db_schema_name": pa.array([], s)}))
        # CommandGetTables: the scope's tables; none in a catalog or schema (there are none)
        none = ((command.HasField("catalog") and command.catalog != "")
                or (command.table_types and "TABLE" not in command.table_types)
                or command.HasField("db_schema_filter_pattern"))
        keep = (filter_predicate(command.table_name_filter_pattern)
                if command.HasField("table_name_filter_pattern") else (lambda _n: True))
        names = [] if none else [n for n in self.ctx.scope.names() if keep(n)]
        cols = {"catalog_name": pa.array([None] * len(names), s), "db_schema_name": pa.array([None] * len(names), s),
                "table_name": pa.array(names, s), "table_type": pa.array(["TABLE"] * len(names), s)}
        if command.include_schema:
            schemas = []
            for n in names:
                try:
                    schemas.append(ipc_encapsulated_schema(TableWire(self.ctx.scope.get(n)).schema))
                except ResolveError:  # removed meanwhile
                    schemas.append(ipc_encapsulated_schema(pa.schema([])))
            cols["table_schema"] = pa.array(schemas, pa.binary())
        return self._static("tables", pa.table(cols))

    def _build(self, plan: Select) -> Table:
        if plan.table is None:
            return self._static("select", _literal_row(plan))
        try:
            source = self.ctx.scope.get(plan.table)
        except ResolveError:
            raise _error(f"Object '{plan.table}' not found", "NOT_FOUND") from None
        names = list(source.schema.names)
        qualifiers = {plan.alias if plan.alias is not None else plan.table}

        def column(c: Column) -> str:
            if c.qualifier is not None and c.qualifier not in qualifiers:
                raise _error(f"Table '{c.qualifier}' not found", "NOT_FOUND")
            if c.name not in names:
                near = [n for n in names if n.lower() == c.name.lower()]
                hint = f"; did you mean '{near[0]}'?" if near else ""
                raise _error(f"Column '{c.name}' not found in any table{hint}", "NOT_FOUND")
            return c.name

        picked: list[tuple[str, str]] = []  # (result name, source column)
        for item in plan.items:
            if isinstance(item, Star):
                if item.qualifier is not None and item.qualifier not in qualifiers:
                    raise _error(f"Unknown identifier '{item.qualifier}'", "NOT_FOUND")
                picked.extend((n, n) for n in names)
            elif isinstance(item, ColumnItem):
                src = column(item.column)
                picked.append((item.alias if item.alias is not None else src, src))
        out = _check_names(_uniquify([p[0] for p in picked]))
        where = None
        if plan.where is not None:
            where = _condition(plan.where, column, source.schema, self.ctx.engine.clock)
        ops, engine = self.ctx.ops, self.ctx.engine
        with engine.writing():
            base = source
            if where is not None:
                base = ops.adopt(source.where(where, name=engine.unique_name(f"__flightsql.{source.name}.where")))
            columns = [n if n == src else (n, src) for n, (_a, src) in zip(out, picked)]
            return ops.adopt(base.view(columns, name=engine.unique_name(f"__flightsql.{source.name}.view")))


_COLUMN_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")


def _check_names(names: list[str]) -> list[str]:
    """Deephaven's columns are named as Java identifiers: others are refused, as Deephaven fails on them."""
    for n in names:
        if not _COLUMN_NAME.fullmatch(n):
            raise _error(f"'{n}' is not a valid column name (letters, digits, '_' and '$', not first a digit)",
                         "INVALID_ARGUMENT")
    return names


def _uniquify(names: list[str]) -> list[str]:
    """Names made distinct as Deephaven's SQL does: a repeated name gets the first free number."""
    seen: set[str] = set()
    out = []
    for n in names:
        if n in seen:
            i = 0
            while f"{n}{i}" in seen:
                i += 1
            n = f"{n}{i}"
        seen.add(n)
        out.append(n)
    return out


_ARROW = {"int": pa.int32(), "long": pa.int64(), "double": pa.float64(), "string": pa.string(),
          "char": pa.uint16(), "bool": pa.bool_()}


def _literal_row(plan: Select) -> pa.Table:
    names, arrays = [], []
    for item in plan.items:
        assert isinstance(item, LiteralItem)
        lit = item.literal
        value = ord(str(lit.value)) if lit.kind == "char" else lit.value
        names.append(item.alias if item.alias is not None else f"EXPR${item.position}")
        arrays.append(pa.array([value], _ARROW[lit.kind]))
    return pa.table(arrays, names=_check_names(_uniquify(names)))


def _java_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _value_text(lit: Literal, column_type: Optional[pa.DataType]) -> str:
    if lit.kind in ("string", "char"):
        s = str(lit.value)
        if column_type is not None and pa.types.is_uint16(column_type) and len(s) == 1:
            return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return _java_string(s)
    if lit.kind == "bool":
        return "true" if lit.value else "false"
    if lit.value is None:
        return "NULL_INT" if lit.kind == "int" else "NULL_LONG"
    if lit.kind == "double":
        return repr(float(str(lit.value)))
    return str(lit.value)


def _condition(cond, column: Callable[[Column], str], schema: pa.Schema, clock) -> pc.Expression:
    """A filter for a condition, with Deephaven's rules: a comparison is never null (null is below
    every value and equal to null; NaN unequal to everything), so NOT and OR of them are plain logic.
    Each comparison is the Deephaven filter of the same text (tickwire.server.services.dh_expr),
    except the ordering of strings, which Deephaven's SQL allows and its filter strings do not."""
    if isinstance(cond, Literal):
        return pc.scalar(bool(cond.value))
    if isinstance(cond, Not):
        return pc.invert(pc.coalesce(_condition(cond.part, column, schema, clock), pc.scalar(False)))
    if isinstance(cond, BoolOp):
        parts = [pc.coalesce(_condition(p, column, schema, clock), pc.scalar(False)) for p in cond.parts]
        return functools.reduce(operator.and_ if cond.op == "and" else operator.or_, parts)
    if isinstance(cond, IsNull):
        text = f"isNull({column(cond.column)})"
        text = f"!{text}" if cond.negated else text
    else:
        assert isinstance(cond, Compare) and isinstance(cond.left, Column)
        left = column(cond.left)
        left_type = schema.field(left).type
        if isinstance(cond.right, Column):
            right = column(cond.right)
        elif (cond.op in ("<", "<=", ">", ">=") and cond.right.kind in ("string", "char")
              and (pa.types.is_string(left_type) or pa.types.is_large_string(left_type))):
            field = pc.field(left)
            ordered = pc.coalesce(_ORDER[cond.op](field, pc.scalar(str(cond.right.value))), pc.scalar(False))
            return ordered | field.is_null() if cond.op in ("<", "<=") else ordered
        else:
            right = _value_text(cond.right, left_type)
        text = f"{left} {cond.op} {right}"
    try:
        return parse_filters([text], schema, clock=clock)
    except ExpressionError as exc:
        raise _error(f"the condition cannot be evaluated: {exc}", "INVALID_ARGUMENT") from None


_ORDER = {"<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}
