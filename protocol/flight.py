"""Arrow Flight `FlightData` and `FlightDescriptor` as raw protobuf bytes (docs/messages.md#flightdata-fields).

FlightData has four fields: flight_descriptor (1), data_header (2), app_metadata (3) and
data_body (1000, tag `c2 3e`). They are written in the order descriptor, data_header,
app_metadata, data_body. The body field is always written for record and dictionary batches,
even when it is empty (`c2 3e 00`): Deephaven's Java reader rejects a batch without it, and
Deephaven's parser of incoming FlightData stops at the body tag, so the body must come last.
`encode_flight_data` looks at the header's message type to decide this by itself, so a caller
that passes a RecordBatch header always gets a body field.

Reading accepts the fields in any order, skips unknown fields of every wire type, keeps the last
occurrence of a repeated scalar field (protobuf semantics) and returns the body as a memoryview
slice of the input (no copy). Malformed input raises ProtocolError.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence, Union

from tickwire.errors import ProtocolError

if TYPE_CHECKING:
    from typing_extensions import Buffer  # any object with the buffer protocol (PEP 688)

__all__ = [
    "DESCRIPTOR_UNKNOWN",
    "DESCRIPTOR_PATH",
    "DESCRIPTOR_CMD",
    "FlightDescriptor",
    "FlightData",
    "encode_flight_data",
    "decode_flight_data",
    "iter_flight_data",
    "flight_data_size",
    "encode_varint",
    "varint_size",
    "BytesLike",
]

#: what the decoders accept: any contiguous bytes-like object (pyarrow Buffers too, untyped here)
BytesLike = Union[bytes, bytearray, memoryview]

DESCRIPTOR_UNKNOWN, DESCRIPTOR_PATH, DESCRIPTOR_CMD = 0, 1, 2
_TAG_DESCRIPTOR = b"\x0a"
_TAG_HEADER = b"\x12"
_TAG_APP_METADATA = b"\x1a"
_TAG_BODY = b"\xc2\x3e"
_FIELD_BODY = 1000
# Arrow MessageHeader union values whose messages carry a body
_BATCH_HEADER_TYPES = (2, 3)  # DictionaryBatch, RecordBatch


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint; negative values are written as their 64-bit two's complement."""
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


def varint_size(value: int) -> int:
    """Number of bytes `encode_varint(value)` produces for a non-negative value."""
    return max(1, (value.bit_length() + 6) // 7)


def flight_data_size(header_len: int, body_len: Optional[int], app_metadata_len: Optional[int] = None,
                     descriptor_len: Optional[int] = None) -> int:
    """Serialized size of a FlightData with fields of these lengths (None = field absent)."""
    size = 0
    if descriptor_len is not None:
        size += 1 + varint_size(descriptor_len) + descriptor_len
    if header_len:
        size += 1 + varint_size(header_len) + header_len
    if app_metadata_len is not None:
        size += 1 + varint_size(app_metadata_len) + app_metadata_len
    if body_len is not None:
        size += 2 + varint_size(body_len) + body_len
    return size


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
            if result >> 64:
                raise ProtocolError(f"{what}: varint exceeds 64 bits at offset {pos}")
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtocolError(f"{what}: varint longer than 10 bytes at offset {pos}")


def _iter_fields(buf: memoryview, what: str) -> Iterator[tuple[int, int, Union[int, memoryview]]]:
    """Yields (field_number, wire_type, value): an int for varint/fixed fields, a memoryview slice
    of `buf` for length-delimited ones."""
    pos = 0
    n = len(buf)
    while pos < n:
        start = pos
        tag, pos = _read_varint(buf, pos, what)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise ProtocolError(f"{what}: field number 0 at offset {start}")
        if wire == 0:
            value, pos = _read_varint(buf, pos, what)
            yield number, wire, value
        elif wire == 2:
            length, pos = _read_varint(buf, pos, what)
            if length > n - pos:
                raise ProtocolError(f"{what}: field {number} of {length} bytes at offset {pos} runs past the end "
                                    f"({n} bytes)")
            yield number, wire, buf[pos:pos + length]
            pos += length
        elif wire == 1:
            if pos + 8 > n:
                raise ProtocolError(f"{what}: truncated fixed64 field {number} at offset {start}")
            yield number, wire, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == 5:
            if pos + 4 > n:
                raise ProtocolError(f"{what}: truncated fixed32 field {number} at offset {start}")
            yield number, wire, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise ProtocolError(f"{what}: unsupported wire type {wire} for field {number} at offset {start}")


def _as_bytes_view(data: BytesLike, what: str) -> memoryview:
    try:
        mv = memoryview(data)
    except TypeError:
        raise ProtocolError(f"{what}: expected a bytes-like object, got {type(data).__name__}") from None
    if not mv.contiguous:
        raise ProtocolError(f"{what}: buffer is not contiguous")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


@dataclass
class FlightDescriptor:
    """`FlightDescriptor {type = 1; cmd = 2; path = 3}`: a PATH (list of strings) or a CMD (bytes)."""

    type: int = DESCRIPTOR_UNKNOWN
    cmd: bytes = b""
    path: list[str] = field(default_factory=list)

    @classmethod
    def for_path(cls, *path: str) -> "FlightDescriptor":
        return cls(DESCRIPTOR_PATH, b"", list(path))

    @classmethod
    def for_command(cls, cmd: bytes) -> "FlightDescriptor":
        return cls(DESCRIPTOR_CMD, bytes(cmd), [])

    @property
    def is_path(self) -> bool:
        return self.type == DESCRIPTOR_PATH

    @property
    def is_command(self) -> bool:
        return self.type == DESCRIPTOR_CMD

    def to_bytes(self) -> bytes:
        out = bytearray()
        if self.type:
            out += b"\x08" + encode_varint(self.type)
        if self.cmd:
            out += b"\x12" + encode_varint(len(self.cmd)) + bytes(self.cmd)
        for p in self.path:
            raw = p.encode("utf-8")
            out += b"\x1a" + encode_varint(len(raw)) + raw
        return bytes(out)

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "FlightDescriptor":
        d = cls()
        for number, wire, value in _iter_fields(_as_bytes_view(data, "FlightDescriptor"), "FlightDescriptor"):
            if number == 1:
                if wire != 0 or not isinstance(value, int):
                    raise ProtocolError(f"FlightDescriptor: field type has wire type {wire}, expected varint")
                d.type = value
            elif number == 2:
                if wire != 2:
                    raise ProtocolError(f"FlightDescriptor: field cmd has wire type {wire}, expected bytes")
                d.cmd = bytes(value)
            elif number == 3:
                if wire != 2:
                    raise ProtocolError(f"FlightDescriptor: field path has wire type {wire}, expected string")
                try:
                    d.path.append(bytes(value).decode("utf-8"))
                except UnicodeDecodeError:
                    raise ProtocolError("FlightDescriptor: path element is not valid UTF-8") from None
        return d


@dataclass
class FlightData:
    """A decoded FlightData. `data_body` is a view into the decoded buffer (None when the field is
    absent, an empty view when it is present and empty)."""

    descriptor: Optional[FlightDescriptor] = None
    data_header: bytes = b""
    app_metadata: Optional[bytes] = None
    data_body: Optional[bytes | memoryview] = None

    @property
    def has_body(self) -> bool:
        return self.data_body is not None

    def to_bytes(self, *, force_body: bool = False) -> bytes:
        return encode_flight_data(self.data_header, self.app_metadata, self.data_body, self.descriptor,
                                  force_body=force_body)


def _header_carries_body(header: BytesLike) -> bool:
    """True when `header` is an Arrow Message whose type is RecordBatch or DictionaryBatch.

    Reads only the root table's `header_type` (slot 1, one byte); anything unreadable counts as
    'no'. The full parse and validation happen in `tickwire.protocol.batches`."""
    try:
        mv = memoryview(header).cast("B")
        n = len(mv)
        if n < 8:
            return False
        root = struct.unpack_from("<I", mv, 0)[0]
        if root + 4 > n:
            return False
        vt = root - struct.unpack_from("<i", mv, root)[0]
        if vt < 0 or vt + 4 > n:
            return False
        vt_len = struct.unpack_from("<H", mv, vt)[0]
        if vt_len < 8 or vt + 8 > n:
            return False
        rel = struct.unpack_from("<H", mv, vt + 6)[0]
        if rel == 0 or root + rel >= n:
            return False
        return mv[root + rel] in _BATCH_HEADER_TYPES
    except (TypeError, ValueError, struct.error):
        return False


def encode_flight_data(
    header: bytes | None,
    app_metadata: bytes | None = None,
    body: bytes | memoryview | None = None,
    descriptor: FlightDescriptor | None = None,
    *,
    body_parts: Sequence[Buffer] | None = None,
    force_body: bool = False,
) -> bytes:
    """Serializes FlightData in Deephaven's field order: descriptor?, data_header, app_metadata?, data_body?.

    The body field is written when `body` or `body_parts` is given (even empty), when
    `force_body` is set, or when `header` is a RecordBatch or DictionaryBatch message: a batch
    always carries the body field, `c2 3e 00` when empty. `body_parts` (a list of buffers, e.g.
    from `batches.encode_record_batch`) is written as one body without first joining the parts.
    An empty or None `header` writes no data_header field (a descriptor- or metadata-only message).
    """
    parts: list[Buffer] = []
    if descriptor is not None:
        raw = descriptor.to_bytes()
        parts += [_TAG_DESCRIPTOR, encode_varint(len(raw)), raw]
    if header:
        parts += [_TAG_HEADER, encode_varint(memoryview(header).nbytes), header]
    if app_metadata is not None:
        parts += [_TAG_APP_METADATA, encode_varint(memoryview(app_metadata).nbytes), app_metadata]
    if body_parts is not None:
        if body is not None:
            raise ValueError("pass either body or body_parts, not both")
        length = sum(memoryview(p).nbytes for p in body_parts)
        parts += [_TAG_BODY, encode_varint(length), *body_parts]
    elif body is not None or force_body or (header and _header_carries_body(header)):
        body = b"" if body is None else body
        parts += [_TAG_BODY, encode_varint(memoryview(body).nbytes), body]
    return b"".join(parts)


def decode_flight_data(data: BytesLike) -> FlightData:
    """Parses FlightData bytes. The body is a memoryview into `data` (no copy); the header and
    metadata are copied to bytes (they are small and outlive the input buffer in practice)."""
    buf = _as_bytes_view(data, "FlightData")
    fd = FlightData()
    for number, wire, value in _iter_fields(buf, "FlightData"):
        if number not in (1, 2, 3, _FIELD_BODY):
            continue
        if wire != 2 or not isinstance(value, memoryview):
            raise ProtocolError(f"FlightData: field {number} has wire type {wire}, expected length-delimited")
        if number == 1:
            fd.descriptor = FlightDescriptor.from_bytes(value)
        elif number == 2:
            fd.data_header = bytes(value)
        elif number == 3:
            fd.app_metadata = bytes(value)
        else:
            fd.data_body = value
    return fd


def iter_flight_data(payloads: Iterable[BytesLike]) -> Iterator[FlightData]:
    """Decodes each payload of an iterable of serialized FlightData."""
    for p in payloads:
        yield decode_flight_data(p)
