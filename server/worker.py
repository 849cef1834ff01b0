"""Fan-out workers: processes that serve an engine process's subscribers from local replicas.

    tickwire serve --fanout-workers 2 --port 10000      # one engine process, two workers

A worker is a tickwire server (`ServerConfig.worker_of`: the engine process's target) whose
engine holds only replicas. Every call it receives goes through its `WorkerRouter`:

  * a DoExchange that subscribes to a scope table NAME (`s/NAME`, or an export of the caller's
    session that is that table itself, as FetchTable and pydeephaven's `open_table` make; full or
    viewport) is served by the worker itself, from a replica of NAME (`Replicator`, made on the
    first such subscription and kept), once the engine process has answered a GetSchema of the
    ticket with the caller's own metadata, naming the table in a header (SCOPE_TABLE_HEADER): the engine
    decides who may read what, as if the call had reached it, and its answer's headers (the
    caller's session token) are the ones the caller gets;
  * everything else (sessions, exports and table operations, DoPut and other writes, DoGet,
    snapshot requests, subscriptions to exports the engine derived (a sort, a filter), a
    subscription whose check the engine refused or whose replica is not in sync) is forwarded
    to the engine process as raw bytes (`tickwire.server.services.forward`), so that it answers
    them as one process would.

A subscription the worker serves stops when the caller's session ends in the engine process
(closed, expired), as one process stops it: the worker holds a TerminationNotification of that
session open there, and on its UNAUTHENTICATED answer ends the local subscription; the caller's
call stays open until the caller half-closes (then OK).

What a worker's subscriber sees: the engine's table as its replica follows it, each engine cycle
whole (a replica applies one upstream message per cycle of its own, never part of one; a worker
made by `tickwire serve` runs that cycle as the message arrives, EngineConfig.cycle_on_write), one
loopback hop after the engine's own subscribers. A write acknowledged by
the engine process reaches a worker's subscribers within those cycles, not necessarily in the
snapshot of a subscription that starts right after it. A replica that no call has used for
`keep_s` (60 s of the worker engine's clock) is stopped and its table dropped, so that a worker's
memory follows what its clients subscribe to; the next subscription makes a new one. A table the
engine drops stays in the worker as it last was for the subscribers it has, and new subscriptions
to it are forwarded (the engine answers them NOT_FOUND).

The workers share the public port (SO_REUSEPORT: the kernel spreads new connections over them);
the engine process serves them on a loopback port of its own. This module reads the worker
server's parts (its context, engine and handlers) and never the engine process's.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, AsyncIterator, Optional

import grpc

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.exchange import ExchangeError, ExchangeReader, Opening
from tickwire.protocol.opening import request_message
from tickwire.protocol.proto import flight_pb2, session_pb2
from tickwire.protocol.proto.methods import FLIGHT_SERVICE, METHODS, SESSION_SERVICE
from tickwire.protocol.tickets import SCOPE_TABLE_HEADER, ExportTicket, ScopeTicket, parse_ticket
from tickwire.server.adapters.replica import Replicator
from tickwire.server.engine import CatalogError, TableInUseError
from tickwire.server.services.forward import Forwarder, passed_metadata
from tickwire.server.services.rpc import GuardedMethod, bind_call_session

if TYPE_CHECKING:
    from tickwire.server.app import TickwireServer

__all__ = ["WorkerRouter"]

log = logging.getLogger(__name__)

DO_EXCHANGE = f"/{FLIGHT_SERVICE}/DoExchange"
TERMINATION = f"/{SESSION_SERVICE}/TerminationNotification"
GET_SCHEMA = f"/{FLIGHT_SERVICE}/GetSchema"


class _LocalContext:
    """The caller's context for a call the worker serves itself: the engine's response headers
    (from the check) are sent instead of the worker's own session header."""

    def __init__(self, context: grpc.aio.ServicerContext, headers: list[tuple[str, object]]):
        self._context = context
        self._headers: Optional[list[tuple[str, object]]] = headers

    async def send_initial_metadata(self, _metadata) -> None:
        headers, self._headers = self._headers, None
        if headers is not None:
            await self._context.send_initial_metadata(tuple(headers))

    def __getattr__(self, name: str):
        return getattr(self._context, name)


def _session_metadata(headers: list[tuple[str, object]]) -> Optional[list[tuple[str, object]]]:
    """The caller's session in the engine process, as a call's metadata: the bearer token the
    engine answered the check with (None without one: other credentials would open a session of
    their own)."""
    bearer = [(k, v) for k, v in headers if k == "authorization" and str(v).startswith("Bearer ")]
    return bearer[-1:] or None


class _CallerRequests:
    """A caller's request stream as the worker's own DoExchange reads it: up to the caller's
    half-close, or until `ended` is set (the caller's session ended: a half-close for the local
    call). `rest()` then reads what the caller sends until it half-closes."""

    def __init__(self, it: AsyncIterator[bytes], ended: asyncio.Event):
        self.it = it
        self.ended = ended
        self.pending: Optional[asyncio.Future] = None  # a read of the caller's stream under way
        self.finished = False                          # the caller half-closed

    async def until_ended(self) -> AsyncIterator[bytes]:
        stop = asyncio.ensure_future(self.ended.wait())
        try:
            while not self.finished:
                if self.pending is None:
                    self.pending = asyncio.ensure_future(self.it.__anext__())
                await asyncio.wait((self.pending, stop), return_when=asyncio.FIRST_COMPLETED)
                if not self.pending.done():
                    return
                read, self.pending = self.pending, None
                try:
                    raw = read.result()
                except StopAsyncIteration:
                    self.finished = True
                    return
                yield raw
        finally:
            stop.cancel()

    async def rest(self) -> None:
        """Reads (and drops) the caller's requests until it half-closes."""
        if self.pending is not None:
            read, self.pending = self.pending, None
            try:
                await read
            except StopAsyncIteration:
                self.finished = True
        if not self.finished:
            async for _raw in self.it:
                pass
            self.finished = True

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()


class WorkerRouter(grpc.GenericRpcHandler):
    """Every call of a worker server (see the module docstring). `local`: the worker's own
    DoExchange (a GuardedMethod without a credentials check: the engine's check stands for it)."""

    def __init__(self, server: "TickwireServer", upstream: str, local: GuardedMethod, *,
                 psk: Optional[str] = None, check_timeout: float = 10.0, ready_timeout: float = 30.0,
                 keep_s: float = 60.0, sweep_s: float = 10.0, forwarded_key: Optional[str] = None):
        self.server = server
        self.upstream = upstream
        self.local = local
        self.psk = psk
        self.check_timeout = check_timeout
        self.ready_timeout = ready_timeout
        self.keep_s = keep_s    # a replica no call has used for this long (engine clock) is dropped
        self.sweep_s = sweep_s  # how often that is looked at
        # the engine process answers the headers of its streaming-request methods before it reads
        self.forwarder = Forwarder(upstream, options=[("grpc.max_receive_message_length", -1),
                                                      ("grpc.max_send_message_length", -1)],
                                   hold=[path for path, m in METHODS.items() if m.client_streaming],
                                   forwarded_key=forwarded_key)
        self.replicas: dict[str, Replicator] = {}
        self._starting: dict[str, asyncio.Future] = {}
        self._active: dict[str, int] = {}           # table -> calls using (or making) its replica
        self._idle_since: dict[str, float] = {}     # table -> when its last call ended
        self._lifecycle = threading.Lock()          # a replica is made, or stopped and dropped, whole
        self._undropped: set[str] = set()           # stopped replicas whose table is still held
        self._sweeper: Optional[asyncio.Task] = None
        self._session = None  # the worker's own session, under which its local calls run
        self.counts = {"local": 0, "forwarded": 0}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        method = method.decode() if isinstance(method, bytes) else str(method)
        if method == DO_EXCHANGE:
            return grpc.stream_stream_rpc_method_handler(self._exchange)
        return self.forwarder.service(handler_call_details)

    def in_use(self) -> dict[str, int]:
        """Tables whose replicas calls are using (or making), with how many calls."""
        return dict(self._active)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self.forwarder.close()

    def stop_replicas(self) -> None:
        for rep in list(self.replicas.values()):
            rep.stop()
        self.replicas.clear()

    # -- DoExchange -------------------------------------------------------------------------------
    async def _exchange(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[bytes]:
        it = requests.__aiter__()
        read: list[bytes] = []
        request: Optional[barrage.SubscriptionRequest] = None
        try:
            reader = ExchangeReader()
            while True:  # up to the first request: pyarrow's clients send a descriptor-only message first
                try:
                    raw = await it.__anext__()
                except StopAsyncIteration:
                    break
                read.append(raw)
                # a large request is parsed off the event loop, as the engine process's own DoExchange does
                big = len(raw) > self.server.config.inline_request_bytes
                event = await self.server.ctx.run(reader.feed, raw) if big else reader.feed(raw)
                if not isinstance(event, Opening):
                    got = getattr(event, "request", None)
                    request = got if isinstance(got, barrage.SubscriptionRequest) and got.ticket else None
                    break
        except (ExchangeError, ProtocolError):
            request = None  # the engine refuses it in its own words
        found = await self._check(bytes(request.ticket), context) if request is not None and request.ticket else None
        if request is None or found is None:
            async for out in self._forwarded(read, it, context):
                yield out
            return
        name, headers = found
        if self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_loop())
        self._active[name] = self._active.get(name, 0) + 1
        try:
            async for out in self._serve(request, name, headers, read, it, context):
                yield out
        finally:
            self._active[name] -= 1
            if not self._active[name]:
                del self._active[name]
                self._idle_since[name] = self.server.engine.clock.monotonic()

    async def _serve(self, request: barrage.SubscriptionRequest, name: str, headers: list[tuple[str, object]],
                     read: list[bytes], it: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[bytes]:
        """A subscription to table `name` the engine allowed: from the replica when it is in sync."""
        if not await self._replica_ready(name):
            async for out in self._forwarded(read, it, context):
                yield out
            return
        self.counts["local"] += 1
        bind_call_session(self._own_session())
        # the table by its scope name (an export of the caller's session is the engine's, not ours)
        read[-1] = request_message(barrage.wrap(dataclasses.replace(request, ticket=ScopeTicket(name).to_bytes())))

        # the caller's session lives in the engine process: its end (closed, expired) stops the
        # subscription as it does there (a half-close for the local call) and the caller's call
        # stays open until the caller half-closes
        ended = asyncio.Event()
        session = _session_metadata(headers)
        watch = asyncio.ensure_future(self._watch_session(session, ended)) if session is not None else None
        caller = _CallerRequests(it, ended)

        async def replay() -> AsyncIterator[bytes]:
            for raw in read:
                yield raw
            async for raw in caller.until_ended():
                yield raw
        try:
            async for out in self.local.fn(replay(), _LocalContext(context, headers)):
                yield out
            if ended.is_set():
                await caller.rest()
        finally:
            if watch is not None:
                watch.cancel()
            caller.cancel()

    async def _watch_session(self, metadata: list[tuple[str, object]], ended: asyncio.Event) -> None:
        """Sets `ended` once the engine process says the session of `metadata` has ended
        (TerminationNotification answers UNAUTHENTICATED). A server that stops (its answer) or a
        lost connection to it ends nothing: the replica follows the engine process's fate."""
        call = self.forwarder.channel().unary_unary(TERMINATION)(
            session_pb2.TerminationNotificationRequest().SerializeToString(), metadata=metadata)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                ended.set()
        finally:
            call.cancel()

    def _forwarded(self, read: list[bytes], it: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                   ) -> AsyncIterator[bytes]:
        """The DoExchange passed to the engine process, with the requests already `read`."""
        self.counts["forwarded"] += 1
        return self.forwarder.forward(DO_EXCHANGE, it, context, first=read)

    async def _check(self, ticket: bytes, context: grpc.aio.ServicerContext
                     ) -> Optional[tuple[str, list[tuple[str, object]]]]:
        """(scope name, the engine's response headers) of a subscription the worker can serve: to
        a scope table, or to an export that is one (FetchTable's), as the engine answers a
        GetSchema of it with the caller's metadata. None when the engine refuses the GetSchema
        (the call is then forwarded and refused by the engine itself) or names no scope table."""
        try:
            t = parse_ticket(ticket)
        except Exception:  # noqa: BLE001 - a ticket the engine refuses in its own words
            return None
        if not isinstance(t, (ScopeTicket, ExportTicket)):
            return None
        desc = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.PATH, path=t.to_path()).SerializeToString()
        call = self.forwarder.channel().unary_unary(GET_SCHEMA)(
            desc, metadata=self.forwarder.call_metadata(context), timeout=self.check_timeout)
        try:
            await call
            answered = passed_metadata(await call.initial_metadata())
        except grpc.aio.AioRpcError:
            return None
        name = next((str(v) for k, v in answered if k == SCOPE_TABLE_HEADER), None)
        if name is None or (isinstance(t, ScopeTicket) and name != t.name):
            return None
        return name, [(k, v) for k, v in answered if k != SCOPE_TABLE_HEADER]

    async def _replica_ready(self, name: str) -> bool:
        """Whether the worker's replica of `name` is in sync, made first when there is none."""
        rep = self.replicas.get(name)
        if rep is None:
            pending = self._starting.get(name)
            if pending is None:
                loop = asyncio.get_running_loop()
                pending = self._starting[name] = loop.run_in_executor(self.server.executor, self._start_replica, name)
            try:
                rep = await asyncio.shield(pending)
            finally:
                self._starting.pop(name, None)
        return rep is not None and rep.status == "connected"

    def _start_replica(self, name: str) -> Optional[Replicator]:
        with self._lifecycle:
            rep = self.replicas.get(name)
            if rep is not None:
                return rep
            rep = Replicator(self.server.engine, self.upstream, name, psk=self.psk, connect_timeout=self.ready_timeout)
            try:
                rep.start(wait=True)
            except (TimeoutError, ValueError) as exc:
                log.warning("worker: no replica of %r from %s (%s); its subscriptions are forwarded", name,
                            self.upstream, exc)
                rep.stop()
                return None
            self._undropped.discard(name)  # its table is the new replica's
            self.replicas[name] = rep
            return rep

    # -- dropping replicas nobody uses --------------------------------------------------------------
    async def _sweep_loop(self) -> None:
        clock = self.server.engine.clock
        loop = asyncio.get_running_loop()
        while True:
            await clock.sleep(self.sweep_s)
            idle = self.idle_replicas()
            if idle or self._undropped:
                await loop.run_in_executor(self.server.executor, self.drop_replicas, idle)

    def idle_replicas(self) -> list[Replicator]:
        """Takes out the replicas no call has used for `keep_s` (on the event loop, where calls
        find them: a call that comes later makes a new one)."""
        now = self.server.engine.clock.monotonic()
        out = []
        for name in list(self.replicas):
            if self._active.get(name) or name in self._starting:
                continue
            since = self._idle_since.setdefault(name, now)
            if now - since >= self.keep_s:
                out.append(self.replicas.pop(name))
                self._idle_since.pop(name, None)
        return out

    def drop_replicas(self, replicas: list[Replicator]) -> None:
        """Stops `replicas` and drops their tables from the worker's engine (a table a departing
        subscriber still holds is dropped by a later sweep)."""
        with self._lifecycle:
            for rep in replicas:
                rep.stop()
                self._undropped.add(rep.name)
            for name in list(self._undropped):
                if name in self.replicas:  # made again meanwhile: its table is in use
                    self._undropped.discard(name)
                    continue
                try:
                    self.server.engine.drop(name)
                except CatalogError:  # gone already
                    pass
                except TableInUseError:
                    continue
                self._undropped.discard(name)
                log.info("worker: dropped the replica of %r (no subscriber for %.0f s)", name, self.keep_s)

    def _own_session(self):
        if self._session is None:
            self._session = self.server.sessions.own_session()
        return self._session
