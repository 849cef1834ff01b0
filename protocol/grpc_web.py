"""gRPC-Web bodies (sans I/O): what Deephaven's JS API sends and expects over HTTP/2 `fetch` when
its page is on https.

A request or response body is a run of frames: one flag byte (0: a message, 0x80: a header block),
a big-endian uint32 length, then that many bytes. A request carries its one message; a response
carries its messages, then one trailer block of `name: value\\r\\n` lines (`grpc-status`, and
`grpc-message` when there is one). The trailers travel in the body, so that a browser's `fetch`
reads them: no HTTP trailers are used.
"""
from __future__ import annotations

import struct

from tickwire.errors import ProtocolError
from tickwire.protocol.ws_multiplex import FLAG_HEADERS, sanitize_grpc_message

__all__ = ["CONTENT_TYPES", "is_grpc_web", "message_frame", "trailer_frame", "request_messages"]

#: content types a grpc-web request may carry (the JS API sends the first)
CONTENT_TYPES = ("application/grpc-web", "application/grpc-web+proto")

_PREFIX = struct.Struct(">BI")


def is_grpc_web(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() in CONTENT_TYPES


def message_frame(payload: bytes) -> bytes:
    return _PREFIX.pack(0, len(payload)) + payload


def trailer_frame(status: int, message: str = "") -> bytes:
    """The trailer block that ends a response (the message made readable for the JS API)."""
    lines = f"grpc-status: {int(status)}\r\n"
    if message:
        lines += f"grpc-message: {sanitize_grpc_message(message)}\r\n"
    body = lines.encode("ascii")
    return _PREFIX.pack(FLAG_HEADERS, len(body)) + body


def request_messages(body: bytes, max_message_size: int) -> list[bytes]:
    """The messages of a request body, in order; a ProtocolError (INVALID_ARGUMENT, or
    RESOURCE_EXHAUSTED for a message over `max_message_size`) when it is not a run of frames."""
    view = memoryview(body)
    out: list[bytes] = []
    pos = 0
    while pos < len(view):
        if len(view) - pos < _PREFIX.size:
            raise ProtocolError(f"a grpc-web body ends inside a frame header ({len(view) - pos} bytes)",
                                "INVALID_ARGUMENT")
        flag, length = _PREFIX.unpack_from(view, pos)
        pos += _PREFIX.size
        if length > max_message_size:
            raise ProtocolError(f"a grpc-web message of {length} bytes is over the limit of {max_message_size}",
                                "RESOURCE_EXHAUSTED")
        if len(view) - pos < length:
            raise ProtocolError(f"a grpc-web frame of {length} bytes has only {len(view) - pos}", "INVALID_ARGUMENT")
        if flag & 0x01:
            raise ProtocolError("compressed grpc-web messages are not accepted", "UNIMPLEMENTED")
        if not flag & FLAG_HEADERS:
            out.append(bytes(view[pos:pos + length]))
        pos += length
    return out
