"""Browsers over https: the web port with TLS, HTTP/2 for Deephaven's JS API.

On an https page Deephaven's JS API does not open the gRPC websocket: it makes every call a
gRPC-Web `fetch` over HTTP/2 (many calls stay open at once, so HTTP/1.1's six connections per
origin would stall it), and since `fetch` cannot stream a request, it follows tables through
`BrowserFlightService` (OpenDoExchange, then NextDoExchange for each later request) instead of
DoExchange. `HttpsFront` owns the web port: TLS offers `h2` and `http/1.1` by ALPN; an HTTP/1.1
connection goes to the web side's aiohttp protocol as it is (pages and `wss://` websockets, as on
plain http), an HTTP/2 connection is served here:

- a gRPC-Web POST (`application/grpc-web[+proto]`) runs the web side's `GuardedMethod` for its
  path (credentials, parsing, handler, errors as statuses: the same path as every transport),
  its messages and trailer block framed by tickwire.protocol.grpc_web;
- any other request (the pages, `/jsapi/`, `/healthz`, ...) is relayed to the web side's own
  listener on loopback, so that one set of routes answers both protocols.

Flow control is HTTP/2's own: a response is written only as fast as the stream's and the
connection's windows allow and the socket drains, so a slow page holds its handler (and its
subscription coalesces, as for a slow gRPC subscriber). A stream the browser resets cancels its
handler; a closed connection cancels them all.

Must not touch: the engine or its lock (handlers reach it through the guarded methods).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

import aiohttp
import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from tickwire.errors import ProtocolError
from tickwire.protocol.grpc_web import is_grpc_web, message_frame, request_messages, trailer_frame
from tickwire.protocol.proto.methods import BIDI, CLIENT_STREAM
from tickwire.server.services.rpc import GuardedMethod, short
from tickwire.server.web.calls import CallContext, cancel_until_done, run_call

__all__ = ["HttpsFront"]

log = logging.getLogger(__name__)

_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "te", "trailer"}


class _Call:
    """One HTTP/2 stream: its request headers and body, and its response."""

    def __init__(self, conn: "_H2Protocol", sid: int, headers: list[tuple[str, str]]):
        self.conn = conn
        self.sid = sid
        self.pseudo = {k: v for k, v in headers if k.startswith(":")}
        self.metadata = tuple((k, v) for k, v in headers if not k.startswith(":"))
        self.body = bytearray()
        self.ended = asyncio.Event()
        self.started = False
        self.task: Optional[asyncio.Task] = None
        self.too_big = False

    def header(self, name: str) -> str:
        return next((v for k, v in self.metadata if k == name), "")

    async def start(self, extra: tuple = ()) -> None:
        if not self.started:
            self.started = True
            self.conn.send_headers(self.sid, [(":status", "200"), ("content-type", "application/grpc-web+proto"),
                                              *extra])


class _H2Protocol(asyncio.Protocol):
    def __init__(self, front: "HttpsFront"):
        self.front = front
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.calls: dict[int, _Call] = {}
        self.transport: Optional[asyncio.Transport] = None
        self.peer = "https:?"
        self._window = asyncio.Event()   # set when a window opened (WINDOW_UPDATE, SETTINGS)
        self._drained = asyncio.Event()  # set while the transport takes writes
        self._drained.set()
        self.closed = False

    # -- the connection ------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        addr = transport.get_extra_info("peername")
        if addr:
            self.peer = f"https:{addr[0]}:{addr[1]}"
        self.front.connections.add(self)
        self.h2.initiate_connection()
        self.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.front.max_streams})
        self._flush()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.front.connections.discard(self)
        self.front.cancel([c.task for c in self.calls.values() if c.task is not None], f"https from {self.peer}")
        self._window.set()
        self._drained.set()

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    def go_away(self) -> None:
        """The server stops: go-away, then the connection closes (and `connection_lost` cancels
        every stream's handler)."""
        try:
            self.h2.close_connection()
            self._flush()
        except h2.exceptions.H2Error as exc:  # a connection already broken: closed below all the same
            log.debug("https go-away to %s: %s", self.peer, exc)
        if self.transport is not None:
            self.transport.close()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.info("https connection from %s closed: %s", self.peer, exc)
            self._flush()
            if self.transport is not None:
                self.transport.close()
            return
        for ev in events:
            if isinstance(ev, h2.events.RequestReceived):
                self._open(ev.stream_id, [(str(k), str(v)) for k, v in ev.headers])
            elif isinstance(ev, h2.events.DataReceived):
                call = self.calls.get(ev.stream_id)
                self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if call is not None and not call.too_big:
                    call.body += ev.data
                    if len(call.body) > self.front.max_message_size + 64:
                        call.too_big, call.body = True, bytearray()
            elif isinstance(ev, h2.events.StreamEnded):
                call = self.calls.get(ev.stream_id)
                if call is not None:
                    call.ended.set()
            elif isinstance(ev, h2.events.StreamReset):
                call = self.calls.get(ev.stream_id)
                if call is not None and call.task is not None:
                    self.front.cancel([call.task], f"https stream {ev.stream_id} reset by {self.peer}")
            elif isinstance(ev, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
                self._window.set()
            elif isinstance(ev, h2.events.ConnectionTerminated):
                if self.transport is not None:
                    self.transport.close()
        self._flush()

    def _open(self, sid: int, headers: list[tuple[str, str]]) -> None:
        call = _Call(self, sid, headers)
        self.calls[sid] = call
        call.task = asyncio.get_running_loop().create_task(self._serve(call), name=f"https stream {sid}")

    # -- writing -------------------------------------------------------------------------------
    def send_headers(self, sid: int, headers: list[tuple[str, str]], end: bool = False) -> None:
        if self.closed:
            raise ConnectionResetError("the connection is closed")
        self.h2.send_headers(sid, headers, end_stream=end)
        self._flush()

    async def send_data(self, sid: int, data: bytes, end: bool = False) -> None:
        """Writes `data` on stream `sid` as the flow-control windows allow (and ends it)."""
        view = memoryview(data)
        while True:
            if self.closed:
                raise ConnectionResetError("the connection is closed")
            await self._drained.wait()
            if not view:
                break
            room = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size)
            if room <= 0:
                self._window.clear()
                await self._window.wait()
                continue
            self.h2.send_data(sid, bytes(view[:room]))
            view = view[room:]
            self._flush()
        if end:
            self.h2.end_stream(sid)
            self._flush()

    # -- a stream ------------------------------------------------------------------------------
    async def _serve(self, call: _Call) -> None:
        try:
            await call.ended.wait()
            if call.pseudo.get(":method") == "POST" and is_grpc_web(call.header("content-type")):
                await self._grpc(call)
            else:
                await self._relay(call)
        except asyncio.CancelledError:
            pass  # reset by the browser, or the connection closed: the handler's generator was closed
        except (ConnectionResetError, h2.exceptions.StreamClosedError):
            pass
        except Exception:  # noqa: BLE001 - a transport error must not escape the task
            log.exception("https stream %d (%s) failed", call.sid, call.pseudo.get(":path"))
            if not self.closed:
                try:
                    self.h2.reset_stream(call.sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
                    self._flush()
                except h2.exceptions.H2Error as exc:  # the stream or connection already ended
                    log.debug("https stream %d: no reset sent: %s", call.sid, exc)
        finally:
            self.calls.pop(call.sid, None)

    async def _finish(self, call: _Call, code: grpc.StatusCode, message: str = "") -> None:
        await call.start()  # headers, then the trailer block: as Deephaven answers, even a call that fails at once
        await self.send_data(call.sid, trailer_frame(code.value[0], short(message)), end=True)

    async def _grpc(self, call: _Call) -> None:
        path = call.pseudo.get(":path", "")
        gm: Optional[GuardedMethod] = self.front.methods.get(path)
        if gm is None:
            await self._finish(call, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
            return
        if gm.kind in (CLIENT_STREAM, BIDI):
            await self._finish(call, grpc.StatusCode.UNIMPLEMENTED,
                               f"{path} streams requests, which grpc-web cannot carry (use BrowserFlightService)")
            return
        if call.too_big:
            await self._finish(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                               f"the request is over the limit of {self.front.max_message_size} bytes")
            return
        try:
            messages = request_messages(bytes(call.body), self.front.max_message_size)
        except ProtocolError as err:
            await self._finish(call, grpc.StatusCode[err.code], str(err))
            return
        if len(messages) != 1:
            await self._finish(call, grpc.StatusCode.INVALID_ARGUMENT,
                               f"a call of {path} takes one request message, got {len(messages)}")
            return
        async def start(headers: tuple) -> None:
            await call.start(tuple((k.lower(), v) for k, v in headers))

        async def send(payload: bytes) -> None:
            await call.start()
            await self.send_data(call.sid, message_frame(payload))

        context = CallContext(call.metadata, lambda: self.peer, start)
        await run_call(gm, messages[0], context, send, lambda code, message: self._finish(call, code, message))

    async def _relay(self, call: _Call) -> None:
        """Any other request: answered by the web side's routes on its loopback listener."""
        method = call.pseudo.get(":method", "GET")
        path = call.pseudo.get(":path", "/")
        headers = [(k, v) for k, v in call.metadata if k not in _HOP and k != "host"]
        url = f"http://127.0.0.1:{self.front.relay_port}{path}"
        session = await self.front.session()
        async with session.request(method, url, headers=headers, data=bytes(call.body) or None,
                                   allow_redirects=False) as resp:
            out = [(":status", str(resp.status))] + [(k.lower(), v) for k, v in resp.headers.items()
                                                      if k.lower() not in _HOP and k.lower() != "content-length"]
            self.send_headers(call.sid, out)
            async for chunk in resp.content.iter_chunked(64 * 1024):
                await self.send_data(call.sid, chunk)
        await self.send_data(call.sid, b"", end=True)


class _Dispatch(asyncio.Protocol):
    """Chooses the protocol of a TLS connection by ALPN once its handshake is done."""

    def __init__(self, front: "HttpsFront"):
        self.front = front

    def connection_made(self, transport) -> None:  # type: ignore[override]
        ssl_object = transport.get_extra_info("ssl_object")
        alpn = ssl_object.selected_alpn_protocol() if ssl_object is not None else None
        proto = _H2Protocol(self.front) if alpn == "h2" else self.front.http1()
        transport.set_protocol(proto)
        proto.connection_made(transport)


class HttpsFront:
    """The web port with TLS: HTTP/2 served here, HTTP/1.1 by `http1()` (the web side's aiohttp
    protocol factory), other HTTP/2 requests relayed to `relay_port` on loopback."""

    def __init__(self, methods: dict[str, GuardedMethod], http1, relay_port: int, *,
                 max_message_size: int = 100 * 1024 * 1024, max_streams: int = 256):
        self.methods = methods
        self.http1 = http1
        self.relay_port = relay_port
        self.max_message_size = max_message_size
        self.max_streams = max_streams
        self.connections: "set[_H2Protocol]" = set()
        self._server: Optional[asyncio.base_events.Server] = None
        self._session: Optional[aiohttp.ClientSession] = None
        self._cancelling: set[asyncio.Task] = set()  # held: the loop keeps only weak references to tasks

    def cancel(self, tasks: list[asyncio.Task], what: str) -> None:
        """Cancels the handlers of streams whose client went, until they end (in the background)."""
        if tasks:
            task = asyncio.get_running_loop().create_task(cancel_until_done(tasks, what))
            self._cancelling.add(task)
            task.add_done_callback(self._cancelling.discard)

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        return self._session

    async def listen(self, host: str, port: int, ssl_context) -> int:
        ssl_context.set_alpn_protocols(["h2", "http/1.1"])
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Dispatch(self), host, port, ssl=ssl_context,
                                                reuse_address=True)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stops listening; every HTTP/2 stream's handler is cancelled, then go-away and close."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.go_away()
        if self._session is not None:
            await self._session.close()
            self._session = None
