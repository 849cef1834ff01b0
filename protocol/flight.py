"""Arrow Flight `FlightData` and `FlightDescriptor` as raw protobuf bytes (BARRAGE-WIRE.md §1.1).

FlightData has four fields: flight_descriptor (1), data_header (2), app_metadata (3) and
data_body (1000). They are written in the order descriptor, data_header, app_metadata, data_body,
and the body field is always written for record and dictionary batches, even when empty
(`c2 3e 00`): Deephaven's Java reader rejects a batch without it, and the server stops parsing
at the body tag, so it must come last. Reading accepts any order, skips unknown fields and slices
the body without copying.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from tickwire.protocol.errors import ProtocolError

__all__ = [
    "FlightDescriptor",
    "FlightData",
    "encode_flight_data",
    "decode_flight_data",
    "encode_varint",
]

DESCRIPTOR_UNKNOWN, DESCRIPTOR_PATH, DESCRIPTOR_CMD = 0, 1, 2
_TAG_DESCRIPTOR = b"\x0a"
_TAG_HEADER = b"\x12"
_TAG_APP_METADATA = b"\x1a"
_TAG_BODY = b"\xc2\x3e"


def encode_varint(value: int) -> bytes:
    if value < 0:
        value &= (1 << 64) - 1
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _read_varint(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise ProtocolError(f"{what}: truncated varint at offset {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtocolError(f"{what}: varint longer than 10 bytes at offset {pos}")


def _iter_fields(buf: memoryview, what: str):
    """Yields (field_number, wire_type, value) where value is an int or a memoryview slice."""
    pos = 0
    n = len(buf)
    while pos < n:
        tag, pos = _read_varint(buf, pos, what)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtocolError(f"{what}: field number 0 at offset {pos}")
        if wire == 0:
            value, pos = _read_varint(buf, pos, what)
            yield number, wire, value
        elif wire == 2:
            length, pos = _read_varint(buf, pos, what)
            if pos + length > n:
                raise ProtocolError(f"{what}: field {number} of {length} bytes at offset {pos} runs past the end "
                                    f"({n} bytes)")
            yield number, wire, buf[pos:pos + length]
            pos += length
        elif wire == 1:
            if pos + 8 > n:
                raise ProtocolError(f"{what}: truncated fixed64 field {number}")
            yield number, wire, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == 5:
            if pos + 4 > n:
                raise ProtocolError(f"{what}: truncated fixed32 field {number}")
            yield number, wire, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise ProtocolError(f"{what}: unsupported wire type {wire} for field {number}")


@dataclass
class FlightDescriptor:
    type: int = DESCRIPTOR_UNKNOWN
    cmd: bytes = b""
    path: list[str] = field(default_factory=list)

    @classmethod
    def for_path(cls, *path: str) -> "FlightDescriptor":
        return cls(DESCRIPTOR_PATH, b"", list(path))

    @classmethod
    def for_command(cls, cmd: bytes) -> "FlightDescriptor":
        return cls(DESCRIPTOR_CMD, bytes(cmd), [])

    def to_bytes(self) -> bytes:
        out = bytearray()
        if self.type:
            out += b"\x08" + encode_varint(self.type)
        if self.cmd:
            out += b"\x12" + encode_varint(len(self.cmd)) + self.cmd
        for p in self.path:
            raw = p.encode("utf-8")
            out += b"\x1a" + encode_varint(len(raw)) + raw
        return bytes(out)

    @classmethod
    def from_bytes(cls, data) -> "FlightDescriptor":
        d = cls()
        for number, wire, value in _iter_fields(memoryview(data), "FlightDescriptor"):
            if number == 1 and wire == 0:
                d.type = value
            elif number == 2 and wire == 2:
                d.cmd = bytes(value)
            elif number == 3 and wire == 2:
                try:
                    d.path.append(bytes(value).decode("utf-8"))
                except UnicodeDecodeError:
                    raise ProtocolError("FlightDescriptor: path element is not UTF-8") from None
        return d


@dataclass
class FlightData:
    descriptor: Optional[FlightDescriptor] = None
    data_header: bytes = b""
    app_metadata: Optional[bytes] = None
    data_body: Optional[memoryview] = None

    def to_bytes(self, *, force_body: bool = False) -> bytes:
        return encode_flight_data(self.data_header, self.app_metadata, self.data_body, self.descriptor,
                                  force_body=force_body)


def encode_flight_data(
    header: bytes | None,
    app_metadata: bytes | None = None,
    body: bytes | memoryview | None = None,
    descriptor: FlightDescriptor | None = None,
    *,
    body_parts: Sequence | None = None,
    force_body: bool = False,
) -> bytes:
    """Serializes FlightData. `body_parts` (a list of buffers) is joined into the body without an
    intermediate copy. The body field is written when a body is given (even an empty one), when
    `body_parts` is given, or when `force_body` is set (record and dictionary batches)."""
    parts: list = []
    if descriptor is not None:
        raw = descriptor.to_bytes()
        parts += [_TAG_DESCRIPTOR, encode_varint(len(raw)), raw]
    if header:
        parts += [_TAG_HEADER, encode_varint(len(header)), header]
    if app_metadata is not None:
        parts += [_TAG_APP_METADATA, encode_varint(len(app_metadata)), app_metadata]
    if body_parts is not None:
        length = sum(memoryview(p).nbytes for p in body_parts)
        parts += [_TAG_BODY, encode_varint(length), *body_parts]
    elif body is not None or force_body:
        body = b"" if body is None else body
        parts += [_TAG_BODY, encode_varint(memoryview(body).nbytes), body]
    return b"".join(parts)


def decode_flight_data(data) -> FlightData:
    """Parses FlightData bytes; the header, metadata and body are views into `data`."""
    buf = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    fd = FlightData()
    for number, wire, value in _iter_fields(buf, "FlightData"):
        if wire != 2:
            continue
        if number == 1:
            fd.descriptor = FlightDescriptor.from_bytes(value)
        elif number == 2:
            fd.data_header = bytes(value)
        elif number == 3:
            fd.app_metadata = bytes(value)
        elif number == 1000:
            fd.data_body = value
    return fd


def iter_flight_data(payloads: Iterable[bytes]):
    for p in payloads:
        yield decode_flight_data(p)
