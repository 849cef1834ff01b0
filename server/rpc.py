"""Shared plumbing of the gRPC services: call errors, authentication, generic handlers.

All services run on one grpc.aio server. Handlers are registered generically from the method
table (`tickwire.protocol.proto.methods`), so no generated stubs are needed; FlightData travels as
raw bytes in both directions (no protobuf objects on the data path).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from typing import Any, Callable, Optional

import grpc

from tickwire.protocol.errors import ProtocolError
from tickwire.protocol.proto.methods import BIDI, CLIENT_STREAM, METHODS, SERVER_STREAM, UNARY
from tickwire.server.session import AuthError, ResolveError, Session

__all__ = ["CallError", "ServerContext", "build_handlers", "RAW"]

log = logging.getLogger("tickwire.server")

RAW = "raw"  # marker: the message travels as bytes, unparsed


class CallError(Exception):
    """Ends a call with a gRPC status; `code` is a status name such as "INVALID_ARGUMENT"."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a handler's exception is answered with."""
    if isinstance(exc, CallError):
        return grpc.StatusCode[exc.code], exc.message
    if isinstance(exc, AuthError):
        return grpc.StatusCode.UNAUTHENTICATED, str(exc)
    if isinstance(exc, ResolveError):
        return grpc.StatusCode[exc.code], str(exc)
    code = getattr(exc, "code", None)
    if isinstance(exc, ProtocolError):
        name = code if isinstance(code, str) and code in grpc.StatusCode.__members__ else "INVALID_ARGUMENT"
        return grpc.StatusCode[name], str(exc)
    ref = uuid.uuid4()
    log.error("internal error (reference %s)", ref, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc} (reference {ref})"


class ServerContext:
    """What every service needs: the graph, the scope, sessions, publishers and a worker pool."""

    def __init__(self, graph, scope, sessions, registry, executor, config: Optional[dict] = None):
        self.graph = graph
        self.scope = scope
        self.sessions = sessions
        self.registry = registry
        self.executor = executor
        self.config = dict(config or {})

    async def run(self, fn: Callable, *args) -> Any:
        """Runs blocking work (the graph's lock, encoding) off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    async def authenticate(self, context: grpc.aio.ServicerContext, *, send_header: bool = True) -> Session:
        session = self.sessions.authenticate(context.invocation_metadata() or ())
        if send_header:
            await context.send_initial_metadata((("authorization", f"Bearer {session.token}"),))
        return session


def _guard(fn, kind: str):
    """Turns exceptions into statuses (unary/client-stream and streaming shapes alike)."""
    if kind in (SERVER_STREAM, BIDI):
        @functools.wraps(fn)
        async def stream_wrapper(request, context):
            try:
                async for item in fn(request, context):
                    yield item
            except (asyncio.CancelledError, grpc.aio.AbortError, GeneratorExit):
                raise  # the call is over (cancelled by the client, aborted, or closed): nothing to report
            except BaseException as exc:  # noqa: BLE001 - every error becomes a status
                code, details = status_of(exc)
                await context.abort(code, details)
        return stream_wrapper

    @functools.wraps(fn)
    async def unary_wrapper(request, context):
        try:
            return await fn(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except BaseException as exc:  # noqa: BLE001
            code, details = status_of(exc)
            await context.abort(code, details)
    return unary_wrapper


def build_handlers(impls: dict[str, tuple[Callable, Any, Any]]) -> list[grpc.GenericRpcHandler]:
    """Generic handlers from {method path: (async fn, request codec, response codec)}.

    A codec is RAW (bytes pass through) or None (the method table's protobuf class). A method not
    in the method table takes a fourth element, its kind (UNARY, SERVER_STREAM, ...), and raw bytes."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path, (fn, req, resp, *kind) in impls.items():
        m = METHODS.get(path)
        if m is None:  # a method outside the method table: raw bytes both ways, kind given
            service, _sep, name = path[1:].rpartition("/")
            method_kind, deser, ser = kind[0], None, None
        else:
            service, name, method_kind = m.service, m.name, m.kind
            deser = None if req is RAW else m.request.FromString
            ser = None if resp is RAW else m.response.SerializeToString
        wrapped = _guard(fn, method_kind)
        factory = {UNARY: grpc.unary_unary_rpc_method_handler, SERVER_STREAM: grpc.unary_stream_rpc_method_handler,
                   CLIENT_STREAM: grpc.stream_unary_rpc_method_handler,
                   BIDI: grpc.stream_stream_rpc_method_handler}[method_kind]
        by_service.setdefault(service, {})[name] = factory(wrapped, request_deserializer=deser,
                                                            response_serializer=ser)
    return [grpc.method_handlers_generic_handler(s, h) for s, h in by_service.items()]
