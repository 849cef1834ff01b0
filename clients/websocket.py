"""gRPC over a `grpc-websockets-multiplex` websocket, as Deephaven's JavaScript API speaks it.

A small asyncio client for the browser transport of tickwire (and Deephaven): what a browser
sends, from Python, for tests, benchmarks and tools. Messages are raw protobuf bytes.

    async with await WebsocketChannel.connect("http://127.0.0.1:10000") as ch:
        call = await ch.open("/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants",
                       {"authorization": "Anonymous"})
        await call.send(b"", half_close=True)
        async for message in call:      # ends at the trailers; call.status / call.message then
            ...
"""
from __future__ import annotations

import asyncio
from typing import Mapping, Optional

import aiohttp

from tickwire.protocol.ws_multiplex import (
    STATUS_CODES,
    ClientConnection,
    GoAwayReceived,
    ResponseEnded,
    ResponseMessage,
    ResponseStarted,
)

__all__ = ["WebsocketChannel", "WebsocketCall", "CallFailed"]

SUBPROTOCOLS = ("grpc-websockets-multiplex", "grpc-websockets")
_END = object()


class CallFailed(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"{STATUS_CODES[status] if 0 <= status < len(STATUS_CODES) else status}: {message}")
        self.status = status
        self.code = STATUS_CODES[status] if 0 <= status < len(STATUS_CODES) else str(status)
        self.message = message


class WebsocketCall:
    """One stream: `send` requests, iterate the responses; `status`/`message` once ended."""

    def __init__(self, channel: "WebsocketChannel", sid: int):
        self.channel = channel
        self.sid = sid
        self.headers: tuple = ()
        self.status: Optional[int] = None
        self.message = ""
        # bounded: a call whose responses are not read stops the channel's reading (as TCP would)
        self.responses: asyncio.Queue = asyncio.Queue(maxsize=channel.max_queued)
        self.started = asyncio.Event()

    async def send(self, payload: bytes, *, half_close: bool = False) -> None:
        conn = self.channel.conn
        for m in conn.send_message(self.sid, payload):
            await self.channel.ws.send_bytes(m)
        if half_close:
            await self.channel.ws.send_bytes(conn.half_close(self.sid))

    async def half_close(self) -> None:
        await self.channel.ws.send_bytes(self.channel.conn.half_close(self.sid))

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        if self.status is not None and self.responses.empty():
            raise StopAsyncIteration  # ended while its queue was full: no end marker fitted
        item = await self.responses.get()
        if item is _END:
            self.responses.put_nowait(_END)
            raise StopAsyncIteration
        return item

    async def unary(self, payload: bytes = b"") -> bytes:
        """Sends one request, half-closes, returns the one response (CallFailed on a bad status)."""
        await self.send(payload, half_close=True)
        out = [m async for m in self]
        if self.status != 0:
            raise CallFailed(self.status if self.status is not None else 2, self.message)
        if len(out) != 1:
            raise CallFailed(13, f"{len(out)} responses to a unary call")
        return out[0]

    async def event(self, ev) -> None:
        if isinstance(ev, ResponseStarted):
            self.headers = ev.headers
            self.started.set()
        elif isinstance(ev, ResponseMessage):
            self.started.set()
            await self.responses.put(ev.payload)
        elif isinstance(ev, ResponseEnded):
            self.end(ev.status, ev.message)

    def end(self, status: int, message: str) -> None:
        self.status, self.message = status, message
        self.started.set()
        if not self.responses.full():  # else the iterator ends once the queue is drained
            self.responses.put_nowait(_END)


class WebsocketChannel:
    """One websocket carrying many calls."""

    def __init__(self, session: aiohttp.ClientSession, ws, *, max_message_size: int = 256 * 1024 * 1024,
                 max_queued: int = 1024):
        self.session = session
        self.max_queued = max_queued  # responses held per call before the channel stops reading
        self.ws = ws
        self.conn = ClientConnection(max_message_size=max_message_size)
        self.calls: dict[int, WebsocketCall] = {}
        self.go_away = asyncio.Event()
        self.closed = asyncio.Event()
        self.bytes_received = 0
        self.messages_received = 0
        self.close_code: Optional[int] = None
        self.reading = asyncio.Event()  # cleared by `pause`: the socket is not read (the server sees a slow client)
        self.reading.set()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def connect(cls, url: str, **kwargs) -> "WebsocketChannel":
        """`url`: the server's http:// address (a path is kept; the JS API uses its first call's)."""
        if url.startswith("http"):
            url = "ws" + url[4:]
        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(url, protocols=SUBPROTOCOLS, max_msg_size=0, autoping=True)
        except BaseException:
            await session.close()
            raise
        return cls(session, ws, **kwargs)

    async def open(self, path: str, metadata: Optional[Mapping[str, str]] = None) -> WebsocketCall:
        """A new call: its header message is sent, requests follow with `send`."""
        headers = {"content-type": "application/grpc-web+proto", "x-grpc-web": "1"}
        headers.update(metadata or {})
        sid, block = self.conn.open_stream(path, headers)
        call = WebsocketCall(self, sid)
        self.calls[sid] = call
        await self.ws.send_bytes(block)
        return call

    async def unary(self, path: str, payload: bytes = b"", metadata: Optional[Mapping[str, str]] = None) -> bytes:
        call = await self.open(path, metadata)
        return await call.unary(payload)

    async def _read(self) -> None:
        try:
            while True:
                await self.reading.wait()
                msg = await self.ws.receive()
                if msg.type != aiohttp.WSMsgType.BINARY:
                    break
                self.bytes_received += len(msg.data)
                self.messages_received += 1
                for ev in self.conn.receive(msg.data):
                    if isinstance(ev, GoAwayReceived):
                        self.go_away.set()
                        await self.ws.send_bytes(self.conn.acknowledge_go_away())
                        continue
                    call = self.calls.get(ev.stream_id)
                    if call is not None:
                        await call.event(ev)
                        if isinstance(ev, ResponseEnded):
                            del self.calls[ev.stream_id]
        finally:
            self.close_code = self.ws.close_code
            for call in list(self.calls.values()):
                if call.status is None:
                    call.end(14, "the websocket closed")
            self.calls.clear()
            self.closed.set()

    def pause(self) -> None:
        """Stops reading the socket (TCP fills up, as with a browser that cannot keep up)."""
        self.reading.clear()

    def resume(self) -> None:
        self.reading.set()

    async def close(self) -> None:
        self.reading.set()
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)
        await self.session.close()

    async def __aenter__(self) -> "WebsocketChannel":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
