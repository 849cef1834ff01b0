"""The slice of Deephaven's gRPC services that its clients call before and around Flight.

ConfigService.GetConfigurationConstants (the clients' first call, which also opens the session),
SessionService (NewSession, RefreshSessionToken, CloseSession, Release, ExportFromTicket,
PublishFromTicket), TableService.FetchTable / GetExportedTableCreationResponse, the table
operations of `table_ops` (Sort, Filter, UnstructuredFilter, View, Select, Update, Head, Tail) alone
or in a Batch, and ApplicationService.ListFields (the tables of the global scope). BARRAGE-WIRE.md
§7.1. Every other TableService method answers UNIMPLEMENTED with its name.
"""
from __future__ import annotations

import asyncio
import platform

import pyarrow as pa

from tickwire.protocol.proto import application_pb2, config_pb2, session_pb2, table_pb2
from tickwire.protocol.proto.methods import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY
from tickwire.protocol.schema import ipc_encapsulated_schema
from tickwire.protocol.tickets import ExportTicket, TicketError, parse_ticket
from tickwire.server.barrage import TableWire
from tickwire.server.graph import Table
from tickwire.server.rpc import RAW, CallError, ServerContext
from tickwire.server.session import Session
from tickwire.server.table_ops import OPERATIONS, TableOps

__all__ = ["DeephavenServices", "BARRAGE_VERSION"]

BARRAGE_VERSION = "1.0.0"
CONFIG = "/io.deephaven.proto.backplane.grpc.ConfigService/"
SESSION = "/io.deephaven.proto.backplane.grpc.SessionService/"
TABLE = "/io.deephaven.proto.backplane.grpc.TableService/"
APPLICATION = "/io.deephaven.proto.backplane.grpc.ApplicationService/"


class DeephavenServices:
    def __init__(self, ctx: ServerContext, list_fields_poll_s: float = 1.0):
        self.ctx = ctx
        self.poll = list_fields_poll_s
        self.ops = TableOps(ctx.graph)

    def handlers(self) -> dict:
        handlers = {
            CONFIG + "GetConfigurationConstants": (self.configuration_constants, None, None),
            CONFIG + "GetAuthenticationConstants": (self.authentication_constants, None, None),
            SESSION + "NewSession": (self.new_session, None, None),
            SESSION + "RefreshSessionToken": (self.refresh_session, None, None),
            SESSION + "CloseSession": (self.close_session, None, None),
            SESSION + "Release": (self.release, None, None),
            SESSION + "ExportFromTicket": (self.export_from_ticket, None, None),
            SESSION + "PublishFromTicket": (self.publish_from_ticket, None, None),
            TABLE + "FetchTable": (self.fetch_table, None, None),
            TABLE + "GetExportedTableCreationResponse": (self.get_exported, None, None),
            TABLE + "Batch": (self.batch, None, None),
            APPLICATION + "ListFields": (self.list_fields, None, None),
        }
        for method, field_name in OPERATIONS.items():
            handlers[TABLE + method] = (self._operation(field_name), None, None)
        # the rest of TableService (every method of its .proto): UNIMPLEMENTED, by name
        for method in table_pb2.DESCRIPTOR.services_by_name["TableService"].methods:
            path = TABLE + method.name
            if path in handlers:
                continue
            kind = SERVER_STREAM if method.server_streaming and not method.client_streaming else \
                BIDI if method.server_streaming else CLIENT_STREAM if method.client_streaming else UNARY
            handlers[path] = (self._unimplemented(method.name, kind), RAW, RAW, kind)
        return handlers

    # -- config ------------------------------------------------------------------------------------------
    def _constants(self) -> dict[str, str]:
        from tickwire import __version__
        return {
            "barrage.version": BARRAGE_VERSION,
            "tickwire.version": __version__,
            "http.session.durationMs": str(self.ctx.sessions.duration_ms),
            "file.separator": "/",
            "python.version": platform.python_version(),
            "pyarrow.version": pa.__version__,
            "web.flattenViewports": "false",
        }

    async def configuration_constants(self, _req, context):
        await self.ctx.authenticate(context)
        resp = config_pb2.ConfigurationConstantsResponse()
        for k, v in self._constants().items():
            resp.config_values[k].string_value = v
        return resp

    async def authentication_constants(self, _req, context):
        await self.ctx.authenticate(context)
        return config_pb2.AuthenticationConstantsResponse()

    # -- sessions -------------------------------------------------------------------------------------------
    def _handshake_response(self, session: Session) -> session_pb2.HandshakeResponse:
        return session_pb2.HandshakeResponse(metadata_header=b"authorization", session_token=session.token.encode(),
                                             token_expiration_delay_millis=self.ctx.sessions.duration_ms)

    async def new_session(self, _req, context):
        session = await self.ctx.authenticate(context)
        return self._handshake_response(session)

    async def refresh_session(self, _req, context):
        session = await self.ctx.authenticate(context)
        return self._handshake_response(session)

    async def close_session(self, _req, context):
        session = await self.ctx.authenticate(context, send_header=False)
        held = list(session.exports.values())
        self.ctx.sessions.close(session)
        for table in held:
            await self.ctx.run(self.ops.drop, table)
        return session_pb2.CloseSessionResponse()

    @staticmethod
    def _export_id(ticket: bytes, what: str) -> int:
        try:
            t = parse_ticket(ticket)
        except TicketError as exc:
            raise CallError(exc.code, f"{what}: {exc}") from None
        if not isinstance(t, ExportTicket):
            raise CallError("INVALID_ARGUMENT", f"{what} must be an export ticket ('e' + int32 LE), got {ticket!r}")
        return t.export_id

    async def release(self, req, context):
        session = await self.ctx.authenticate(context)
        export_id = self._export_id(req.id.ticket, "Release id")
        table = session.exports.get(export_id)
        if not session.release(export_id):
            raise CallError("NOT_FOUND", f"export {export_id} does not exist in this session")
        if table is not None:
            await self.ctx.run(self.ops.drop, table)
        return session_pb2.ReleaseResponse()

    async def export_from_ticket(self, req, context):
        session = await self.ctx.authenticate(context)
        table = self.ctx.scope.resolve(req.source_id.ticket, session)
        session.export(self._export_id(req.result_id.ticket, "result_id"), table)
        return session_pb2.ExportResponse()

    async def publish_from_ticket(self, req, context):
        raise CallError("UNIMPLEMENTED", "PublishFromTicket: publishing exports to the global scope is not supported")

    # -- tables -------------------------------------------------------------------------------------------------
    def _creation_response(self, result_ticket: bytes, table: Table) -> table_pb2.ExportedTableCreationResponse:
        wire = TableWire(table)
        resp = table_pb2.ExportedTableCreationResponse(success=True, is_static=not table.is_refreshing,
                                                       size=table.size,
                                                       schema_header=ipc_encapsulated_schema(wire.schema))
        resp.result_id.ticket.ticket = result_ticket
        return resp

    def _source(self, ref, session: Session, earlier: list[Table] | None = None) -> Table:
        which = ref.WhichOneof("ref")
        if which == "ticket":
            return self.ctx.scope.resolve(ref.ticket.ticket, session)
        if which == "batch_offset":
            i = ref.batch_offset
            if earlier is None or not 0 <= i < len(earlier):
                raise CallError("INVALID_ARGUMENT", f"batch_offset {i} does not name an earlier operation")
            return earlier[i]
        raise CallError("INVALID_ARGUMENT", "source_id not supplied")

    def _fetch(self, req, session: Session, earlier=None) -> tuple[table_pb2.ExportedTableCreationResponse, Table]:
        table = self._source(req.source_id, session, earlier)
        return self._export_result(req, session, table), table

    def _export_result(self, req, session: Session, table: Table) -> table_pb2.ExportedTableCreationResponse:
        result = req.result_id.ticket
        if result:
            session.export(self._export_id(result, "result_id"), table)
            self.ops.hold(table)
        return self._creation_response(result, table)

    def _apply_op(self, kind: str, req, session: Session, earlier=None) -> tuple[table_pb2.ExportedTableCreationResponse,
                                                                                Table]:
        if kind == "fetch_table":
            return self._fetch(req, session, earlier)
        source = self._source(req.source_id, session, earlier)
        if req.result_id.ticket:
            self._export_id(req.result_id.ticket, "result_id")  # a bad ticket fails before the table is made
        table = self.ops.build(kind, req, source)
        try:
            return self._export_result(req, session, table), table
        except BaseException:
            self.ops.drop(table)
            raise

    def _operation(self, kind: str):
        async def handler(req, context):
            session = await self.ctx.authenticate(context)
            resp, _t = await self.ctx.run(self._apply_op, kind, req, session)
            return resp
        return handler

    @staticmethod
    def _unimplemented(name: str, kind):
        message = f"TableService.{name} is not supported by tickwire"
        if kind in (SERVER_STREAM, BIDI):
            async def stream(req, context):
                raise CallError("UNIMPLEMENTED", message)
                yield  # unreachable: makes this an async generator
            return stream

        async def unary(req, context):
            raise CallError("UNIMPLEMENTED", message)
        return unary

    async def fetch_table(self, req, context):
        session = await self.ctx.authenticate(context)
        resp, _t = self._fetch(req, session)
        return resp

    async def get_exported(self, ticket, context):
        session = await self.ctx.authenticate(context)
        table = self.ctx.scope.resolve(ticket.ticket, session)
        return self._creation_response(ticket.ticket, table)

    async def batch(self, req, context):
        session = await self.ctx.authenticate(context)
        done: list[Table] = []
        allowed = {"fetch_table", *OPERATIONS.values()}
        for i, op in enumerate(req.ops):  # refuse the whole batch before exporting anything
            which = op.WhichOneof("op")
            if which not in allowed:
                raise CallError("UNIMPLEMENTED", f"TableService.Batch operation {i} {which!r} is not supported")
        for op in req.ops:
            which = op.WhichOneof("op")
            resp, table = await self.ctx.run(self._apply_op, which, getattr(op, which), session, done)
            done.append(table)
            yield resp

    # -- applications -----------------------------------------------------------------------------------------
    @staticmethod
    def _field(name: str) -> application_pb2.FieldInfo:
        f = application_pb2.FieldInfo(field_name=name, field_description="query scope variable",
                                      application_id="scope")
        f.typed_ticket.ticket.ticket = b"s/" + name.encode()
        f.typed_ticket.type = "Table"
        return f

    async def list_fields(self, _req, context):
        await self.ctx.authenticate(context)
        known: set[str] = set()
        first = True
        while True:
            names = set(self.ctx.scope.names())
            created, removed = sorted(names - known), sorted(known - names)
            if first or created or removed:
                upd = application_pb2.FieldsChangeUpdate()
                upd.created.extend(self._field(n) for n in created)
                upd.removed.extend(self._field(n) for n in removed)
                yield upd
                first = False
            known = names
            await asyncio.sleep(self.poll)
