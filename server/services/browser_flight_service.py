"""Deephaven's BrowserFlightService: DoPut and DoExchange for clients that cannot stream requests.

OpenDoPut and NextDoPut are the form in which Deephaven's JS API sends every upload
(`connection.newTable`, and the key tables of a rollup's expansions), whatever its transport; on an
https page, where its calls are gRPC-Web `fetch`es, it follows tables through OpenDoExchange and
NextDoExchange the same way (a subscription's later requests, such as a new viewport, are
NextDoExchange calls).

The JS API turns one DoPut stream into calls that each carry one FlightData: OpenDoPut with the
first (its answer is the DoPut's stream of PutResults), NextDoPut with each later one (answered at
once, empty), and a last NextDoPut that half-closes the stream. Each call names its stream by the
header `x-deephaven-stream-ticket` (an int the client chose, unique in its session) and its place by
`x-deephaven-stream-sequence` (0, 1, 2, ...); the half-close has `x-deephaven-stream-halfclose:
true`. The calls may arrive in any order: each stream keeps the messages it has not used yet, and
feeds them in sequence order into FlightService's DoPut, which runs under the OpenDoPut call. A
sequence number used twice, or a message after the half-close, is refused (OUT_OF_RANGE,
ABORTED, as Deephaven answers); a session's streams go with it. DoExchange streams work alike, fed
into FlightService's DoExchange under the OpenDoExchange call; ending that call (the browser aborts
its fetch) ends the exchange and releases its subscription.

The service is outside the method table (its messages are Flight's): its methods take and give raw
bytes. OpenHandshake and NextHandshake are not served (the JS API does not use them).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import OrderedDict
from typing import Optional

from tickwire.protocol.proto.methods import SERVER_STREAM, UNARY
from tickwire.server.services.context import ServerContext
from tickwire.server.services.flight_service import FlightService
from tickwire.server.services.rpc import RAW, CallError
from tickwire.server.services.sessions import Session

__all__ = ["BrowserFlightService", "BROWSER_FLIGHT_SERVICE", "TICKET_HEADER", "SEQUENCE_HEADER", "HALF_CLOSE_HEADER"]

BROWSER_FLIGHT_SERVICE = "io.deephaven.flightjs.protocol.BrowserFlightService"
TICKET_HEADER = "x-deephaven-stream-ticket"
SEQUENCE_HEADER = "x-deephaven-stream-sequence"
HALF_CLOSE_HEADER = "x-deephaven-stream-halfclose"
_END = object()
FINISHED_KEPT = 4096


class _Stream:
    """One emulated DoPut stream: the messages received and not yet fed, by sequence number."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending: dict[int, object] = {}  # sequence -> payload bytes, or _END
        self.next = 0  # the sequence number fed next
        self.half_closed: Optional[int] = None
        self.opened = False
        self.wake: Optional[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = None

    def offer(self, seq: int, payload: object) -> None:
        with self.lock:
            if seq < self.next or seq in self.pending:
                raise CallError(f"Duplicate sequence sent: next seq={self.next} recv seq={seq}", "OUT_OF_RANGE")
            if self.half_closed is not None and seq > self.half_closed:
                raise CallError(f"Sequence sent after half close: closed seq={self.half_closed} recv seq={seq}",
                                "ABORTED")
            if payload is _END:
                self.half_closed = seq
            self.pending[seq] = payload
            wake = self.wake
        if wake is not None:
            loop, event = wake
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the feeding call's loop is gone
                pass

    async def messages(self):
        """The payloads in sequence order, until the half-close."""
        event = asyncio.Event()
        with self.lock:
            self.wake = (asyncio.get_running_loop(), event)
        while True:
            with self.lock:
                item = self.pending.pop(self.next, None)
                if item is not None:
                    self.next += 1
                else:
                    event.clear()
            if item is _END:
                return
            if item is None:
                await event.wait()
                continue
            yield item


class BrowserFlightService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.flight = FlightService(ctx)
        self._streams: dict[tuple[int, int], _Stream] = {}
        self._sessions: set[int] = set()  # sessions whose end forgets their streams
        # streams that have ended, so a late call naming one is refused instead of opening it again;
        # the most recent FINISHED_KEPT of them (tickets are export ids, never reused by a client)
        self._finished: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._lock = threading.Lock()

    def handlers(self) -> dict:
        base = f"/{BROWSER_FLIGHT_SERVICE}/"
        return {base + "OpenDoPut": (self.open_do_put, RAW, RAW, SERVER_STREAM),
                base + "NextDoPut": (self.next_do_put, RAW, RAW, UNARY),
                base + "OpenDoExchange": (self.open_do_exchange, RAW, RAW, SERVER_STREAM),
                base + "NextDoExchange": (self.next_do_put, RAW, RAW, UNARY)}

    @staticmethod
    def _headers(context) -> tuple[int, int, bool]:
        md = {str(k).lower(): v for k, v in (context.invocation_metadata() or ())}
        try:
            ticket = int(md[TICKET_HEADER])
            seq = int(md[SEQUENCE_HEADER])
        except (KeyError, TypeError, ValueError):
            raise CallError(f"a browser stream call needs the headers {TICKET_HEADER} and {SEQUENCE_HEADER} "
                            f"(integers)", "INVALID_ARGUMENT") from None
        half = str(md.get(HALF_CLOSE_HEADER, "")).lower() == "true"
        return ticket, seq, half

    def _stream(self, session: Session, ticket: int) -> _Stream:
        key = (session.id, ticket)
        with self._lock:
            if key in self._finished:
                raise CallError(f"browser stream {ticket} has ended", "ABORTED")
            stream = self._streams.get(key)
            if stream is None:
                stream = self._streams[key] = _Stream()
            first = session.id not in self._sessions
            self._sessions.add(session.id)
        if first:
            session.on_end(lambda _reason: self._forget(session.id, ended=True))
        return stream

    def _forget(self, session_id: int, ticket: Optional[int] = None, ended: bool = False) -> None:
        with self._lock:
            if ended:
                self._sessions.discard(session_id)
            for key in [k for k in self._streams if k[0] == session_id and (ticket is None or k[1] == ticket)]:
                del self._streams[key]
            if ticket is not None and not ended:
                self._finished[(session_id, ticket)] = None
                while len(self._finished) > FINISHED_KEPT:
                    self._finished.popitem(last=False)
            if ended:
                for key in [k for k in self._finished if k[0] == session_id]:
                    del self._finished[key]

    async def open_do_put(self, request: bytes, context):
        async with contextlib.aclosing(self._open(request, context, self.flight.do_put)) as results:
            async for result in results:
                yield result.SerializeToString()

    async def open_do_exchange(self, request: bytes, context):
        async with contextlib.aclosing(self._open(request, context, self.flight.do_exchange)) as messages:
            async for message in messages:
                yield message

    async def _open(self, request: bytes, context, call):
        """Opens the stream the call's headers name with its first message, and runs `call`
        (FlightService's DoPut or DoExchange) over the stream's messages in sequence order."""
        session = self.ctx.session_of(context)
        ticket, seq, half = self._headers(context)
        stream = self._stream(session, ticket)
        with stream.lock:
            if stream.opened:
                raise CallError(f"browser stream {ticket} is already open", "ALREADY_EXISTS")
            stream.opened = True
        try:
            stream.offer(seq, _END if half else request)
            # closed here, not when collected: a DoExchange holds a subscription
            async with contextlib.aclosing(call(stream.messages(), context)) as results:
                async for result in results:
                    yield result
        finally:
            self._forget(session.id, ticket)

    async def next_do_put(self, request: bytes, context) -> bytes:
        session = await self.ctx.authenticate(context)
        ticket, seq, half = self._headers(context)
        self._stream(session, ticket).offer(seq, _END if half else request)
        return b""  # an empty BrowserNextResponse
