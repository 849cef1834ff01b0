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

Raw Flight streams, as clients other than tickwire's send them:

        ex = s.exchange(token=token)                       # DoExchange: FlightData in, decoded updates out
        ex.send(subscription_request(b"s/t"))
        ex.wait(1)                                         # the schema and the snapshot
        s.put(["scope", "t2"], table, token=token)         # DoPut of a table (or put_raw(FlightData...))
        s.doget(b"s/t2", token=token)                      # DoGet, as a pyarrow Table

A server restart without a port: `s.down()` cuts every open stream (UNAVAILABLE, as a lost
connection) and answers every call UNAVAILABLE until `s.up()` puts a new server (no sessions, no
subscriptions) over the same engine; the channels of `s.channel()` and `s.client()` follow it.

Waiting, never as a timing assertion: `s.until(pred)` for what another thread finishes after the
test caused it; `s.wait_for(sub, pred)` for a client's subscription (its own timeout runs on the
test's clock, so it would never run out); `s.advance_until(pred, step)` for a thread waiting on the
clock from a moment the test cannot see (a reconnect backoff); `s.background(fn)` for a call that
waits on the clock while the test moves it; `s.running_tasks()` counts the handlers still running.
`s.session_of(token)` is the server's Session of a bearer token.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import queue
import threading
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import grpc
import pyarrow as pa

from tickwire.clients.client import BarrageClient
from tickwire.clients.state import NaturalTableState
from tickwire.clock import ManualClock
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.opening import put_batches, put_opening
from tickwire.protocol.proto import flight_pb2, table_pb2
from tickwire.protocol.proto.methods import ALL_METHODS, FLIGHT_SERVICE, SESSION_SERVICE
from tickwire.protocol.responses import ResponseReader, SchemaReceived
from tickwire.protocol.tickets import export_ticket
from tickwire.protocol.update import StreamDecoder
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine, EngineConfig
from tickwire.server.services.inprocess import InProcessError, InProcessServer
from tickwire.server.services.sessions import Session

__all__ = ["Services", "Exchange", "ANONYMOUS", "until"]

ANONYMOUS = (("authorization", "Anonymous"),)
_LOST = "the connection was lost (Services.down)"
_DOWN = "the server is down (Services.down)"


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


QUOTES = pa.schema([("Sym", pa.string()), ("Px", pa.float64())])


@contextlib.contextmanager
def quotes_server(**server_options: Any) -> Iterator[tuple[Engine, Any]]:
    """(engine, a tickwire server on a port of its own, with `server_options`) holding `quotes`, a
    keyed table of three rows (QUOTES): the server another one forwards to or replicates from."""
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import TableSpec

    engine = Engine(interval_ms=10).start()
    t = engine.create(TableSpec("quotes", "keyed", QUOTES, keys=["Sym"]))
    engine.write(t, pa.table({"Sym": ["A", "B", "C"], "Px": [1.0, 2.0, 3.0]}, schema=QUOTES))
    srv = TickwireServer(engine, port=0, web=False, **server_options).start()
    try:
        yield engine, srv
    finally:
        srv.stop()
        engine.stop()


class Services:
    """An engine on a ManualClock and the services of a server over it, answered in process."""

    def __init__(self, config: Optional[ServerConfig] = None, *, engine: Optional[Engine] = None,
                 engine_config: Optional[EngineConfig] = None, **options):
        self.clock = ManualClock() if engine is None else engine.clock
        self.engine = engine if engine is not None else Engine(engine_config, clock=self.clock)
        self.config = dataclasses.replace(config or ServerConfig(), **options)
        self.server = InProcessServer(self.engine, self.config)
        self.ctx = self.server.ctx
        self.sessions = self.server.sessions
        self._clients: list[BarrageClient] = []
        self.link = Link(self.server)

    def __enter__(self) -> "Services":
        self.server.start()
        self.link.connect(self.server)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self._clients.clear()
        if self.link.up:
            self.link.cut()
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

    def advance_until(self, predicate: Callable[[], object], step: float, timeout: float = 30.0) -> bool:
        """Moves the clock by `step` between checks until `predicate()` holds: for a thread that
        waits on the clock from a moment the test cannot see (a client's reconnect backoff, which
        starts when its reader notices the lost stream). `timeout` real seconds only stop a hang."""
        return until(lambda: bool(predicate()) or (self.advance(step) and False), timeout)

    @staticmethod
    def wait_for(sub, predicate: Callable[[Any], bool], timeout: float = 30.0) -> bool:
        """`sub.wait_for(predicate, timeout)`: whether the predicate holds after an update, the
        subscription's callbacks having seen it, within `timeout` real seconds."""
        return sub.wait_for(predicate, timeout)

    @staticmethod
    def background(fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Runs `fn()` on a thread of its own: for a call that waits on the clock (an export named
        before it is made, a backoff), which the test then moves. The future holds its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the test through the future
                fut.set_exception(exc)

        threading.Thread(target=run, name="harness-background", daemon=True).start()
        return fut

    def running_tasks(self) -> int:
        """Tasks on the in-process server's loop: the handlers of calls still running and what they
        started. 0 once every call has ended on the server's side (a cancelled call ends for its
        caller at once, and for its handler a moment later)."""
        return self.server.running()

    # -- restarts ---------------------------------------------------------------------------------------------
    @property
    def is_up(self) -> bool:
        return self.link.up

    def down(self) -> None:
        """The server goes away: every open stream ends with UNAVAILABLE (its handler cancelled, as
        when a connection drops), and every call is answered UNAVAILABLE until `up()`."""
        if self.link.up:
            self.link.cut()
            self.server.stop()

    def up(self) -> None:
        """A new server over the same engine and configuration (a restarted server: it knows no
        session and no subscription of the one before)."""
        if not self.link.up:
            self.server = InProcessServer(self.engine, self.config).start()
            self.ctx = self.server.ctx
            self.sessions = self.server.sessions
            self.link.connect(self.server)

    def restart(self) -> None:
        self.down()
        self.up()

    # -- clients ----------------------------------------------------------------------------------------------
    def channel(self, peer: str = "in-process") -> "Channel":
        """A channel to the server of the moment (after `down()` / `up()`, the new one)."""
        return Channel(self.link, peer)

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
        m = ALL_METHODS[f"/{service}/{method}"]
        fn = self.channel().unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                        response_deserializer=m.response.FromString)
        resp, call = fn.with_call(request if request is not None else m.request(),
                                  metadata=self._metadata(token, metadata))
        return resp, call.initial_metadata()

    def stream(self, service: str, method: str, request: Any = None, *, token: Optional[str] = None,
               metadata: Optional[tuple] = None):
        """A server-streaming call: the call, an iterator of response messages with `cancel()`."""
        m = ALL_METHODS[f"/{service}/{method}"]
        fn = self.channel().unary_stream(m.path, request_serializer=m.request.SerializeToString,
                                         response_deserializer=m.response.FromString)
        return fn(request if request is not None else m.request(), metadata=self._metadata(token, metadata))

    def bidi(self, service: str, method: str, requests: Iterable[Any], *, token: Optional[str] = None,
             metadata: Optional[tuple] = None, raw: bool = False):
        """A bidirectional call: its requests (messages, or bytes with `raw`) in, the call out."""
        m = ALL_METHODS[f"/{service}/{method}"]
        fn = self.channel().stream_stream(m.path, request_serializer=None if raw else m.request.SerializeToString,
                                          response_deserializer=None if raw else m.response.FromString)
        return fn(iter(requests), metadata=self._metadata(token, metadata))

    def new_session(self, metadata: tuple = ANONYMOUS) -> str:
        """A new session's bearer token (SessionService.NewSession)."""
        resp = self.call(SESSION_SERVICE, "NewSession", metadata=metadata)
        return resp.session_token.decode()

    def session_of(self, token: str) -> Optional[Session]:
        """The open session whose bearer token is `token` (None once it has ended)."""
        token = token.removeprefix("Bearer ").strip()
        return next((s for s in self.sessions.live() if s.token == token), None)

    # -- raw Flight streams -----------------------------------------------------------------------------------
    def exchange(self, *, token: Optional[str] = None, metadata: Optional[tuple] = None,
                 as_list: bool = False) -> "Exchange":
        """A raw DoExchange: FlightData the test sends, the responses decoded by a reader thread."""
        return Exchange(self.channel(), self._metadata(token, metadata), as_list=as_list)

    def put_raw(self, messages: Sequence[bytes], *, token: Optional[str] = None,
                metadata: Optional[tuple] = None) -> list[bytes]:
        """A DoPut of raw FlightData messages (then a half-close); its PutResults (bytes), or
        grpc.RpcError."""
        call = self.channel().stream_stream(f"/{FLIGHT_SERVICE}/DoPut")(iter(list(messages)),
                                                                         metadata=self._metadata(token, metadata))
        return list(call)

    def put(self, path: Sequence[str], data: pa.Table, *, token: Optional[str] = None,
            metadata: Optional[tuple] = None, keys: Optional[Sequence[str]] = None) -> list[bytes]:
        """A DoPut of `data` to the PATH descriptor `path` (e.g. ["scope", "t"], ["export", "3"])."""
        return self.put_raw(put_opening(list(path), data.schema, keys=keys) + put_batches(data), token=token,
                            metadata=metadata)

    def doget(self, ticket: bytes, *, token: Optional[str] = None, metadata: Optional[tuple] = None) -> pa.Table:
        """A DoGet of `ticket`, as a pyarrow Table (grpc.RpcError when refused)."""
        fn = self.channel().unary_stream(f"/{FLIGHT_SERVICE}/DoGet",
                                         request_serializer=flight_pb2.Ticket.SerializeToString)
        reader = ResponseReader()
        state = None
        for raw in fn(flight_pb2.Ticket(ticket=ticket), metadata=self._metadata(token, metadata)):
            for ev in reader.feed(raw):
                if isinstance(ev, SchemaReceived):
                    state = NaturalTableState(ev.schema, viewport=False)
                else:
                    state.apply_plain(ev.update)
        if state is None:
            raise AssertionError(f"DoGet {ticket!r}: the stream ended without a schema")
        return state.table()

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


class Exchange:
    """A raw DoExchange call of a test on `channel` (a harness channel, or a grpc channel to a real
    server): `send` FlightData (a Barrage request as app_metadata, or `send_raw` bytes),
    `half_close()`, `cancel()`; a reader thread decodes the responses into `updates`
    (BarrageUpdates; `payloads` holds the raw FlightData) and, at the end, sets `error` (None when
    the call ended OK) and `done`."""

    def __init__(self, channel, metadata: tuple = ANONYMOUS, *, as_list: bool = False):
        self.q: queue.Queue = queue.Queue()
        self.decoder = StreamDecoder(columns_as_list=as_list)
        self.updates: list = []
        self.payloads: list[bytes] = []
        self.error: Optional[grpc.RpcError] = None
        self.done = threading.Event()
        self.call = channel.stream_stream(f"/{FLIGHT_SERVICE}/DoExchange")(iter(self.q.get, None),
                                                                            metadata=metadata)
        self.thread = threading.Thread(target=self._read, name="harness-exchange", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for raw in self.call:
                self.payloads.append(raw)
                u = self.decoder.feed(raw)
                if u is not None:
                    self.updates.append(u)
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()

    def send(self, app_metadata: Optional[bytes], descriptor: Optional[FlightDescriptor] = None) -> None:
        self.q.put(encode_flight_data(b"", app_metadata, descriptor=descriptor))

    def send_raw(self, flight_data: bytes) -> None:
        self.q.put(flight_data)

    def half_close(self) -> None:
        self.q.put(None)

    def cancel(self) -> None:
        self.q.put(None)
        self.call.cancel()

    def wait(self, n: int, timeout: float = 30.0) -> None:
        """Waits for `n` updates in all (the bound only stops a hang); fails when the call ends first."""
        until(lambda: len(self.updates) >= n or self.done.is_set(), timeout)
        assert len(self.updates) >= n, f"{len(self.updates)} updates, wanted {n}; error {self.error}"

    def ended(self, timeout: float = 30.0) -> Optional[grpc.RpcError]:
        """Waits for the call's end (the bound only stops a hang); its error, None when OK."""
        assert self.done.wait(timeout), "the call did not end"
        return self.error


class Link:
    """What the harness's channels reach: the server of the moment while it is up, and the
    streams open on it, which `cut()` ends with UNAVAILABLE."""

    def __init__(self, server: InProcessServer):
        self.server = server
        self.up = False
        self.generation = 0  # counts the servers: a call made to an earlier one lost its connection
        self.lock = threading.Lock()
        self.streams: set["_Stream"] = set()

    def connect(self, server: InProcessServer) -> None:
        with self.lock:
            self.server, self.up = server, True

    def cut(self) -> None:
        with self.lock:
            self.up = False
            self.generation += 1
            streams, self.streams = list(self.streams), set()
        for st in streams:
            st.sever()

    def track(self, stream: "_Stream") -> bool:
        """Counts `stream` as open; False when the server went down since it started."""
        with self.lock:
            if not self.up or stream.generation != self.generation:
                return False
            self.streams.add(stream)
            return True

    def untrack(self, stream: "_Stream") -> None:
        with self.lock:
            self.streams.discard(stream)


class Channel:
    """A grpc.Channel look-alike whose calls go to the server of the moment of a `Link`: while it
    is down a call is answered UNAVAILABLE, and the streams it had open end so."""

    def __init__(self, link: Link, peer: str):
        self.link = link
        self.peer = peer

    def inner(self):
        """The in-process channel of the server of the moment."""
        return self.link.server.channel(self.peer)

    def unary_unary(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        return _UnaryMethod(self, "unary_unary", path, request_serializer, response_deserializer)

    def stream_unary(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        return _UnaryMethod(self, "stream_unary", path, request_serializer, response_deserializer)

    def unary_stream(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        return _StreamMethod(self, "unary_stream", path, request_serializer, response_deserializer)

    def stream_stream(self, path: str, request_serializer=None, response_deserializer=None, **_kw):
        return _StreamMethod(self, "stream_stream", path, request_serializer, response_deserializer)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _UnaryMethod:
    def __init__(self, channel: Channel, kind: str, path: str, serializer, deserializer):
        self.channel, self.kind, self.args = channel, kind, (path, serializer, deserializer)

    def __call__(self, request, timeout: Optional[float] = None, metadata=None, **kw):
        return self.with_call(request, timeout=timeout, metadata=metadata, **kw)[0]

    def with_call(self, request, timeout: Optional[float] = None, metadata=None, **kw):
        link = self.channel.link
        generation = link.generation
        if not link.up:
            raise InProcessError(grpc.StatusCode.UNAVAILABLE, _DOWN)
        fn = getattr(self.channel.inner(), self.kind)(*self.args)
        try:
            return fn.with_call(request, timeout=timeout, metadata=metadata, **kw)
        except InProcessError as exc:
            if generation != link.generation:  # cut by down() while it ran
                raise InProcessError(grpc.StatusCode.UNAVAILABLE, _LOST) from exc
            raise


class _StreamMethod:
    def __init__(self, channel: Channel, kind: str, path: str, serializer, deserializer):
        self.channel, self.kind, self.args = channel, kind, (path, serializer, deserializer)

    def __call__(self, request, timeout: Optional[float] = None, metadata=None, **kw) -> "_Stream":
        link = self.channel.link
        stream = _Stream(link, link.generation)
        if not link.up:
            stream.sever(_DOWN)
            return stream
        stream.inner = getattr(self.channel.inner(), self.kind)(*self.args)(request, timeout=timeout,
                                                                          metadata=metadata, **kw)
        if not link.track(stream):  # went down meanwhile
            stream.sever()
        return stream


class _Stream:
    """A streaming call through a harness Channel: the in-process call, or UNAVAILABLE once cut."""

    def __init__(self, link: Link, generation: int):
        self.link = link
        self.generation = generation
        self.inner = None
        self.lost: Optional[str] = None

    def sever(self, why: str = _LOST) -> None:
        self.lost = why
        if self.inner is not None:
            self.inner.cancel()

    def _unavailable(self) -> InProcessError:
        return InProcessError(grpc.StatusCode.UNAVAILABLE, self.lost or _LOST)

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self):
        if self.inner is None:
            raise self._unavailable()
        try:
            return next(self.inner)
        except InProcessError as exc:
            self.link.untrack(self)
            if self.lost is not None:
                raise self._unavailable() from exc
            raise
        except StopIteration:
            self.link.untrack(self)
            raise

    def cancel(self) -> bool:
        self.link.untrack(self)
        return self.inner.cancel() if self.inner is not None and self.lost is None else False

    def code(self):
        return grpc.StatusCode.UNAVAILABLE if self.lost is not None else self.inner.code()

    def details(self):
        return self.lost if self.lost is not None else self.inner.details()

    def initial_metadata(self) -> tuple:
        return self.inner.initial_metadata() if self.inner is not None else ()

    def trailing_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return self.lost is None and self.inner is not None and self.inner.is_active()

    def done(self) -> bool:
        return not self.is_active()


def chain_batch(source: bytes, result_id: Optional[int], *, sort_by: str = "Price", descending: bool = False,
                tail: Optional[int] = 5) -> table_pb2.BatchTableRequest:
    """A Batch of where (Price > 100) -> sort -> tail, only the last step exported as
    `result_id`: what pydeephaven's Query sends. `tail=None`: where -> sort, nothing exported."""
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add().unstructured_filter
    op.source_id.ticket.ticket = source
    op.filters.append("Price > 100")
    srt = batch.ops.add().sort
    srt.source_id.batch_offset = 0
    d = srt.sorts.add()
    d.column_name = sort_by
    d.direction = table_pb2.SortDescriptor.DESCENDING if descending else table_pb2.SortDescriptor.ASCENDING
    if tail is None:
        assert result_id is None, "only the tail step is exported"
        return batch
    step = batch.ops.add().tail
    step.source_id.batch_offset = 1
    step.num_rows = tail
    if result_id is not None:
        step.result_id.ticket = export_ticket(result_id)
    return batch
