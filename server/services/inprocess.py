"""The services without sockets: a transport that runs the gRPC services' handlers in the same
process, and a channel that tickwire's own client (or anything written against a grpc channel)
calls them through.

    engine = Engine(clock=ManualClock())
    with InProcessServer(engine) as server:
        client = BarrageClient("in-process", channel=server.channel())
        sub = client.subscribe("trades")
        engine.write(trades, batch)
        engine.run_cycle()               # the test steps the engine; no cycle thread, no port
        sub.wait_for(lambda s: s.size == len(batch), timeout=10)

The handlers are exactly the ones a TickwireServer serves (`guarded_methods`: credentials, parsing,
errors to statuses), run on an event loop of their own with a worker pool for blocking work, as
on the gRPC port and the browsers' websocket; only the bytes do not travel. A call's errors reach
the channel's caller as `grpc.RpcError`s with `code()` and `details()`, like grpcio's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Optional

import grpc

from tickwire.protocol.proto.methods import BIDI, CLIENT_STREAM, SERVER_STREAM, UNARY
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine
from tickwire.server.services import handlers as service_handlers
from tickwire.server.services.context import ServerContext
from tickwire.server.services.rpc import GuardedMethod, guarded_methods, status_of, with_stubs

__all__ = ["InProcessServer", "InProcessChannel", "InProcessError"]

_END = object()


class InProcessError(grpc.RpcError):
    """A call that ended with an error status, as grpcio's channels raise it."""

    def __init__(self, code: grpc.StatusCode, details: str, initial: tuple = ()):
        super().__init__(f"{code.name}: {details}")
        self._code, self._details, self._initial = code, details, initial

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple:
        return self._initial

    def trailing_metadata(self) -> tuple:
        return ()


class _Aborted(grpc.aio.AbortError):
    pass


class _Context:
    """What the handlers use of a grpc.aio ServicerContext, for one in-process call."""

    def __init__(self, call: "_Call", metadata: tuple, peer: str):
        self._call = call
        self._metadata = metadata
        self._peer = peer
        self.code: Optional[grpc.StatusCode] = None
        self.details = ""

    def invocation_metadata(self) -> tuple:
        return self._metadata

    async def send_initial_metadata(self, metadata) -> None:
        self._call.set_initial(tuple((str(k), str(v)) for k, v in metadata))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        self.code, self.details = code, details
        raise _Aborted()

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> Optional[float]:
        return None


class _Call:
    """One call seen from the channel's side: its initial metadata, its responses and its end."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deserialize: Optional[Callable[[bytes], Any]]):
        self._loop = loop
        self._deserialize = deserialize
        self._responses: queue.Queue = queue.Queue()
        self._initial: Optional[tuple] = None
        self._headers = threading.Event()
        self._task: Optional[asyncio.Future] = None
        self._status: Optional[tuple[grpc.StatusCode, str]] = None
        self._ended = threading.Event()
        self._cancelled = False

    # -- the server's side (the loop) --------------------------------------------------------------------
    def attach(self, task) -> None:
        """The running handler, which `cancel` cancels."""
        self._task = task
        if self._cancelled:
            task.cancel()

    def set_initial(self, metadata: tuple) -> None:
        if self._initial is None:
            self._initial = metadata
        self._headers.set()

    def respond(self, item: Any) -> None:
        self._responses.put(item)

    def finish(self, code: grpc.StatusCode, details: str) -> None:
        if self._status is None:
            self._status = (code, details)
        self._headers.set()
        self._ended.set()
        self._responses.put(_END)

    # -- the caller's side (any thread) ------------------------------------------------------------------
    def initial_metadata(self) -> tuple:
        self._headers.wait()
        return self._initial or ()

    def trailing_metadata(self) -> tuple:
        return ()

    def code(self) -> Optional[grpc.StatusCode]:
        return self._status[0] if self._status else None

    def details(self) -> Optional[str]:
        return self._status[1] if self._status else None

    def is_active(self) -> bool:
        return not self._ended.is_set()

    def done(self) -> bool:
        return self._ended.is_set()

    def expire_after(self, seconds: float) -> None:
        """Ends the call with DEADLINE_EXCEEDED (and cancels its handler) unless it ended before."""
        def expire() -> None:
            if self._ended.is_set():
                return
            task = self._task
            if task is not None:
                task.cancel()
            self.finish(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

        timer = threading.Timer(max(0.0, seconds), expire)
        timer.daemon = True
        timer.start()

    def cancel(self) -> bool:
        if self._ended.is_set():
            return False
        self._cancelled = True
        task = self._task
        if task is not None:
            task.cancel()  # a concurrent.futures.Future of the loop's task: cancelling it is thread-safe
        self.finish(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
        return True

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = self._responses.get()
        if item is _END:
            self._responses.put(_END)  # iterating again ends again
            assert self._status is not None  # finish() set it before queuing the end
            code, details = self._status
            if code == grpc.StatusCode.OK:
                raise StopIteration
            raise InProcessError(code, details, self._initial or ())
        return self._deserialize(item) if self._deserialize is not None else item

    def result(self) -> Any:
        """A unary response: the one response, or the call's error."""
        item = next(self)
        return item


class InProcessChannel:
    """A `grpc.Channel` look-alike whose calls run the handlers of an InProcessServer. Each call is
    made with the metadata the caller passes, as over a socket; `peer` is what handlers see."""

    def __init__(self, server: "InProcessServer", peer: str = "in-process"):
        self._server = server
        self._peer = peer

    def _multi(self, path: str, kind: str, request_serializer, response_deserializer):
        server = self._server
        peer = self._peer

        def invoke(request, timeout: Optional[float] = None, metadata=None, **_kw) -> _Call:
            ser = request_serializer
            if kind in (CLIENT_STREAM, BIDI):
                requests: Any = (ser(r) if ser is not None else r for r in request)
            else:
                requests = ser(request) if ser is not None else request
            call = server.start_call(path, requests, tuple(metadata or ()), response_deserializer, peer)
            if timeout is not None:  # a deadline in real seconds, as grpcio's
                call.expire_after(timeout)
            return call

        return invoke

    def unary_unary(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        invoke = self._multi(path, UNARY, request_serializer, response_deserializer)
        return _Unary(invoke)

    def stream_unary(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        invoke = self._multi(path, CLIENT_STREAM, request_serializer, response_deserializer)
        return _Unary(invoke)

    def unary_stream(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        return self._multi(path, SERVER_STREAM, request_serializer, response_deserializer)

    def stream_stream(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        return self._multi(path, BIDI, request_serializer, response_deserializer)

    def close(self) -> None:
        pass

    def __enter__(self) -> "InProcessChannel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Unary:
    def __init__(self, invoke: Callable[..., _Call]):
        self._invoke = invoke

    def __call__(self, request, timeout: Optional[float] = None, metadata=None, **kw):
        return self.with_call(request, timeout=timeout, metadata=metadata, **kw)[0]

    def with_call(self, request, timeout: Optional[float] = None, metadata=None, **kw):
        call = self._invoke(request, timeout=timeout, metadata=metadata, **kw)
        return call.result(), call


class InProcessServer:
    """The services of one server over `engine`, answering in-process calls (see the module
    documentation). `config` as for a TickwireServer; its listening options are not used. Start
    with `start()` (or `with`); `channel()` makes a channel; `stop()` ends the loop and the worker
    pool (the engine is the caller's)."""

    def __init__(self, engine: Engine, config: Optional[ServerConfig] = None, **options):
        self.engine = engine
        self.config = dataclasses.replace(config or ServerConfig(), **options)
        self.ctx = ServerContext(engine, self.config)
        self.sessions = self.ctx.sessions
        self.services, impls = service_handlers(self.ctx)
        self.methods: dict[str, GuardedMethod] = guarded_methods(with_stubs(impls), precheck=self.sessions.authenticate)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self.calls = 0

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the in-process server is not started")
        return self._loop

    def start(self) -> "InProcessServer":
        if self._loop is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="tickwire-inprocess", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def stop(self) -> None:
        loop, self._loop = self._loop, None
        self.sessions.stop()
        if loop is not None:
            async def drain() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(drain(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(10)
        self.ctx.executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "InProcessServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def channel(self, peer: str = "in-process") -> InProcessChannel:
        """A channel whose calls this server answers."""
        return InProcessChannel(self, peer)

    def running(self) -> int:
        """How many calls' handlers are still running on the server's loop."""
        loop = self._loop
        if loop is None:
            return 0

        async def count() -> int:
            return sum(1 for t in asyncio.all_tasks() if t is not asyncio.current_task())

        return asyncio.run_coroutine_threadsafe(count(), loop).result(10)

    # -- calls ------------------------------------------------------------------------------------------------
    def start_call(self, path: str, request: Any, metadata: tuple, deserialize, peer: str) -> _Call:
        """Starts one call of method `path` (request bytes, or an iterable of them for client
        streams) and returns the caller's view of it."""
        loop = self.loop
        call = _Call(loop, deserialize)
        method = self.methods.get(path)
        if method is None:  # as grpcio answers a method no handler serves
            call.finish(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return call
        self.calls += 1
        context = _Context(call, metadata, peer)
        call.attach(asyncio.run_coroutine_threadsafe(self._run(method, request, context, call), loop))
        return call

    async def _run(self, method: GuardedMethod, request: Any, context: _Context, call: _Call) -> None:
        if method.kind in (CLIENT_STREAM, BIDI):
            request = self._pump(request)
        serialize = method.serialize
        try:
            if method.kind in (UNARY, CLIENT_STREAM):
                response = await method.fn(request, context)
                call.set_initial(())
                call.respond(serialize(response) if serialize is not None else response)
            else:
                async for item in method.fn(request, context):
                    call.set_initial(())
                    call.respond(serialize(item) if serialize is not None else item)
        except grpc.aio.AbortError:
            call.finish(context.code or grpc.StatusCode.UNKNOWN, context.details)
            return
        except asyncio.CancelledError:
            call.finish(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
            return
        except BaseException as exc:  # noqa: BLE001 - a defect below the guard must not hang its caller
            call.finish(*status_of(exc))
            return
        call.finish(grpc.StatusCode.OK, "")

    @staticmethod
    async def _pump(requests: Iterable[bytes]):
        """The caller's request iterator (blocking, any thread) as the async iterator handlers read."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        done = threading.Event()

        def read() -> None:
            try:
                for r in requests:
                    if done.is_set():
                        break
                    loop.call_soon_threadsafe(q.put_nowait, r)
            except Exception as exc:  # noqa: BLE001 - the caller's iterator failed: the call ends
                loop.call_soon_threadsafe(q.put_nowait, exc)
                return
            try:
                loop.call_soon_threadsafe(q.put_nowait, _END)
            except RuntimeError:  # the loop is closed
                pass

        threading.Thread(target=read, name="tickwire-inprocess-requests", daemon=True).start()
        try:
            while True:
                item = await q.get()
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            done.set()
