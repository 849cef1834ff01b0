"""Deephaven's ConfigService: the clients' first call (it also opens the session) and the
authentication constants (docs/flows.md#sessions-and-authentication).

GetAuthenticationConstants is asked before any login (Deephaven's grid page chooses its login
from `AuthHandlers`), so it needs no credentials (rpc.UNAUTHENTICATED_METHODS) and opens no
session."""
from __future__ import annotations

import platform

import pyarrow as pa

from tickwire.protocol.proto import config_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE
from tickwire.server.services.context import ServerContext
from tickwire.server.services.rpc import service_handlers
from tickwire.server.services.sessions import PSK_SCHEME

__all__ = ["ConfigService", "BARRAGE_VERSION", "ANONYMOUS_HANDLER", "PSK_HANDLER"]

BARRAGE_VERSION = "1.0.0"

#: Deephaven's names of its login handlers, as its AuthHandlers constant lists them
ANONYMOUS_HANDLER = "io.deephaven.auth.AnonymousAuthenticationHandler"
PSK_HANDLER = PSK_SCHEME  # io.deephaven.authentication.psk.PskAuthenticationHandler


class ConfigService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx

    def handlers(self) -> dict:
        return service_handlers(CONFIG_SERVICE, {
            "GetConfigurationConstants": (self.configuration_constants, None, None),
            "GetAuthenticationConstants": (self.authentication_constants, None, None),
        })

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

    def _auth_handlers(self) -> str:
        """The one login the server takes: the pre-shared key when it has one, else anonymous."""
        return PSK_HANDLER if self.ctx.sessions.psk is not None else ANONYMOUS_HANDLER

    async def authentication_constants(self, _req, _context):
        # no authenticate(): asked before login; answers no header and opens no session
        resp = config_pb2.AuthenticationConstantsResponse()
        resp.config_values["AuthHandlers"].string_value = self._auth_handlers()
        return resp
