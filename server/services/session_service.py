"""Deephaven's SessionService: sessions (new, refresh, close) and exports (release, export from
a ticket, publish). Closing a session or releasing an export frees the tables only it held.

PublishFromTicket answers by the result ticket, as Deephaven routes it: to a shared ticket (`h` +
id) it shares one of the session's exports with every session for as long as that export lives
(tickwire.server.services.sessions.SharedTickets); to an export ticket it is ExportFromTicket; an
application ticket cannot be published to (FAILED_PRECONDITION, Deephaven's words). Deephaven also
publishes to a scope ticket (`s/<name>`: a variable of its global scope); tickwire's scope holds
only the server's own tables, so that one is refused (UNIMPLEMENTED).

TerminationNotification is held open for as long as the session lives (a browser treats its end
as "session over", and reconnects in a loop if it ends at once). As Deephaven 42 does, it ends
with UNAUTHENTICATED "Session has ended" when the session is closed or expires, and answers a
TerminationNotificationResponse (abnormal_termination false) when the server stops."""
from __future__ import annotations

import asyncio

from tickwire.protocol.proto import session_pb2
from tickwire.protocol.proto.methods import SESSION_SERVICE
from tickwire.protocol.tickets import AppTicket, ExportTicket, ScopeTicket, SharedTicket, TicketError, parse_ticket
from tickwire.server.services.context import ServerContext
from tickwire.server.services.exports import claim, export, export_id
from tickwire.server.services.rpc import CallError, service_handlers
from tickwire.server.services.sessions import SHUTDOWN, Session

__all__ = ["SessionService"]


class SessionService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.ops = ctx.ops
        # sessions that expire free their exports on the reaper's thread (never the event loop)
        ctx.sessions.on_expire = self.ops.drop_all

    def handlers(self) -> dict:
        return service_handlers(SESSION_SERVICE, {
            "NewSession": (self.new_session, None, None),
            "RefreshSessionToken": (self.refresh_session, None, None),
            "CloseSession": (self.close_session, None, None),
            "Release": (self.release, None, None),
            "ExportFromTicket": (self.export_from_ticket, None, None),
            "PublishFromTicket": (self.publish_from_ticket, None, None),
            "TerminationNotification": (self.termination_notification, None, None),
        })

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

    async def release(self, req, context):
        """Frees an export. An id still being made (or only named, by calls waiting for it) is
        cancelled, as Deephaven cancels it: its waiters are told so, and the call making it
        answers CANCELLED and keeps nothing."""
        session = await self.ctx.authenticate(context)
        try:
            route = parse_ticket(req.id.ticket)
        except TicketError:
            route = None  # export_id says what is wrong with it
        if route is not None and not isinstance(route, ExportTicket):  # a shared ticket, say: as Deephaven
            raise CallError(f"Could not resolve ticket 'id': found 0x{bytes(req.id.ticket).hex()} (hex)",
                            "FAILED_PRECONDITION")
        eid = export_id(req.id.ticket, "Release id")
        table = session.release(eid)
        if table is not None:
            await self.ctx.run(self.ops.drop, table)
        return session_pb2.ReleaseResponse()

    async def export_from_ticket(self, req, context):
        session = self.ctx.session_of(context)
        try:
            result = claim(session, req.result_id.ticket)
        except BaseException:
            await self.ctx.send_session_header(context, session)
            raise
        with result:
            await self.ctx.send_session_header(context, session)
            table = await self.ctx.resolve(req.source_id.ticket, session)
            await self.ctx.run(export, self.ops, result, table)
        return session_pb2.ExportResponse()

    async def publish_from_ticket(self, req, context):
        """See the module's docstring. A shared ticket is published only from an export of the
        session (Deephaven's FAILED_PRECONDITION for any other source); an export still being
        made is waited for, as every call naming one does."""
        session = self.ctx.session_of(context)
        try:
            if not req.HasField("source_id"):
                raise CallError("Source ticket not supplied", "INVALID_ARGUMENT")
            if not req.HasField("result_id"):
                raise CallError("Result ticket not supplied", "INVALID_ARGUMENT")
            try:
                target = parse_ticket(req.result_id.ticket)
            except TicketError as exc:
                raise CallError(f"PublishFromTicket result_id: {exc}", exc.code) from None
            if isinstance(target, ExportTicket):
                result = claim(session, req.result_id.ticket)  # before the first await, as ExportFromTicket
        except BaseException:
            await self.ctx.send_session_header(context, session)
            raise
        await self.ctx.send_session_header(context, session)
        if isinstance(target, ExportTicket):
            with result:
                table = await self.ctx.resolve(req.source_id.ticket, session)
                await self.ctx.run(export, self.ops, result, table)
            return session_pb2.PublishResponse()
        if isinstance(target, SharedTicket):
            try:
                source = parse_ticket(req.source_id.ticket)
            except TicketError as exc:
                raise CallError(f"PublishFromTicket source_id: {exc}", exc.code) from None
            if not isinstance(source, ExportTicket):
                raise CallError(f"Could not publish 'resultId' to shared ticket '{target.shared_id.hex()}' (hex): "
                                "can only publish directly from a session export to a shared ticket",
                                "FAILED_PRECONDITION")
            table = await self.ctx.resolve(req.source_id.ticket, session)
            self.ctx.scope.shared.publish(target.shared_id, session, source.export_id, table)
            return session_pb2.PublishResponse()
        if isinstance(target, AppTicket):
            raise CallError("Could not publish 'resultId': application tickets cannot be published to",
                            "FAILED_PRECONDITION")
        assert isinstance(target, ScopeTicket)
        raise CallError(f"PublishFromTicket to scope ticket 's/{target.name}': publishing to the global scope is "
                        "not supported (tickwire's scope holds only the server's own tables); publish to a shared "
                        "ticket ('h' + id) and fetch that from the other session", "UNIMPLEMENTED")

    async def termination_notification(self, _req, context):
        session = await self.ctx.authenticate(context)
        loop = asyncio.get_running_loop()
        ended: asyncio.Future = loop.create_future()

        def heard(reason: str) -> None:  # any thread: the one that ends the session
            def settle():
                if not ended.done():
                    ended.set_result(reason)
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # the loop is gone: nobody waits any more
                pass

        forget = session.on_end(heard)
        try:
            reason = await ended
        finally:
            forget()
        if reason == SHUTDOWN:
            return session_pb2.TerminationNotificationResponse(abnormal_termination=False,
                                                               reason="the server is shutting down")
        raise CallError("Session has ended", "UNAUTHENTICATED")
