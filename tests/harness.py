"""Service tests without sockets and without waiting on the wall clock.

`Services` is an engine on a ManualClock with the services of a server over it, answered in
process (tickwire.server.services.inprocess): the test steps the engine (`cycle()`) and the clock
(`advance(seconds)`), and talks to the services as a client does:

    with Services() as s:
        t = s.engine.create(TableSpec("t", "append", SCHEMA))
        client = s.client()                                # tickwire's BarrageClient, no socket
        sub = client.subscribe("t")
        s.write(t, batch)                                  # queued, then applied by one cycle
        assert s.until(lambda: sub.size == len(batch))
        resp = s.call(TABLE_SERVICE, "Sort", request, token=session_token)   # a Deephaven call
        s.advance(301)                                     # a lease runs out: no sleeping

Calls take the same path as on the gRPC port: credentials first, then parsing, then the handler,
every error a status (`grpc.RpcError` with `code()` and `details()`).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Optional

import grpc

from tickwire.clients.client import BarrageClient
from tickwire.clock import ManualClock
from tickwire.protocol.proto.methods import METHODS, SESSION_SERVICE
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine, EngineConfig
from tickwire.server.services.inprocess import InProcessChannel, InProcessServer

__all__ = ["Services", "ANONYMOUS", "until"]

ANONYMOUS = (("authorization", "Anonymous"),)


def until(predicate: Callable[[], object], timeout: float = 30.0) -> bool:
    """Whether `predicate()` holds now or becomes true within `timeout` real seconds: for what
    another thread of the process finishes (a handler on the in-process loop, a client's reader)
    after the test has done everything that causes it. The bound only ends a test that would
    otherwise hang; a passing test never waits for it to run out."""
    done = threading.Event()
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.daemon = True
    timer.start()
    try:
        while not deadline.is_set():
            if predicate():
                return True
            done.wait(0.002)
        return bool(predicate())
    finally:
        timer.cancel()


class Services:
    """An engine on a ManualClock and the services of a server over it, answered in process."""

    def __init__(self, config: Optional[ServerConfig] = None, *, engine: Optional[Engine] = None,
                 engine_config: Optional[EngineConfig] = None, **options):
        self.clock = ManualClock() if engine is None else engine.clock
        self.engine = engine if engine is not None else Engine(engine_config, clock=self.clock)
        self.server = InProcessServer(self.engine, config, **options)
        self.ctx = self.server.ctx
        self.sessions = self.server.sessions
        self._clients: list[BarrageClient] = []

    def __enter__(self) -> "Services":
        self.server.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()
        self.server.stop()
        self.engine.stop()

    # -- the engine and time ----------------------------------------------------------------------------------
    def write(self, table, data=None, **kw) -> bool:
        """Queues a write (Engine.write without waiting); `cycle()` applies it."""
        return self.engine.write(table, data, wait=False, **kw)

    def cycle(self, n: int = 1) -> int:
        """Runs `n` cycles; returns the step."""
        for _ in range(n):
            self.engine.run_cycle()
        return self.engine.step

    def advance(self, seconds: float) -> float:
        """Moves the clock forward (leases, TTLs, update intervals)."""
        return self.clock.advance(seconds)

    @staticmethod
    def until(predicate: Callable[[], object], timeout: float = 30.0) -> bool:
        return until(predicate, timeout)

    # -- clients ----------------------------------------------------------------------------------------------
    def channel(self, peer: str = "in-process") -> InProcessChannel:
        return self.server.channel(peer)

    def client(self, **kw) -> BarrageClient:
        """tickwire's client over an in-process channel (keepalive off: the clock is the test's)."""
        kw.setdefault("keepalive", False)
        c = BarrageClient("in-process", channel=self.channel(), clock=self.clock, **kw)
        self._clients.append(c)
        return c

    def call(self, service: str, method: str, request: Any = None, *, token: Optional[str] = None,
             metadata: Optional[tuple] = None) -> Any:
        """One unary call (`service` a full service name, `method` its method), with the session's
        bearer `token`, explicit `metadata`, or Anonymous credentials; the response message, or
        grpc.RpcError."""
        return self.call_with_headers(service, method, request, token=token, metadata=metadata)[0]

    def call_with_headers(self, service: str, method: str, request: Any = None, *, token: Optional[str] = None,
                          metadata: Optional[tuple] = None) -> tuple[Any, tuple]:
        """(response, initial metadata) of one unary call."""
        m = METHODS[f"/{service}/{method}"]
        fn = self.channel().unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                        response_deserializer=m.response.FromString)
        resp, call = fn.with_call(request if request is not None else m.request(),
                                  metadata=self._metadata(token, metadata))
        return resp, call.initial_metadata()

    def stream(self, service: str, method: str, request: Any = None, *, token: Optional[str] = None,
               metadata: Optional[tuple] = None):
        """A server-streaming call: the call, an iterator of response messages with `cancel()`."""
        m = METHODS[f"/{service}/{method}"]
        fn = self.channel().unary_stream(m.path, request_serializer=m.request.SerializeToString,
                                         response_deserializer=m.response.FromString)
        return fn(request if request is not None else m.request(), metadata=self._metadata(token, metadata))

    def bidi(self, service: str, method: str, requests: Iterable[Any], *, token: Optional[str] = None,
             metadata: Optional[tuple] = None, raw: bool = False):
        """A bidirectional call: its requests (messages, or bytes with `raw`) in, the call out."""
        m = METHODS[f"/{service}/{method}"]
        fn = self.channel().stream_stream(m.path, request_serializer=None if raw else m.request.SerializeToString,
                                          response_deserializer=None if raw else m.response.FromString)
        return fn(iter(requests), metadata=self._metadata(token, metadata))

    def new_session(self, metadata: tuple = ANONYMOUS) -> str:
        """A new session's bearer token (SessionService.NewSession)."""
        resp = self.call(SESSION_SERVICE, "NewSession", metadata=metadata)
        return resp.session_token.decode()

    @staticmethod
    def _metadata(token: Optional[str], metadata: Optional[tuple]) -> tuple:
        if metadata is not None:
            return tuple(metadata)
        if token is not None:
            return (("authorization", f"Bearer {token}"),)
        return ANONYMOUS

    @staticmethod
    def status(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
        """(code, details) of the call `fn` makes, which must fail."""
        try:
            fn()
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        raise AssertionError("the call succeeded")
