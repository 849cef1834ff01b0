"""Deephaven's ApplicationService.ListFields: the tables of the global scope, then the ones
created or removed, for as long as the client listens."""
from __future__ import annotations

import asyncio

from tickwire.protocol.proto import application_pb2
from tickwire.protocol.proto.methods import APPLICATION_SERVICE
from tickwire.server.rpc import ServerContext, service_handlers

__all__ = ["ApplicationService"]


class ApplicationService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.poll = ctx.config.list_fields_poll_s

    def handlers(self) -> dict:
        return service_handlers(APPLICATION_SERVICE, {"ListFields": (self.list_fields, None, None)})

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
