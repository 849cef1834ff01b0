"""gRPC calls over one `grpc-websockets-multiplex` websocket, run by the same handlers as grpcio.

Each stream the browser opens is one call of a `GuardedMethod` (tickwire.server.services.rpc): the same
credentials check, request parsing, handler and error-to-status mapping as on the gRPC port, with
no loopback gRPC hop. The framing is `tickwire.protocol.ws_multiplex.ServerConnection`.

Flow control is the gRPC one: every stream writes through one bounded queue per socket, and a
stream's handler is resumed for its next message only once the queue took the previous one. A
subscriber whose socket drains slowly therefore stops pulling from its subscription, and the
publisher coalesces its updates exactly as it does for a slow gRPC subscriber; nothing is
buffered without bound. Requests are bounded the same way: a stream's queue of unread requests is
short, and reading the socket waits while it is full. A call that is over reads nothing again, so
its end drops what it left unread and lets a read waiting for room go on: otherwise the socket
would never be read again and its close never heard.

When the socket closes (or fails), the sessions it used are given a short lease
(`session_grace_s`): exports of a closed page are freed then unless the client comes back with the
same token in the meantime; and every stream it opened is cancelled, which releases its
subscription.
On shutdown the server sends go-away, ends the open streams with UNAVAILABLE and closes the socket.

Every stream ends through `ServerConnection.end_stream`, the one place this transport turns a
status into trailers: its `grpc-message` is made readable for Deephaven's JS API there
(`sanitize_grpc_message`: printable ASCII, no `:` and no `%`, which dh-core.js 42.7 cannot parse;
a call whose message had one never settled in the browser). The gRPC port sends the same statuses
with their messages as they are.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, Callable, Optional

import grpc

from tickwire.errors import ProtocolError
from tickwire.protocol.proto.methods import BIDI, CLIENT_STREAM
from tickwire.protocol.ws_multiplex import (
    GoAwayAcknowledged,
    HalfClosed,
    MessageReceived,
    ServerConnection,
    StreamClosedByClient,
    StreamOpened,
    close_reason,
)
from tickwire.server.services.rpc import GuardedMethod, short
from tickwire.server.web.calls import CallContext, cancel_until_done, run_call

__all__ = ["MultiplexSocket", "CURRENT_SOCKET"]

log = logging.getLogger(__name__)

#: The socket whose stream a handler runs for (read by the web side's credentials check, which
#: notes the sessions a socket used).
CURRENT_SOCKET: contextvars.ContextVar = contextvars.ContextVar("tickwire_ws_socket", default=None)

_EOF = object()
RESPONSE_HEADERS = (("content-type", "application/grpc-web+proto"),)


class _Stream:
    def __init__(self, socket: "MultiplexSocket", sid: int, path: str, method: Optional[GuardedMethod],
                 headers: tuple):
        self.socket = socket
        self.sid = sid
        self.path = path
        self.method = method
        self.headers = headers
        self.requests: asyncio.Queue = asyncio.Queue(maxsize=socket.request_queue)
        self.input_ended = False
        self.finished = False  # the call is over: its requests are dropped
        self.received = 0
        self.started = False
        self.task: Optional[asyncio.Task] = None

    async def start(self, extra: tuple = ()) -> None:
        if not self.started:
            self.started = True
            await self.socket.send(self.socket.conn.start_response(self.sid, RESPONSE_HEADERS + extra))

    async def first_request(self) -> bytes:
        item = await self.requests.get()
        if item is _EOF:
            raise ProtocolError("the request stream ended before its message", "INVALID_ARGUMENT")
        return item

    async def request_stream(self):
        while True:
            item = await self.requests.get()
            if item is _EOF:
                return
            yield item

    async def deliver(self, payload: "bytes | object") -> None:  # bytes, or _EOF
        """Queues a request for the call; waits while its queue is full (the socket is not read
        meanwhile: flow control), not once the call is over."""
        if not self.finished:
            await self.requests.put(payload)

    async def end_input(self) -> None:
        if not self.input_ended:
            self.input_ended = True
            await self.deliver(_EOF)

    def finish(self) -> None:
        """The call is over: whatever it left unread is dropped, and a request waiting for room in
        its queue goes in (and is dropped with the queue), so that the socket is read again."""
        self.finished = True
        while not self.requests.empty():
            self.requests.get_nowait()


class MultiplexSocket:
    """One browser websocket: reads its messages, runs a task per stream, writes through one
    bounded queue. `send_ws(bytes)` and `close_ws(code, reason)` are the socket's own coroutines."""

    def __init__(self, methods: dict[str, GuardedMethod], send_ws: Callable, close_ws: Callable, *,
                 peer: str = "", max_message_size: int = 100 * 1024 * 1024, max_streams: int = 256,
                 send_queue: int = 8, request_queue: int = 4,
                 on_closed: Optional[Callable[["MultiplexSocket"], Any]] = None):
        self.methods = methods
        self.conn = ServerConnection(max_message_size=max_message_size, max_streams=max_streams)
        self.peer = peer
        self._send_ws = send_ws
        self._close_ws = close_ws
        self.out: asyncio.Queue = asyncio.Queue(maxsize=send_queue)
        self.request_queue = request_queue
        self.streams: dict[int, _Stream] = {}
        self.sessions: set = set()  # sessions whose credentials calls on this socket presented
        self.on_closed = on_closed
        self.closed = False
        self.bytes_sent = 0
        self.messages_sent = 0
        self._writer: Optional[asyncio.Task] = None
        self._write_error: Optional[BaseException] = None

    # -- output --------------------------------------------------------------------------------
    async def send(self, data: bytes) -> None:
        """Queues one websocket message; waits while the socket's queue is full."""
        if self._write_error is not None:
            raise ConnectionResetError("the websocket is closed")
        await self.out.put(data)

    async def _write_loop(self) -> None:
        try:
            while True:
                data = await self.out.get()
                await self._send_ws(data)
                self.bytes_sent += len(data)
                self.messages_sent += 1
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the peer went away
            self._write_error = exc
            # streams waiting to queue more must not wait forever
            while not self.out.empty():
                self.out.get_nowait()
            for s in list(self.streams.values()):
                if s.task is not None:
                    s.task.cancel()

    # -- input ---------------------------------------------------------------------------------
    async def feed(self, message: bytes) -> bool:
        """Handles one binary websocket message; False when the socket must close (malformed)."""
        try:
            events = self.conn.receive(message)
        except ProtocolError as err:
            code, reason = close_reason(err)
            log.info("websocket from %s closed: %s", self.peer, err)
            await self._close_ws(code, reason)
            return False
        for ev in events:
            if isinstance(ev, StreamOpened):
                self._open(ev)
            elif isinstance(ev, MessageReceived):
                s = self.streams.get(ev.stream_id)
                if s is None or s.input_ended:
                    continue
                s.received += 1
                if s.received > 1 and s.method is not None and s.method.kind not in (CLIENT_STREAM, BIDI):
                    # a second request on a single-request call: the call fails, the socket goes on
                    s.input_ended = True
                    if s.task is not None:
                        s.task.cancel()
                        await asyncio.gather(s.task, return_exceptions=True)
                    if ev.stream_id in self.conn.open_streams:
                        await self.send(self.conn.end_stream(ev.stream_id, grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                             "more than one request message on a call that takes one"))
                    continue
                await s.deliver(ev.payload)
            elif isinstance(ev, (HalfClosed, StreamClosedByClient)):
                s = self.streams.get(ev.stream_id)
                if s is not None:
                    await s.end_input()
            elif isinstance(ev, GoAwayAcknowledged):
                pass
        return True

    def _open(self, ev: StreamOpened) -> None:
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_loop())
        method = self.methods.get(ev.path)
        stream = _Stream(self, ev.stream_id, ev.path, method, ev.headers)
        self.streams[ev.stream_id] = stream
        # the stream's task runs in a copy of the context that names this socket (a task copies the
        # context it is created in: Python 3.10 has no create_task(context=...))
        ctx = contextvars.copy_context()
        ctx.run(CURRENT_SOCKET.set, self)
        loop = asyncio.get_running_loop()
        stream.task = ctx.run(loop.create_task, self._run(stream), name=f"ws stream {ev.stream_id} {ev.path}")

    async def _finish(self, stream: _Stream, code, message: str = "") -> None:
        if self.closed and self._write_error is not None:
            return
        num = code.value[0] if isinstance(code, grpc.StatusCode) else int(code)
        await stream.start()  # headers, then trailers: as Deephaven answers, even a call that fails at once
        await self.send(self.conn.end_stream(stream.sid, num, short(message)))

    async def _run(self, stream: _Stream) -> None:
        try:
            if stream.method is None:
                await self._finish(stream, grpc.StatusCode.UNIMPLEMENTED,
                                   f"Method not found: {stream.path}")
                return
            gm = stream.method
            context = CallContext(stream.headers, lambda: self.peer, stream.start)
            try:
                request = stream.request_stream() if gm.kind in (CLIENT_STREAM, BIDI) else await stream.first_request()
            except ProtocolError as err:
                await self._finish(stream, grpc.StatusCode[err.code], str(err))
                return

            async def send(payload: bytes) -> None:
                await stream.start()
                await self.send(self.conn.send_message(stream.sid, payload))

            await run_call(gm, request, context, send, lambda code, message: self._finish(stream, code, message))
        except asyncio.CancelledError:
            pass  # the socket closed (or the server stops): the handler's generator was closed
        except ConnectionResetError:
            pass
        except Exception:  # noqa: BLE001 - a transport error must not escape the task
            log.exception("websocket stream %d (%s) failed", stream.sid, stream.path)
        finally:
            self.streams.pop(stream.sid, None)
            stream.finish()

    # -- closing -------------------------------------------------------------------------------
    async def go_away(self, message: str = "the server is shutting down") -> None:
        """Go-away, then every open stream ends with UNAVAILABLE; waits (briefly) for the queue."""
        if self.closed or self._write_error is not None:
            return
        try:
            await asyncio.wait_for(self.send(self.conn.go_away()), 1.0)
            for s in list(self.streams.values()):
                if s.task is not None:
                    s.task.cancel()
            for sid in list(self.conn.open_streams):
                await asyncio.wait_for(self.send(self.conn.end_stream(sid, grpc.StatusCode.UNAVAILABLE.value[0],
                                                                      message)), 1.0)
            await asyncio.wait_for(self._drain(), 2.0)
        except (asyncio.TimeoutError, ConnectionResetError, ProtocolError):
            pass

    async def _drain(self) -> None:
        while not self.out.empty() and self._write_error is None:
            await asyncio.sleep(0.01)

    async def closed_by_peer(self) -> None:
        """The websocket ended: its sessions get their short lease (`on_closed`) at once, then every
        stream it opened is cancelled and waited for (`cancel_until_done`)."""
        self.closed = True
        if self.on_closed is not None:
            self.on_closed(self)
        await cancel_until_done([s.task for s in self.streams.values() if s.task is not None],
                                f"websocket from {self.peer}")
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
