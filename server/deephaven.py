"""The slice of Deephaven's gRPC services that its clients call before and around Flight.

ConfigService.GetConfigurationConstants (the clients' first call, which also opens the session),
SessionService (NewSession, RefreshSessionToken, CloseSession, Release, ExportFromTicket,
PublishFromTicket), TableService.FetchTable / GetExportedTableCreationResponse, the table
operations of `table_ops` (Sort, Filter, UnstructuredFilter, View, Select, Update, Head, Tail) alone
or in a Batch, and ApplicationService.ListFields (the tables of the global scope). See
docs/flows.md#sessions-and-authentication. Every other TableService method answers UNIMPLEMENTED with its name.
"""
from __future__ import annotations

import asyncio
import platform
from typing import Optional

import pyarrow as pa

from tickwire.protocol.proto import application_pb2, config_pb2, session_pb2, table_pb2
from tickwire.protocol.proto.methods import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY
from tickwire.protocol.schema import ipc_encapsulated_schema
from tickwire.protocol.tickets import ExportTicket, TicketError, parse_ticket
from tickwire.server.barrage import TableWire
from tickwire.server.graph import Table
from tickwire.server.rpc import RAW, CallError, ServerContext, unimplemented
from tickwire.server.session import Session
from tickwire.server.table_ops import OPERATIONS, TableOps

__all__ = ["DeephavenServices", "BARRAGE_VERSION"]

BARRAGE_VERSION = "1.0.0"
CONFIG = "/io.deephaven.proto.backplane.grpc.ConfigService/"
SESSION = "/io.deephaven.proto.backplane.grpc.SessionService/"
TABLE = "/io.deephaven.proto.backplane.grpc.TableService/"
APPLICATION = "/io.deephaven.proto.backplane.grpc.ApplicationService/"


class DeephavenServices:
    def __init__(self, ctx: ServerContext, list_fields_poll_s: Optional[float] = None):
        self.ctx = ctx
        self.poll = ctx.config.list_fields_poll_s if list_fields_poll_s is None else list_fields_poll_s
        self.ops: TableOps = ctx.scope.ops
        # sessions that expire free their exports on the reaper's thread (never the event loop)
        ctx.sessions.on_expire = self.ops.drop_all

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
            handlers[path] = (unimplemented(f"TableService.{method.name}", kind), RAW, RAW, kind)
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
        held = self.ctx.sessions.close(session)
        if held:
            await self.ctx.run(self.ops.drop_all, held)
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
        table = session.release(export_id)
        if table is None:
            raise CallError("NOT_FOUND", f"export {export_id} does not exist in this session")
        await self.ctx.run(self.ops.drop, table)
        return session_pb2.ReleaseResponse()

    def _export(self, session: Session, result_ticket: bytes, table: Table) -> None:
        """Exports `table` as the session's `result_ticket`; the export holds it until released."""
        export_id = self._export_id(result_ticket, "result_id")
        self.ops.hold(table)  # before the export: a session ending meanwhile drops this hold
        try:
            session.export(export_id, table)
        except BaseException:
            self.ops.drop(table)
            raise

    async def export_from_ticket(self, req, context):
        session = await self.ctx.authenticate(context)
        table = self.ctx.scope.resolve(req.source_id.ticket, session)
        await self.ctx.run(self._export, session, req.result_id.ticket, table)
        return session_pb2.ExportResponse()

    async def publish_from_ticket(self, req, context):
        raise CallError("UNIMPLEMENTED", "PublishFromTicket: publishing exports to the global scope is not supported")

    # -- tables -------------------------------------------------------------------------------------------------
    def _creation_response(self, result_ticket: bytes, table: Table,
                           batch_offset: int | None = None) -> table_pb2.ExportedTableCreationResponse:
        """The answer for a made table: `result_id` is its export ticket, or, for a Batch step
        without one, the step's `batch_offset` (as Deephaven answers: its clients skip those)."""
        wire = TableWire(table)
        resp = table_pb2.ExportedTableCreationResponse(success=True, is_static=not table.is_refreshing,
                                                       size=table.size,
                                                       schema_header=ipc_encapsulated_schema(wire.schema))
        if result_ticket or batch_offset is None:
            resp.result_id.ticket.ticket = result_ticket
        else:
            resp.result_id.batch_offset = batch_offset
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

    def _apply_op(self, kind: str, req, session: Session, earlier: list[Table] | None = None,
                  step: int | None = None) -> tuple[table_pb2.ExportedTableCreationResponse, Table]:
        """Makes (or, for fetch_table, finds) the table of one operation and exports it when the
        request names a result ticket; otherwise the table is held for the running Batch (the
        caller drops that hold when the batch ends). Runs off the event loop."""
        source = self._source(req.source_id, session, earlier)
        result = req.result_id.ticket
        if result:
            self._export_id(result, "result_id")  # a bad ticket fails before the table is made
        table = source if kind == "fetch_table" else self.ops.build(kind, req, source)
        if result:
            self._export(session, result, table)  # an owned table nobody holds goes at once on failure
        else:
            self.ops.hold(table)
        return self._creation_response(result, table, step), table

    @staticmethod
    def _need_result(req, name: str) -> None:
        # Deephaven refuses a one-shot operation without a result ticket (its result would be
        # unreachable); a Batch step may omit it when later steps use it by batch_offset
        if not req.result_id.ticket:
            raise CallError("FAILED_PRECONDITION", f"{name}: No result ticket supplied")

    def _operation(self, kind: str):
        method = next(m for m, f in OPERATIONS.items() if f == kind)

        async def handler(req, context):
            session = await self.ctx.authenticate(context)
            self._need_result(req, method)
            resp, _t = await self.ctx.run(self._apply_op, kind, req, session)
            return resp
        return handler

    async def fetch_table(self, req, context):
        session = await self.ctx.authenticate(context)
        self._need_result(req, "FetchTable")
        resp, _t = await self.ctx.run(self._apply_op, "fetch_table", req, session)
        return resp

    async def get_exported(self, ticket, context):
        session = await self.ctx.authenticate(context)
        if not ticket.ticket:
            raise CallError("FAILED_PRECONDITION", "No request ticket supplied")
        table = self.ctx.scope.resolve(ticket.ticket, session)
        return await self.ctx.run(self._creation_response, ticket.ticket, table)

    async def batch(self, req, context):
        """Deephaven's Batch: one answer per step, in order. A step with a result ticket is
        exported; one without is answered with its `batch_offset` and lives only as long as the
        batch's later steps need it (as the parent of what they made)."""
        session = await self.ctx.authenticate(context)
        allowed = {"fetch_table", *OPERATIONS.values()}
        for i, op in enumerate(req.ops):  # refuse the whole batch before exporting anything
            which = op.WhichOneof("op")
            if which not in allowed:
                raise CallError("UNIMPLEMENTED", f"TableService.Batch operation {i} {which!r} is not supported")
            ticket = getattr(op, which).result_id.ticket
            if ticket:
                self._export_id(ticket, f"Batch operation {i} result_id")
        done: list[Table] = []
        unexported: list[Table] = []  # held only while this batch runs
        try:
            for i, op in enumerate(req.ops):
                which = op.WhichOneof("op")
                step = getattr(op, which)
                resp, table = await self.ctx.run(self._apply_op, which, step, session, done, i)
                done.append(table)
                if not step.result_id.ticket:
                    unexported.append(table)
                yield resp
        finally:
            if unexported:
                try:  # not awaited: a cancelled call must still let go of its steps
                    self.ctx.executor.submit(self.ops.drop_all, unexported[::-1])
                except RuntimeError:  # the server is stopping: its worker pool is gone
                    pass

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
