"""Deephaven's ConfigService: the clients' first call (it also opens the session) and the
authentication constants (docs/flows.md#sessions-and-authentication)."""
from __future__ import annotations

import platform

import pyarrow as pa

from tickwire.protocol.proto import config_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE
from tickwire.server.rpc import ServerContext, service_handlers

__all__ = ["ConfigService", "BARRAGE_VERSION"]

BARRAGE_VERSION = "1.0.0"


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

    async def authentication_constants(self, _req, context):
        await self.ctx.authenticate(context)
        return config_pb2.AuthenticationConstantsResponse()
