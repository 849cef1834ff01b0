"""The `grpc-websockets-multiplex` framing of Deephaven's JavaScript API, sans-I/O.

Browsers reach Deephaven's gRPC services through one websocket (subprotocol
`grpc-websockets-multiplex`) that carries many gRPC calls. Every binary websocket message starts
with an int32 big-endian stream id; its top bit set means "the sender closes this stream with this
message". Stream id 0x7fffffff is reserved for the server's go-away, which the client acknowledges by
sending that id with the top bit set.

Client to server:
  * the first message of a stream holds ASCII headers, `key: value\\r\\n` each, among them
    `grpc-websockets-path` (the method, with or without its leading `/`);
  * every later message holds one control byte, 0 for data and 1 for half-close, and after a 0 a
    piece of the gRPC-framed request (flag byte, int32 BE length, message). A frame's 5-byte prefix
    and its body may arrive in separate websocket messages and one message may hold several frames,
    so the bytes are reassembled per stream. Deephaven's JS API sends the prefix and the body of each
    request in two messages and its half-close as control byte 1 with the top bit of the id set.

Server to client, no control byte: the first message is a header block (`0x80`, int32 BE length,
ASCII headers), then gRPC frames, and the last one (top bit of the id set) a trailer block of the
same shape with `grpc-status` and `grpc-message`. A stream may be answered with trailers alone.

    conn = ServerConnection()
    for event in conn.receive(websocket_message):   # StreamOpened, MessageReceived, HalfClosed, ...
        ...
    ws.send(conn.start_response(sid, [("content-type", "application/grpc-web+proto")]))
    ws.send(conn.send_message(sid, payload))
    ws.send(conn.end_stream(sid, 0))

Malformed input makes `receive` raise `ProtocolError` (its `.code` is the gRPC status name, and
`close_reason(err)` gives the websocket close code and reason to close the socket with); the
connection then refuses everything, because the framing of a multiplexed socket cannot be
resynchronised. Everything a peer can make the connection hold is bounded: the header block, the
bytes buffered per stream (one partial frame, at most the per-message limit plus its prefix), the
number of open streams, and the number of finished stream ids remembered.

`ClientConnection` is the other side (what the JS API sends and reads), for tests and benchmarks.
"""
from __future__ import annotations

import re
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence, Union

from tickwire.errors import ProtocolError

__all__ = [
    "GO_AWAY_STREAM_ID", "CLOSE_BIT", "MAX_STREAM_ID",
    "StreamOpened", "MessageReceived", "HalfClosed", "StreamClosedByClient", "GoAwayAcknowledged",
    "ResponseStarted", "ResponseMessage", "ResponseEnded", "GoAwayReceived",
    "ServerConnection", "ClientConnection", "close_reason", "sanitize_grpc_message",
    "STATUS_CODES",
]

CLOSE_BIT = 0x80000000
GO_AWAY_STREAM_ID = 0x7FFFFFFF
MAX_STREAM_ID = GO_AWAY_STREAM_ID - 1

CONTROL_DATA = 0
CONTROL_HALF_CLOSE = 1
FLAG_HEADERS = 0x80  # a grpc-web header or trailer block

#: gRPC status names by number
STATUS_CODES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)

_PATH_RE = re.compile(r"^/?([A-Za-z_][A-Za-z0-9_.]*)/([A-Za-z_][A-Za-z0-9_]*)$")
_TOKEN_RE = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_U32 = struct.Struct(">I")
_PREFIX = struct.Struct(">BI")

Headers = Sequence[tuple[str, str]]
HeaderInput = Union[Mapping[str, str], Iterable[tuple[str, str]]]


# ---------------------------------------------------------------------------------------- events

@dataclass(frozen=True)
class StreamOpened:
    """The client's first message of a stream: its path (always with a leading `/`) and headers
    (lower-case names, in order, repeats kept)."""
    stream_id: int
    path: str
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default


@dataclass(frozen=True)
class MessageReceived:
    """One complete gRPC message of the client (without its 5-byte prefix)."""
    stream_id: int
    payload: bytes


@dataclass(frozen=True)
class HalfClosed:
    """The client sends nothing more on this stream (control byte 1); the server still answers."""
    stream_id: int


@dataclass(frozen=True)
class StreamClosedByClient:
    """The top bit of the stream id: this was the client's last message on the stream. It is not a
    cancel (the JS API has none): the stream stays open until the server ends it. It follows the
    `HalfClosed` of the same message when the client half-closes, as the JS API does; on its own it
    also means the client sends nothing more."""
    stream_id: int


@dataclass(frozen=True)
class GoAwayAcknowledged:
    """The client acknowledged the server's go-away."""


@dataclass(frozen=True)
class ResponseStarted:
    stream_id: int
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class ResponseMessage:
    stream_id: int
    payload: bytes


@dataclass(frozen=True)
class ResponseEnded:
    stream_id: int
    status: int
    message: str
    trailers: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class GoAwayReceived:
    """The server sent go-away: open no new streams on this socket."""


#: what `ServerConnection.receive` returns a list of
ServerEvent = Union[StreamOpened, MessageReceived, HalfClosed, StreamClosedByClient, GoAwayAcknowledged]
#: what `ClientConnection.receive` returns a list of
ClientEvent = Union[ResponseStarted, ResponseMessage, ResponseEnded, GoAwayReceived]


# ------------------------------------------------------------------------------------- helpers

def close_reason(err: ProtocolError) -> tuple[int, str]:
    """The websocket close code and reason (at most 123 bytes) to close a socket with after
    `receive` raised `err`: 1009 (message too big) for exhausted limits, 1002 (protocol error)
    otherwise."""
    code = 1009 if err.code == "RESOURCE_EXHAUSTED" else 1002
    return code, sanitize_grpc_message(str(err))[:123]


_COLON = re.compile(r"\s*:+\s*")
_PERCENT = re.compile(r"\s*%\s*")
_BREAKS = re.compile(r"[\t\r\n\v\f]+")


def sanitize_grpc_message(message: str) -> str:
    """`message` as Deephaven's JS API 42.7 can read it in a `grpc-message` trailer: printable
    ASCII without `:` and without `%`, its meaning kept. Its trailer parser splits each line on
    every `:` (a message with one throws "Odd number of key-value pairs" inside the JS API, and the
    call's promise never settles), and it fails while parsing a percent-encoded message. So a `:`
    becomes " - " ("Filter: condition 'invoke' is not supported" -> "Filter - condition 'invoke' is
    not supported"), `%` becomes " percent ", line breaks and tabs a space, anything else outside
    printable ASCII `?`, and spaces at either end go. Applying it twice changes nothing more."""
    text = _BREAKS.sub(" ", message)
    text = _COLON.sub(" - ", text)
    text = _PERCENT.sub(" percent ", text)
    return "".join(c if " " <= c <= "~" else "?" for c in text).strip()


def _status_number(status: Union[int, str]) -> int:
    if isinstance(status, str):
        if status not in STATUS_CODES:
            raise ProtocolError(f"unknown status {status!r}", "INTERNAL")
        return STATUS_CODES.index(status)
    if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status < len(STATUS_CODES):
        raise ProtocolError(f"unknown status {status!r}", "INTERNAL")
    return status


def _pairs(headers: Optional[HeaderInput]) -> list[tuple[str, str]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return [tuple(p) for p in headers]  # type: ignore[misc]


def _encode_headers(headers: Optional[HeaderInput]) -> bytes:
    """`key: value\\r\\n` lines; names must be tokens, values printable ASCII (a sender's bug
    otherwise, reported as INTERNAL)."""
    out = []
    for pair in _pairs(headers):
        if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
            raise ProtocolError(f"header {pair!r} is not a (name, value) pair of strings", "INTERNAL")
        name, value = pair
        if not _TOKEN_RE.match(name):
            raise ProtocolError(f"header name {name!r} is not a token", "INTERNAL")
        if any(not (" " <= c <= "~" or c == "\t") for c in value):
            raise ProtocolError(f"header {name!r} has a value that is not printable ASCII", "INTERNAL")
        out.append(f"{name.lower()}: {value.strip()}\r\n")
    return "".join(out).encode("ascii")


def _decode_headers(block: bytes, what: str) -> tuple[tuple[str, str], ...]:
    try:
        text = block.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} are not ASCII") from None
    out = []
    for line in text.split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        name = name.strip()
        if not sep or not _TOKEN_RE.match(name):
            raise ProtocolError(f"{what}: {line[:40]!r} is not a `name: value` line")
        value = value.strip()
        if any(not (" " <= c <= "~" or c == "\t") for c in value):
            raise ProtocolError(f"{what}: header {name!r} has control characters")
        out.append((name.lower(), value))
    return tuple(out)


def _stream_id(message: bytes) -> tuple[int, bool, memoryview]:
    if not isinstance(message, (bytes, bytearray, memoryview)):
        raise ProtocolError("a websocket message of the multiplex protocol must be binary")
    view = memoryview(message).cast("B") if isinstance(message, memoryview) else memoryview(message)
    if len(view) < 4:
        raise ProtocolError(f"truncated message: {len(view)} bytes, no stream id")
    raw = _U32.unpack_from(view, 0)[0]
    return raw & ~CLOSE_BIT, bool(raw & CLOSE_BIT), view[4:]


def _check_stream_id(stream_id: int) -> None:
    if isinstance(stream_id, bool) or not isinstance(stream_id, int) or not 0 <= stream_id <= MAX_STREAM_ID:
        raise ProtocolError(f"stream id {stream_id!r} out of range", "INTERNAL")


def _grpc_frame(flag: int, body: bytes) -> bytes:
    return _PREFIX.pack(flag, len(body)) + body


class _Reassembler:
    """gRPC frames out of a stream's bytes, whatever the websocket message boundaries; holds at
    most one partial frame (prefix plus at most `max_message` bytes)."""

    __slots__ = ("buf", "max_message")

    def __init__(self, max_message: int):
        self.buf = bytearray()
        self.max_message = max_message

    def feed(self, data: memoryview) -> list[tuple[int, bytes]]:
        frames = []
        self.buf += data
        pos = 0
        buf = self.buf
        while len(buf) - pos >= 5:
            flag, length = _PREFIX.unpack_from(buf, pos)
            if length > self.max_message:
                raise ProtocolError(
                    f"gRPC message of {length} bytes is over the limit of {self.max_message}",
                    "RESOURCE_EXHAUSTED")
            if len(buf) - pos - 5 < length:
                break
            frames.append((flag, bytes(buf[pos + 5:pos + 5 + length])))
            pos += 5 + length
        if pos:
            del buf[:pos]
        if len(buf) >= 5:  # a partial frame: check its length now, before its body accumulates
            length = _PREFIX.unpack_from(buf, 0)[1]
            if length > self.max_message:
                raise ProtocolError(
                    f"gRPC message of {length} bytes is over the limit of {self.max_message}",
                    "RESOURCE_EXHAUSTED")
        return frames

    @property
    def pending(self) -> int:
        return len(self.buf)


# ------------------------------------------------------------------------------------- server

@dataclass
class _ServerStream:
    path: str
    frames: _Reassembler
    half_closed: bool = False
    client_closed: bool = False
    response_started: bool = False


class ServerConnection:
    """The server's side of one `grpc-websockets-multiplex` websocket.

    `receive` turns each binary websocket message of the client into events; the encoders turn the
    server's answers into websocket messages and track which streams the server has ended. A stream
    counts against `max_streams` from its headers until the server ends it (`end_stream`), whatever
    the client did; after that, late client messages for it are dropped (the ids of the last
    `max_finished` ended streams are remembered for that)."""

    def __init__(self, *, max_message_size: int = 16 * 1024 * 1024, max_streams: int = 256,
                 max_header_bytes: int = 16 * 1024, max_finished: int = 4096):
        self.max_message_size = max_message_size
        self.max_streams = max_streams
        self.max_header_bytes = max_header_bytes
        self.max_finished = max_finished
        self._streams: dict[int, _ServerStream] = {}
        self._finished: OrderedDict[int, None] = OrderedDict()
        self.go_away_sent = False
        self.go_away_acknowledged = False
        self.error: Optional[ProtocolError] = None

    # -- state ---------------------------------------------------------------------------------

    @property
    def open_streams(self) -> frozenset[int]:
        return frozenset(self._streams)

    def buffered_bytes(self, stream_id: int) -> int:
        s = self._streams.get(stream_id)
        return s.frames.pending if s else 0

    def _fail(self, err: ProtocolError) -> ProtocolError:
        self.error = err
        self._streams.clear()
        return err

    # -- input ---------------------------------------------------------------------------------

    def receive(self, message: bytes) -> list[ServerEvent]:
        """The events of one binary websocket message of the client; raises `ProtocolError` for
        malformed input, after which the connection accepts nothing more."""
        if self.error is not None:
            raise ProtocolError(f"the connection already failed: {self.error}", self.error.code)
        try:
            return self._receive(message)
        except ProtocolError as err:
            raise self._fail(err) from None
        except (ValueError, TypeError, struct.error, IndexError, OverflowError) as err:
            raise self._fail(ProtocolError(f"malformed message: {err}")) from err

    def _receive(self, message: bytes) -> list[ServerEvent]:
        sid, closing, body = _stream_id(message)
        if sid == GO_AWAY_STREAM_ID:
            if not closing:
                raise ProtocolError("the client used the go-away stream id without the close bit")
            if len(body):
                raise ProtocolError("go-away acknowledgement with a payload")
            if not self.go_away_sent:
                raise ProtocolError("go-away acknowledged but never sent")
            if self.go_away_acknowledged:
                return []
            self.go_away_acknowledged = True
            return [GoAwayAcknowledged()]
        stream = self._streams.get(sid)
        if stream is None:
            if sid in self._finished:
                return []  # a late message for a stream the server already ended
            if closing:
                raise ProtocolError(f"close of stream {sid}, which was never opened")
            return [self._open(sid, body)]
        if stream.client_closed:
            raise ProtocolError(f"message on stream {sid} after the client closed it")
        events: list[ServerEvent] = []
        if len(body):
            control = body[0]
            if control == CONTROL_DATA:
                if stream.half_closed:
                    raise ProtocolError(f"data on stream {sid} after its half-close")
                for flag, payload in stream.frames.feed(body[1:]):
                    if flag != 0:
                        if flag == 1:
                            raise ProtocolError("compressed gRPC messages are not accepted", "UNIMPLEMENTED")
                        raise ProtocolError(f"gRPC frame flag {flag:#x} on stream {sid}")
                    events.append(MessageReceived(sid, payload))
            elif control == CONTROL_HALF_CLOSE:
                if len(body) != 1:
                    raise ProtocolError(f"half-close of stream {sid} carries {len(body) - 1} bytes")
                if stream.half_closed:
                    raise ProtocolError(f"stream {sid} half-closed twice")
                self._end_of_input(stream, sid)
                events.append(HalfClosed(sid))
            else:
                raise ProtocolError(f"control byte {control} on stream {sid} (0 or 1 expected)")
        elif not closing:
            raise ProtocolError(f"truncated message on stream {sid}: no control byte")
        if closing:
            if not stream.half_closed:
                self._end_of_input(stream, sid)
            stream.client_closed = True
            events.append(StreamClosedByClient(sid))
        return events

    def _end_of_input(self, stream: _ServerStream, sid: int) -> None:
        if stream.frames.pending:
            raise ProtocolError(
                f"stream {sid} ended inside a gRPC frame ({stream.frames.pending} bytes left over)")
        stream.half_closed = True

    def _open(self, sid: int, block: memoryview) -> StreamOpened:
        if len(block) > self.max_header_bytes:
            raise ProtocolError(
                f"headers of stream {sid} are {len(block)} bytes, over the limit of {self.max_header_bytes}",
                "RESOURCE_EXHAUSTED")
        if len(block) and block[0] in (CONTROL_DATA, CONTROL_HALF_CLOSE):
            raise ProtocolError(f"message for stream {sid}, which was never opened")
        headers = _decode_headers(bytes(block), f"headers of stream {sid}")
        paths = [v for k, v in headers if k == "grpc-websockets-path"]
        if len(paths) != 1:
            raise ProtocolError(f"headers of stream {sid} have {len(paths)} grpc-websockets-path values, not 1")
        m = _PATH_RE.match(paths[0])
        if not m:
            raise ProtocolError(f"grpc-websockets-path {paths[0][:80]!r} is not /<package.Service>/<Method>")
        if len(self._streams) >= self.max_streams:
            raise ProtocolError(f"more than {self.max_streams} open streams", "RESOURCE_EXHAUSTED")
        self._streams[sid] = _ServerStream(f"/{m.group(1)}/{m.group(2)}", _Reassembler(self.max_message_size))
        return StreamOpened(sid, f"/{m.group(1)}/{m.group(2)}", headers)

    # -- output --------------------------------------------------------------------------------

    def _live(self, stream_id: int) -> _ServerStream:
        _check_stream_id(stream_id)
        s = self._streams.get(stream_id)
        if s is None:
            raise ProtocolError(f"stream {stream_id} is not open", "INTERNAL")
        return s

    def start_response(self, stream_id: int, headers: Optional[HeaderInput] = None) -> bytes:
        """The response headers: `0x80`, int32 BE length, ASCII `key: value\\r\\n` lines."""
        s = self._live(stream_id)
        if s.response_started:
            raise ProtocolError(f"response of stream {stream_id} already started", "INTERNAL")
        s.response_started = True
        return _U32.pack(stream_id) + _grpc_frame(FLAG_HEADERS, _encode_headers(headers))

    def send_message(self, stream_id: int, payload: bytes) -> bytes:
        """One gRPC-framed message of the response (flag 0, int32 BE length, payload)."""
        s = self._live(stream_id)
        s.response_started = True
        return _U32.pack(stream_id) + _grpc_frame(0, bytes(payload))

    def end_stream(self, stream_id: int, status_code: Union[int, str] = 0, message: str = "",
                   trailers: Optional[HeaderInput] = None) -> bytes:
        """The last message of a stream (close bit set): a trailer block with `grpc-status`, a
        sanitised `grpc-message` when there is one, then `trailers`. The stream is released."""
        self._live(stream_id)
        status = _status_number(status_code)
        lines = [("grpc-status", str(status))]
        if message:
            lines.append(("grpc-message", sanitize_grpc_message(message)))
        lines += [(k, v) for k, v in _pairs(trailers) if k.lower() not in ("grpc-status", "grpc-message")]
        out = _U32.pack(stream_id | CLOSE_BIT) + _grpc_frame(FLAG_HEADERS, _encode_headers(lines))
        del self._streams[stream_id]
        self._finished[stream_id] = None
        while len(self._finished) > self.max_finished:
            self._finished.popitem(last=False)
        return out

    def go_away(self) -> bytes:
        """The server's go-away: the client opens no new streams and acknowledges it. A stream the
        client opened before it read the go-away still arrives as `StreamOpened`; whether to answer
        or refuse it is the caller's choice (`go_away_sent` tells it)."""
        self.go_away_sent = True
        return _U32.pack(GO_AWAY_STREAM_ID)


# ------------------------------------------------------------------------------------- client

@dataclass
class _ClientStream:
    frames: _Reassembler
    started: bool = False
    sent_close: bool = False


class ClientConnection:
    """The client's side, as Deephaven's JS API speaks it: `open_stream` sends the headers,
    `send_message` the prefix and the body of a message in two websocket messages (or one, with
    `split=False`), `half_close` control byte 1 with the close bit. `receive` decodes the server's
    messages into `ResponseStarted`, `ResponseMessage`, `ResponseEnded` and `GoAwayReceived`."""

    def __init__(self, *, max_message_size: int = 64 * 1024 * 1024, max_header_bytes: int = 64 * 1024):
        self.max_message_size = max_message_size
        self.max_header_bytes = max_header_bytes
        self._next_id = 0
        self._streams: dict[int, _ClientStream] = {}
        self.go_away_received = False

    def open_stream(self, path: str, headers: Optional[HeaderInput] = None,
                    stream_id: Optional[int] = None) -> tuple[int, bytes]:
        """A new stream's id and its header message (`grpc-websockets-path` goes last, as the JS
        API sends it)."""
        if stream_id is None:
            stream_id = self._next_id
        _check_stream_id(stream_id)
        if stream_id in self._streams:
            raise ProtocolError(f"stream {stream_id} is already open", "INTERNAL")
        self._next_id = max(self._next_id, stream_id + 1)
        pairs = [(k, v) for k, v in _pairs(headers) if k.lower() != "grpc-websockets-path"]
        pairs.append(("grpc-websockets-path", path))
        block = _encode_headers(pairs)
        self._streams[stream_id] = _ClientStream(_Reassembler(self.max_message_size))
        return stream_id, _U32.pack(stream_id) + block

    def send_message(self, stream_id: int, payload: bytes, *, split: bool = True) -> list[bytes]:
        _check_stream_id(stream_id)
        head = _U32.pack(stream_id) + bytes([CONTROL_DATA])
        payload = bytes(payload)
        prefix = _PREFIX.pack(0, len(payload))
        if split:
            out = [head + prefix]
            if payload:
                out.append(head + payload)
            return out
        return [head + prefix + payload]

    def half_close(self, stream_id: int) -> bytes:
        _check_stream_id(stream_id)
        return _U32.pack(stream_id | CLOSE_BIT) + bytes([CONTROL_HALF_CLOSE])

    def close_stream(self, stream_id: int) -> bytes:
        """The close bit alone: the client's last message on the stream."""
        _check_stream_id(stream_id)
        return _U32.pack(stream_id | CLOSE_BIT)

    def acknowledge_go_away(self) -> bytes:
        return _U32.pack(GO_AWAY_STREAM_ID | CLOSE_BIT)

    def receive(self, message: bytes) -> list[ClientEvent]:
        try:
            return self._receive(message)
        except ProtocolError:
            raise
        except (ValueError, TypeError, struct.error, IndexError, OverflowError) as err:
            raise ProtocolError(f"malformed message: {err}") from err

    def _receive(self, message: bytes) -> list[ClientEvent]:
        sid, closing, body = _stream_id(message)
        if sid == GO_AWAY_STREAM_ID:
            if closing or len(body):
                raise ProtocolError("malformed go-away")
            self.go_away_received = True
            return [GoAwayReceived()]
        stream = self._streams.get(sid)
        if stream is None:
            raise ProtocolError(f"message for stream {sid}, which is not open")
        events: list[ClientEvent] = []
        for flag, payload in stream.frames.feed(body):
            if flag == FLAG_HEADERS:
                if len(payload) > self.max_header_bytes:
                    raise ProtocolError("header block over the limit", "RESOURCE_EXHAUSTED")
                headers = _decode_headers(payload, f"response headers of stream {sid}")
                if not stream.started:
                    stream.started = True
                    events.append(ResponseStarted(sid, headers))
                    continue
                if not closing:
                    raise ProtocolError(f"second header block on stream {sid} without the close bit")
                stream.sent_close = True
                status, text, rest = -1, "", []
                for k, v in headers:
                    if k == "grpc-status":
                        if not v.isdigit() or int(v) >= len(STATUS_CODES):
                            raise ProtocolError(f"grpc-status {v!r}")
                        status = int(v)
                    elif k == "grpc-message":
                        text = v
                    else:
                        rest.append((k, v))
                if status < 0:
                    raise ProtocolError(f"trailers of stream {sid} lack grpc-status")
                events.append(ResponseEnded(sid, status, text, tuple(rest)))
            elif flag == 0:
                if stream.sent_close:
                    raise ProtocolError(f"message on stream {sid} after its trailers")
                stream.started = True
                events.append(ResponseMessage(sid, payload))
            else:
                raise ProtocolError(f"gRPC frame flag {flag:#x} on stream {sid}")
        if closing:
            if stream.frames.pending:
                raise ProtocolError(f"stream {sid} ended inside a gRPC frame")
            if not stream.sent_close:
                if not events or not isinstance(events[-1], ResponseStarted):
                    raise ProtocolError(f"stream {sid} closed without trailers")
                # a trailers-only answer: the only header block was the trailers
                started = events.pop()
                assert isinstance(started, ResponseStarted)  # checked just above
                status, text, rest = -1, "", []
                for k, v in started.headers:
                    if k == "grpc-status" and v.isdigit() and int(v) < len(STATUS_CODES):
                        status = int(v)
                    elif k == "grpc-message":
                        text = v
                    elif k != "grpc-status":
                        rest.append((k, v))
                if status < 0:
                    raise ProtocolError(f"trailers of stream {sid} lack grpc-status")
                events.append(ResponseEnded(sid, status, text, tuple(rest)))
            del self._streams[sid]
        return events
