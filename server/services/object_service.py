"""Deephaven's ObjectService, for the objects tickwire has that are not tables: rollups (type
"HierarchicalTable"), whose HierarchicalTableDescriptor the JS API reads before it views them.

FetchObject answers the object's bytes at once; MessageStream answers a ConnectRequest with one
Data message holding them and ends the stream, as Deephaven does for objects that only have bytes
to give (its "fetch only" object types). Another type, or a ticket that names no rollup, is
refused with INVALID_ARGUMENT naming it; OpenMessageStream and NextMessageStream answer
UNIMPLEMENTED (the method table's stubs): tickwire's browsers stream both ways over websockets.
"""
from __future__ import annotations

from tickwire.protocol.proto import object_pb2
from tickwire.protocol.proto.methods import OBJECT_SERVICE
from tickwire.server.engine.hierarchical import RollupHandle
from tickwire.server.services.context import ServerContext
from tickwire.server.services.hierarchical_table_service import HIERARCHICAL_TABLE_TYPE, rollup_descriptor
from tickwire.server.services.rpc import CallError, service_handlers
from tickwire.server.services.sessions import Session

__all__ = ["ObjectService"]


class ObjectService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx

    def handlers(self) -> dict:
        return service_handlers(OBJECT_SERVICE, {
            "FetchObject": (self.fetch_object, None, None),
            "MessageStream": (self.message_stream, None, None),
        })

    async def _payload(self, typed_ticket, session: Session, what: str) -> bytes:
        kind = typed_ticket.type
        if kind != HIERARCHICAL_TABLE_TYPE:
            raise CallError(f"{what}: objects of type {kind!r} are not served (only {HIERARCHICAL_TABLE_TYPE!r})",
                            "INVALID_ARGUMENT")
        t = await self.ctx.resolve(typed_ticket.ticket.ticket, session)
        if not isinstance(t, RollupHandle):
            raise CallError(f"{what}: the ticket does not name a {HIERARCHICAL_TABLE_TYPE}", "INVALID_ARGUMENT")
        payload: bytes = await self.ctx.run(rollup_descriptor, t)
        return payload

    async def fetch_object(self, req, context):
        session = await self.ctx.authenticate(context)
        data = await self._payload(req.source_id, session, "FetchObject")
        return object_pb2.FetchObjectResponse(type=req.source_id.type, data=data)

    async def message_stream(self, request_iterator, context):
        session = await self.ctx.authenticate(context)
        first = None
        async for req in request_iterator:
            first = req
            break
        if first is None:
            return
        if first.WhichOneof("message") != "connect":
            raise CallError("MessageStream: the first message must be a ConnectRequest", "INVALID_ARGUMENT")
        data = await self._payload(first.connect.source_id, session, "MessageStream")
        yield object_pb2.StreamResponse(data=object_pb2.ServerData(payload=data))
