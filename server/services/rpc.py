"""Shared plumbing of the gRPC services: call errors, authentication, generic handlers.

All services run on one grpc.aio server. Handlers are registered generically from the method
table (`tickwire.protocol.proto.methods`), so no generated stubs are needed; FlightData travels as
raw bytes in both directions (no protobuf objects on the data path).
"""
from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import uuid
from typing import Any, Callable, Optional, Protocol, Sequence

import grpc
from google.protobuf.message import DecodeError

from tickwire.errors import TickwireError
from tickwire.protocol.proto.methods import (
    ALL_METHODS,
    BIDI,
    CLIENT_STREAM,
    CONSOLE_METHODS,
    CONSOLE_SERVICE,
    METHODS,
    SERVER_STREAM,
    UNARY,
)

__all__ = ["CallError", "build_handlers", "guarded_methods", "GuardedMethod", "call_session", "status_of",
           "UNAUTHENTICATED_METHODS", "bind_call_session", "service_handlers", "with_stubs", "unimplemented", "RAW",
           "short", "MAX_DETAILS", "PeerResolver", "CallContext"]

log = logging.getLogger(__name__)

RAW = "raw"  # marker: the message travels as bytes, unparsed


class CallContext(Protocol):
    """All that handlers may use of their call's context. grpc.aio's ServicerContext has it; so
    must the websocket's (server/web/multiplex.py) and the in-process transport's
    (server/services/inprocess.py), which stand in for it (tests/test_layers.py checks both, and
    that the handlers use nothing else)."""

    def invocation_metadata(self) -> Any: ...

    async def send_initial_metadata(self, metadata: Any) -> None: ...

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> Any: ...

    def peer(self) -> str: ...

    def time_remaining(self) -> Optional[float]: ...


class CallError(TickwireError):
    """Ends a call with a gRPC status: `CallError(message, code)`, `code` a status name such as
    "INVALID_ARGUMENT" (the default), in the order every TickwireError takes them."""


class CreationError(CallError):
    """A well-formed request for a table the engine could not make from its sources (a column
    they lack, a duplicate right key): Deephaven's failure of an export once it runs, as opposed
    to a request refused on its face. A one-shot call ends with its status; a Batch answers it
    inside its stream, for that step and the steps made from it (TableService.batch)."""


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a handler's exception is answered with: a TickwireError's own, anything else
    INTERNAL with a reference id that the log line of its traceback carries too."""
    if isinstance(exc, TickwireError):  # every error raised on purpose carries its status
        return grpc.StatusCode[exc.code], str(exc)
    ref = uuid.uuid4()
    log.error("internal error (reference %s)", ref, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc} (reference {ref})"


_CALL_SESSION: contextvars.ContextVar = contextvars.ContextVar("tickwire_call_session", default=None)

def bind_call_session(session: Any) -> None:
    """Makes `session` the current call's (what `call_session` returns in it), for a call whose
    credentials were checked elsewhere."""
    _CALL_SESSION.set(session)


def call_session() -> Any:
    """The session the running call's credentials were checked for (by `guarded_methods`'
    precheck), or None outside such a call."""
    return _CALL_SESSION.get()


#: gRPC status details are sent in a trailer that clients cap at 16 KiB (after %-encoding); an
#: error message is cut well below that so that it always arrives as sent.
MAX_DETAILS = 1_000


def short(text: str, limit: int = MAX_DETAILS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return text[: limit - 40] + f"... ({len(text) - limit + 40} more characters)"


# -- peers ----------------------------------------------------------------------------------------------
#: `resolve(peer, metadata)`: the client's own address for a peer as grpcio names it (and the call's
#: metadata), else `peer` unchanged. The port splitter (tickwire.server.web) hands grpcio its
#: connections over a loopback hop, so grpcio sees 127.0.0.1:<the hop's port>, and a fan-out worker
#: forwards calls under its own address (naming the client in a header); the server passes a
#: resolver that sees through both to its handlers.
PeerResolver = Callable[[str, Sequence[tuple[str, object]]], str]


class _RealPeerContext:
    """A call's context whose `peer()` is the client's own address (every other attribute is the
    call's context's): what handlers log names the client, not the splitter's loopback hop."""

    __slots__ = ("_context", "_peer")

    def __init__(self, context, peer: str):
        self._context = context
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    def __getattr__(self, name):
        return getattr(self._context, name)


def _with_real_peer(context, resolve: Optional[PeerResolver]):
    if resolve is None:
        return context
    peer = context.peer()
    real = resolve(peer, context.invocation_metadata() or ())
    return context if real == peer else _RealPeerContext(context, real)


async def _abort(context, exc: BaseException, on_error: Optional[Callable[[grpc.StatusCode], None]] = None):
    code, details = status_of(exc)
    if on_error is not None:  # the server's metrics: every error status of a call passes here
        try:
            on_error(code)
        except Exception:  # noqa: BLE001 - counting never changes the answer
            log.debug("error counter", exc_info=True)
    await context.abort(code, short(details))


def _parser(message_cls, codec):
    """bytes -> request for one method: RAW passes bytes through; otherwise the protobuf class,
    whose decode errors become INVALID_ARGUMENT naming the message type."""
    if codec is RAW or message_cls is None:
        return None
    name = message_cls.DESCRIPTOR.full_name

    def parse(raw: bytes):
        try:
            return message_cls.FromString(raw)
        except DecodeError as exc:
            raise CallError(f"malformed {name} request: {short(exc, 200)}", "INVALID_ARGUMENT") from None
    return parse


async def _parsed_stream(request_iterator, parse):
    async for raw in request_iterator:
        yield parse(raw)


def _guard(fn, kind: str, parse=None, precheck=None, on_error=None, peer_resolver: Optional[PeerResolver] = None):
    """Checks credentials, then parses the request body, then runs the handler; every exception
    becomes a status (unary/client-stream and streaming shapes alike). Credentials come first, so
    an unauthenticated caller learns nothing about what its request would have done."""
    streaming_request = kind in (CLIENT_STREAM, BIDI)

    def prepare(request, context):
        if precheck is not None:
            _CALL_SESSION.set(precheck(context.invocation_metadata() or (), peer=context.peer()))
        if parse is None:
            return request
        return _parsed_stream(request, parse) if streaming_request else parse(request)

    if kind in (SERVER_STREAM, BIDI):
        @functools.wraps(fn)
        async def stream_wrapper(request, context):
            try:
                context = _with_real_peer(context, peer_resolver)
                async for item in fn(prepare(request, context), context):
                    yield item
            except (asyncio.CancelledError, grpc.aio.AbortError, GeneratorExit):
                raise  # the call is over (cancelled by the client, aborted, or closed): nothing to report
            except BaseException as exc:  # noqa: BLE001 - every error becomes a status
                await _abort(context, exc, on_error)
        return stream_wrapper

    @functools.wraps(fn)
    async def unary_wrapper(request, context):
        try:
            context = _with_real_peer(context, peer_resolver)
            return await fn(prepare(request, context), context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except BaseException as exc:  # noqa: BLE001
            await _abort(context, exc, on_error)
    return unary_wrapper


def unimplemented(name: str, kind: str, why: str = "") -> Callable:
    """A handler that answers UNIMPLEMENTED naming the method, and `why` when given (after the
    credentials check every registered method gets)."""
    message = f"{name} is not supported by tickwire" + (f": {why}" if why else "")
    if kind in (SERVER_STREAM, BIDI):
        async def stream(_req, _context):
            raise CallError(message, "UNIMPLEMENTED")
            yield  # unreachable: makes this an async generator
        return stream

    async def unary(_req, _context):
        raise CallError(message, "UNIMPLEMENTED")
    return unary


def service_handlers(service: str, impls: dict[str, tuple]) -> dict[str, tuple]:
    """{method path: (fn, request codec, response codec)} for one service's methods by name; each
    must be in the method table (tickwire.protocol.proto.methods), which gives its path and kind."""
    out = {}
    for name, impl in impls.items():
        path = f"/{service}/{name}"
        if path not in METHODS:
            raise ValueError(f"{path} is not in the method table")
        out[path] = impl
    return out


def with_stubs(impls: dict) -> dict:
    """`impls` plus an UNIMPLEMENTED stub for every other method of the services in `proto/`, so
    that each of them checks credentials like the rest."""
    out = dict(impls)
    for path, m in ALL_METHODS.items():
        if path not in out:
            out[path] = (unimplemented(f"{m.service.rpartition('.')[2]}.{m.name}", m.kind), RAW, RAW, m.kind)
    for name, kind in CONSOLE_METHODS.items():  # outside proto/: raw bytes, the kind given
        path = f"/{CONSOLE_SERVICE}/{name}"
        if path not in out:
            out[path] = (unimplemented(f"ConsoleService.{name}", kind, _NO_SCRIPTING), RAW, RAW, kind)
    return out


_NO_SCRIPTING = ("tickwire has no server-side scripting (no script sessions or consoles); tables arrive by "
                 "DoPut, from Python or by replication")

#: Methods answered without credentials: the browser asks which logins exist before it has any.
UNAUTHENTICATED_METHODS = frozenset({"/io.deephaven.proto.backplane.grpc.ConfigService/GetAuthenticationConstants"})


@dataclasses.dataclass(frozen=True)
class GuardedMethod:
    """One served method, ready for any transport: `fn(request, context)` takes the raw request
    bytes (or an async iterator of them) and a context with `invocation_metadata()`,
    `send_initial_metadata(md)` and `abort(code, details)`; it checks credentials, parses, runs
    the handler and turns every error into a status. `serialize` turns a response into bytes
    (None: the handler already yields bytes)."""
    path: str
    kind: str
    fn: Callable
    serialize: Optional[Callable[[Any], bytes]]


def guarded_methods(impls: dict[str, tuple[Callable, Any, Any]],
                    precheck: Optional[Callable[[Sequence], Any]] = None,
                    on_error: Optional[Callable[[grpc.StatusCode], None]] = None,
                    peer_resolver: Optional[PeerResolver] = None) -> dict[str, GuardedMethod]:
    """{method path: GuardedMethod} from {method path: (async fn, request codec, response codec)}.

    A codec is RAW (bytes pass through) or None (the method table's protobuf class). A method not
    in the method table takes a fourth element, its kind (UNARY, SERVER_STREAM, ...), and raw bytes.
    Requests always arrive as bytes: `precheck(metadata, peer=...)` (the session manager's authenticate)
    runs first, except for UNAUTHENTICATED_METHODS, and its session is what
    `ServerContext.authenticate` returns for the call; only then is the body parsed. `on_error(code)`
    hears the status code of every call that ends with an error (the server's metrics).
    `peer_resolver` turns the peer the transport reports into the client's own address (what a
    handler's `context.peer()` then answers)."""
    out = {}
    for path, entry in impls.items():
        fn, req, resp = entry[:3]
        kind: list[str] = list(entry[3:])
        m = METHODS.get(path)
        if m is None:  # a method outside the method table: raw bytes both ways, kind given
            method_kind, parse, ser = kind[0], None, None
        else:
            method_kind = m.kind
            parse = _parser(m.request, req)
            ser = None if resp is RAW else m.response.SerializeToString
        check = None if path in UNAUTHENTICATED_METHODS else precheck
        out[path] = GuardedMethod(path, method_kind, _guard(fn, method_kind, parse, check, on_error, peer_resolver),
                                  ser)
    return out


def build_handlers(impls: dict[str, tuple[Callable, Any, Any]],
                   precheck: Optional[Callable[[Sequence], Any]] = None,
                   on_error: Optional[Callable[[grpc.StatusCode], None]] = None,
                   peer_resolver: Optional[PeerResolver] = None) -> list[grpc.GenericRpcHandler]:
    """grpcio generic handlers for `guarded_methods(impls, precheck, on_error, peer_resolver)`."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for path, gm in guarded_methods(impls, precheck, on_error, peer_resolver).items():
        service, _sep, name = path[1:].rpartition("/")
        factory = {UNARY: grpc.unary_unary_rpc_method_handler, SERVER_STREAM: grpc.unary_stream_rpc_method_handler,
                   CLIENT_STREAM: grpc.stream_unary_rpc_method_handler,
                   BIDI: grpc.stream_stream_rpc_method_handler}[gm.kind]
        by_service.setdefault(service, {})[name] = factory(gm.fn, request_deserializer=None,
                                                            response_serializer=gm.serialize)
    return [grpc.method_handlers_generic_handler(s, h) for s, h in by_service.items()]
