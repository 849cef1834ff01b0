"""Arrow RecordBatch messages built and read by hand (BARRAGE-WIRE.md §5.5–§6.7).

pyarrow cannot make a record batch whose columns have different lengths, which Barrage
modification batches need (an unmodified column is sent as field node (0, 0) while the others
carry their modified rows), nor the `columns_as_list` form. This module writes the Arrow Message
flatbuffer and the body itself, with Deephaven's layout: every buffer padded to 8 bytes and its
padded length reported, validity bitmaps as whole 64-bit words and only when there are nulls,
sentinels in the data buffer at null slots, no validity for fixed-width columns under
`use_deephaven_nulls`, an empty offsets buffer for a 0-row string column.

Reading produces one array per column, each with its own length, sliced from the body without
copying; every offset and length is checked first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import flatbuffers
import numpy as np
import pyarrow as pa

from tickwire.protocol.errors import ProtocolError
from tickwire.protocol.fb.arrow import Buffer as FbBuffer
from tickwire.protocol.fb.arrow import FieldNode as FbFieldNode
from tickwire.protocol.fb.arrow import Message as FbMessage
from tickwire.protocol.fb.arrow import RecordBatch as FbRecordBatch
from tickwire.protocol.fbread import root
from tickwire.protocol.nulls import fill_sentinels, has_sentinel

__all__ = [
    "HEADER_SCHEMA",
    "HEADER_DICTIONARY_BATCH",
    "HEADER_RECORD_BATCH",
    "EncodedBatch",
    "MessageInfo",
    "encode_record_batch",
    "encode_batches",
    "read_message_header",
    "decode_record_batch",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "INITIAL_BATCH_SIZE",
]

HEADER_SCHEMA, HEADER_DICTIONARY_BATCH, HEADER_RECORD_BATCH = 1, 2, 3
_V5 = 4
_ZEROS = bytes(64)
DEFAULT_MAX_MESSAGE_SIZE = 100 * 1024 * 1024
INITIAL_BATCH_SIZE = 4096


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _fixed_width(t: pa.DataType) -> Optional[int]:
    """Byte width of a fixed-width primitive type, None otherwise."""
    if pa.types.is_boolean(t):
        return None
    try:
        bits = t.bit_width
    except ValueError:
        return None
    return bits // 8 if bits >= 8 else None


class _BodyWriter:
    __slots__ = ("parts", "buffers", "nodes", "offset")

    def __init__(self):
        self.parts: list = []
        self.buffers: list[tuple[int, int]] = []
        self.nodes: list[tuple[int, int]] = []
        self.offset = 0

    def add(self, data, nbytes: Optional[int] = None) -> None:
        """Appends a buffer (`nbytes` of `data`, or all of it), padded to 8 bytes."""
        if data is None:
            self.buffers.append((self.offset, 0))
            return
        mv = memoryview(data).cast("B")
        if nbytes is not None:
            mv = mv[:nbytes]
        n = mv.nbytes
        padded = _pad8(n)
        if n:
            self.parts.append(mv)
        if padded > n:
            self.parts.append(_ZEROS[: padded - n])
        self.buffers.append((self.offset, padded))
        self.offset += padded

    def add_bytes_exact(self, data: bytes) -> None:
        self.add(data)


def _validity_words(arr: pa.Array) -> bytes | memoryview:
    """The validity bitmap of `arr` starting at bit 0, as whole 64-bit words."""
    n = len(arr)
    words = ((n + 63) // 64) * 8
    bitmap = arr.buffers()[0]
    if bitmap is not None and arr.offset == 0 and bitmap.size >= words:
        return memoryview(bitmap)[:words]
    import pyarrow.compute as pc

    valid = pc.is_valid(arr).buffers()[1]
    mv = memoryview(valid)
    if mv.nbytes >= words:
        return mv[:words]
    return bytes(mv) + bytes(words - mv.nbytes)


def _bool_bits(arr: pa.Array) -> bytes | memoryview:
    n = len(arr)
    words = ((n + 63) // 64) * 8
    data = arr.buffers()[1]
    if arr.offset == 0 and data is not None and data.size >= words:
        return memoryview(data)[:words]
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")[arr.offset:arr.offset + n] \
        if data is not None else np.zeros(n, dtype=np.uint8)
    packed = np.packbits(bits, bitorder="little").tobytes()
    return packed + bytes(words - len(packed))


def _offsets(arr: pa.Array) -> tuple[np.ndarray, int, int]:
    """int32 offsets of a string/binary/list array rebased to 0, and the value range they cover."""
    n = len(arr)
    raw = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + n + 1)[arr.offset:]
    first, last = int(raw[0]), int(raw[-1])
    return (raw - first if first else raw), first, last


def _write_column(w: _BodyWriter, arr: pa.Array, dh_nulls: bool) -> None:
    t = arr.type
    n = len(arr)
    if isinstance(arr, pa.ChunkedArray):
        raise TypeError("pass pa.Array, not ChunkedArray")
    if pa.types.is_dictionary(t):
        raise ProtocolError(f"dictionary-encoded columns are not written ({t}); decode them first")
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t):
        raise ProtocolError(f"64-bit offset type {t} is not part of Barrage; convert to the 32-bit form first")
    nulls = arr.null_count
    width = _fixed_width(t)
    if width is not None and not pa.types.is_decimal(t) and not pa.types.is_fixed_size_binary(t):
        if nulls and has_sentinel(t):
            arr = fill_sentinels(arr)
        skip_validity = dh_nulls and has_sentinel(t)
        w.nodes.append((n, 0 if skip_validity else nulls))
        w.add(_validity_words(arr) if nulls and not skip_validity else None)
        data = arr.buffers()[1]
        start = arr.offset * width
        w.add(memoryview(data)[start:start + n * width] if n else None)
        return
    if pa.types.is_boolean(t):
        w.nodes.append((n, nulls))
        w.add(_validity_words(arr) if nulls else None)
        w.add(_bool_bits(arr) if n else None)
        return
    if pa.types.is_string(t) or pa.types.is_binary(t):
        w.nodes.append((n, nulls))
        w.add(_validity_words(arr) if nulls else None)
        if n == 0:
            w.add(None)
            w.add(None)
            return
        offs, first, last = _offsets(arr)
        w.add(offs.astype(np.int32, copy=False).data)
        data = arr.buffers()[2]
        w.add(memoryview(data)[first:last] if data is not None and last > first else None)
        return
    if pa.types.is_list(t):
        w.nodes.append((n, nulls))
        w.add(_validity_words(arr) if nulls else None)
        if n == 0:
            w.add(None)
            _write_column(w, arr.values.slice(0, 0), dh_nulls)
            return
        offs, first, last = _offsets(arr)
        w.add(offs.astype(np.int32, copy=False).data)
        _write_column(w, arr.values.slice(first, last - first), dh_nulls)
        return
    raise ProtocolError(f"unsupported Arrow type for Barrage: {t}")


def _empty_like(t: pa.DataType, w: _BodyWriter) -> None:
    """Field node (0, 0) and zero-length buffers for a column not sent in this batch."""
    w.nodes.append((0, 0))
    for _ in range(_buffer_count(t)):
        w.buffers.append((w.offset, 0))
    if pa.types.is_list(t):
        _empty_like(t.value_type, w)


def _buffer_count(t: pa.DataType) -> int:
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return 3
    return 2


@dataclass
class EncodedBatch:
    header: bytes
    body_parts: list
    body_length: int
    rows: int

    def size(self) -> int:
        return len(self.header) + self.body_length


def _header(length: int, nodes: list[tuple[int, int]], buffers: list[tuple[int, int]], body_length: int) -> bytes:
    b = flatbuffers.Builder(64 + 16 * (len(nodes) + len(buffers)))
    FbRecordBatch.StartNodesVector(b, len(nodes))
    for ln, nc in reversed(nodes):
        FbFieldNode.CreateFieldNode(b, ln, nc)
    nodes_vec = b.EndVector()
    FbRecordBatch.StartBuffersVector(b, len(buffers))
    for off, ln in reversed(buffers):
        FbBuffer.CreateBuffer(b, off, ln)
    buffers_vec = b.EndVector()
    FbRecordBatch.Start(b)
    FbRecordBatch.AddNodes(b, nodes_vec)
    FbRecordBatch.AddBuffers(b, buffers_vec)
    FbRecordBatch.AddLength(b, length)
    rb = FbRecordBatch.End(b)
    FbMessage.Start(b)
    FbMessage.AddHeaderType(b, HEADER_RECORD_BATCH)
    FbMessage.AddHeader(b, rb)
    FbMessage.AddVersion(b, _V5)
    FbMessage.AddBodyLength(b, body_length)
    b.Finish(FbMessage.End(b))
    return bytes(b.Output())


def encode_record_batch(
    columns: Sequence[Optional[pa.Array]],
    types: Sequence[pa.DataType],
    *,
    use_deephaven_nulls: bool = False,
    columns_as_list: bool = False,
) -> EncodedBatch:
    """One RecordBatch message: `columns[i]` is column i's rows in this batch, or None when the
    column is not sent (field node (0, 0)). `types` are the (unwrapped) wire types of all columns.
    Returns the Message flatbuffer, the body as a list of buffers, and the row count
    (RecordBatch.length is the largest column length, or 1 in list mode)."""
    if len(columns) != len(types):
        raise ValueError(f"{len(columns)} columns for a schema of {len(types)}")
    w = _BodyWriter()
    rows = 0
    for arr, t in zip(columns, types):
        k = 0 if arr is None else len(arr)
        rows = max(rows, k)
        if columns_as_list:
            w.nodes.append((1, 0))
            w.buffers.append((w.offset, 0))
            w.add(np.array([0, k], dtype=np.int32).data)
        if arr is None:
            if columns_as_list:
                # an empty list: the child column with 0 rows
                _write_column(w, pa.array([], type=t), use_deephaven_nulls)
            else:
                _empty_like(t, w)
        else:
            if arr.type != t:
                raise ProtocolError(f"column of type {arr.type} where the schema says {t}")
            _write_column(w, arr, use_deephaven_nulls)
    length = 1 if columns_as_list else rows
    header = _header(length, w.nodes, w.buffers, w.offset)
    return EncodedBatch(header, w.parts, w.offset, rows)


def encode_batches(
    columns: Sequence[Optional[pa.Array]],
    types: Sequence[pa.DataType],
    *,
    use_deephaven_nulls: bool = False,
    columns_as_list: bool = False,
    batch_size: int = 0,
    max_message_size: int = 0,
    overhead: int = 0,
) -> Iterator[EncodedBatch]:
    """Splits one phase (adds or mods) of a logical update into record batches (BARRAGE-WIRE.md §6.7).

    Batch j covers the ordinal rows [o, o+L) of every column (ragged columns give fewer or no rows).
    The first batch has min(4096, batch_size) rows; later sizes follow the measured bytes per row so
    each FlightData stays under `max_message_size` (default 100 MiB), at most `batch_size` rows
    (unlimited when <= 0). A batch over the limit is encoded again smaller unless it holds one row,
    which is sent anyway. `overhead` is added to each batch's size (FlightData framing, metadata).
    Yields nothing when every column is empty or None.
    """
    total = max((len(c) for c in columns if c is not None), default=0)
    max_batch = batch_size if batch_size > 0 else 1 << 62
    limit = max_message_size if max_message_size > 0 else DEFAULT_MAX_MESSAGE_SIZE
    o = 0
    want = min(INITIAL_BATCH_SIZE, max_batch)
    while o < total:
        rows = max(1, min(want, total - o))
        while True:
            part = [None if c is None else c.slice(o, max(0, min(rows, len(c) - o))) for c in columns]
            enc = encode_record_batch(part, types, use_deephaven_nulls=use_deephaven_nulls,
                                      columns_as_list=columns_as_list)
            size = enc.size() + overhead
            if size < limit or rows == 1:
                break
            rows = max(1, rows // 2)
        enc.rows = rows
        yield enc
        o += rows
        per_row = size // rows
        if per_row > 0:
            want = min(max_batch, max(1, int((limit // per_row) * 0.9)))
        else:
            want = max_batch


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------

@dataclass
class MessageInfo:
    header_type: int
    body_length: int
    length: int = 0
    nodes: Optional[np.ndarray] = None  # (k, 2) int64: length, null_count
    buffers: Optional[np.ndarray] = None  # (m, 2) int64: offset, length
    dictionary_id: int = 0
    is_delta: bool = False
    compressed: bool = False


def _struct_array(t, slot: int, name: str) -> np.ndarray:
    v = t.vector(slot, name, 16)
    if v is None:
        return np.zeros((0, 2), dtype=np.int64)
    start, count = v
    return np.frombuffer(t.buf, dtype="<i8", count=2 * count, offset=start).reshape(count, 2).astype(np.int64)


def read_message_header(header) -> MessageInfo:
    """Parses an Arrow Message flatbuffer (raw, as in FlightData.data_header)."""
    msg = root(header, "arrow Message")
    version = msg.scalar(0, "<h", 0, "version")
    if version < 3:
        raise ProtocolError(f"arrow Message: unsupported metadata version V{version + 1}")
    htype = msg.scalar(1, "<B", 0, "header_type")
    body_length = msg.scalar(3, "<q", 0, "bodyLength")
    if body_length < 0:
        raise ProtocolError(f"arrow Message: negative bodyLength {body_length}")
    info = MessageInfo(htype, body_length)
    rb = None
    if htype == HEADER_RECORD_BATCH:
        rb = msg.table(2, "header")
    elif htype == HEADER_DICTIONARY_BATCH:
        db = msg.table(2, "header")
        if db is None:
            raise ProtocolError("arrow Message: DictionaryBatch header missing")
        info.dictionary_id = db.scalar(0, "<q", 0, "id")
        info.is_delta = bool(db.scalar(2, "<B", 0, "isDelta"))
        rb = db.table(1, "data")
    elif htype == HEADER_SCHEMA:
        return info
    else:
        raise ProtocolError(f"arrow Message: unsupported header type {htype}")
    if rb is None:
        raise ProtocolError("arrow Message: RecordBatch header missing")
    info.length = rb.scalar(0, "<q", 0, "length")
    info.nodes = _struct_array(rb, 1, "nodes")
    info.buffers = _struct_array(rb, 2, "buffers")
    info.compressed = rb.table(3, "compression") is not None
    if info.length < 0 or (info.nodes.size and info.nodes.min() < 0):
        raise ProtocolError("arrow RecordBatch: negative length or null count")
    return info


class _Reader:
    def __init__(self, info: MessageInfo, body):
        self.nodes = info.nodes
        self.buffers = info.buffers
        self.body = pa.py_buffer(body) if not isinstance(body, pa.Buffer) else body
        self.ni = 0
        self.bi = 0

    def node(self, name: str) -> tuple[int, int]:
        if self.ni >= len(self.nodes):
            raise ProtocolError(f"record batch: no field node left for column {name!r}")
        ln, nc = (int(x) for x in self.nodes[self.ni])
        self.ni += 1
        return ln, nc

    def buffer(self, name: str) -> Optional[pa.Buffer]:
        if self.bi >= len(self.buffers):
            raise ProtocolError(f"record batch: no buffer left for column {name!r}")
        off, ln = (int(x) for x in self.buffers[self.bi])
        self.bi += 1
        if off < 0 or ln < 0 or off + ln > self.body.size:
            raise ProtocolError(f"record batch: buffer ({off}, {ln}) of column {name!r} lies outside the "
                                f"{self.body.size}-byte body")
        return None if ln == 0 else self.body.slice(off, ln)


def _need(buf: Optional[pa.Buffer], nbytes: int, what: str, name: str) -> None:
    have = 0 if buf is None else buf.size
    if have < nbytes:
        raise ProtocolError(f"record batch: column {name!r} {what} buffer has {have} bytes, needs {nbytes}")


def _read_column(r: _Reader, t: pa.DataType, name: str) -> pa.Array:
    n, nulls = r.node(name)
    validity = r.buffer(name)
    if nulls > n:
        raise ProtocolError(f"record batch: column {name!r} has null_count {nulls} > length {n}")
    if nulls:
        _need(validity, (n + 7) // 8, "validity", name)
    else:
        validity = None
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_list(t):
        offsets = r.buffer(name)
        if n:
            _need(offsets, 4 * (n + 1), "offsets", name)
            offs = np.frombuffer(offsets, dtype="<i4", count=n + 1)
            if offs[0] < 0 or np.any(np.diff(offs) < 0):
                raise ProtocolError(f"record batch: column {name!r} has decreasing or negative offsets")
            end = int(offs[-1])
        else:
            offsets = pa.py_buffer(np.zeros(1, dtype=np.int32).tobytes())
            end = 0
        if pa.types.is_list(t):
            child = _read_column(r, t.value_type, name + ".item")
            if len(child) < end:
                raise ProtocolError(f"record batch: list column {name!r} offsets reach {end} but the child has "
                                    f"{len(child)} values")
            return _from_buffers(t, n, [validity, offsets], nulls, name, children=[child])
        data = r.buffer(name)
        _need(data, end, "data", name)
        return _from_buffers(t, n, [validity, offsets, data if data is not None else _EMPTY], nulls, name)
    data = r.buffer(name)
    if pa.types.is_boolean(t):
        _need(data, (n + 7) // 8, "data", name)
    else:
        width = _fixed_width(t)
        if width is None:
            raise ProtocolError(f"record batch: unsupported type {t} for column {name!r}")
        _need(data, n * width, "data", name)
    return _from_buffers(t, n, [validity, data if data is not None else _EMPTY], nulls, name)


_EMPTY = pa.py_buffer(b"")


def _has_var_width(t: pa.DataType) -> bool:
    if pa.types.is_list(t):
        return _has_var_width(t.value_type)
    return pa.types.is_string(t) or pa.types.is_binary(t)


def _from_buffers(t, n, buffers, nulls, name, children=None) -> pa.Array:
    try:
        return pa.Array.from_buffers(t, n, buffers, null_count=nulls, children=children)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise ProtocolError(f"record batch: column {name!r} ({t}) is malformed: {exc}") from None


def decode_record_batch(info: MessageInfo, body, fields: Sequence[pa.Field], *,
                        columns_as_list: bool = False) -> list[pa.Array]:
    """Reads a RecordBatch body into one array per field, each with its own length.

    `fields` are the unwrapped fields (in list mode the schema's List<T> wrapper is expected on the
    wire around each of them and the arrays returned are the wrapped values)."""
    if info.header_type != HEADER_RECORD_BATCH and info.header_type != HEADER_DICTIONARY_BATCH:
        raise ProtocolError("not a record batch message")
    if info.compressed:
        raise ProtocolError("compressed record batch bodies are not supported")
    r = _Reader(info, body)
    out = []
    for f in fields:
        if columns_as_list:
            wrapper = _read_column(r, pa.list_(f.type), f.name)
            if len(wrapper) == 0:
                out.append(pa.array([], type=f.type))
                continue
            if len(wrapper) != 1:
                raise ProtocolError(f"list-wrapped column {f.name!r} has {len(wrapper)} lists, expected 1")
            offs = wrapper.offsets
            out.append(wrapper.values.slice(offs[0].as_py(), offs[1].as_py() - offs[0].as_py()))
        else:
            out.append(_read_column(r, f.type, f.name))
    if r.ni != len(r.nodes) or r.bi != len(r.buffers):
        raise ProtocolError(f"record batch: {len(r.nodes) - r.ni} field node(s) and {len(r.buffers) - r.bi} "
                            f"buffer(s) left over after {len(fields)} column(s)")
    for f, arr in zip(fields, out):
        try:
            # full validation is for UTF-8 and offsets; temporal values are checked structurally only,
            # because Deephaven's null sentinel (-2^63) is not a valid date or time of day
            arr.validate(full=_has_var_width(arr.type))
        except (pa.ArrowInvalid, pa.ArrowException) as exc:
            raise ProtocolError(f"record batch: column {f.name!r} is invalid: {exc}") from None
    return out
