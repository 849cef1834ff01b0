"""Arrow RecordBatch messages built and read by hand (docs/schema.md#buffer-layout,
docs/messages.md#record-batch-framing).

pyarrow cannot make a record batch whose columns have different lengths, which Barrage
modification batches need (an unmodified column is sent as field node (0, 0) while the others
carry their modified rows), nor does it write the `columns_as_list` form. This module writes the
Arrow Message flatbuffer and the body itself, with Deephaven's layout (docs/schema.md#buffer-layout):

- field nodes and buffers depth-first, column by column; every buffer padded to 8 bytes and its
  padded length reported; offsets cumulative from the start of the body;
- a validity bitmap only when null_count > 0, as whole 64-bit words, bits past the end zero;
- the null sentinel in the data buffer at every null slot; under `use_deephaven_nulls`,
  fixed-width columns with a sentinel report null_count 0 and send no validity; Bool, Utf8,
  Binary and List always use a bitmap;
- Utf8/Binary/List offsets rebased to 0, n + 1 int32 entries padded to 8, and an empty offsets
  buffer for a 0-row column;
- in list mode each column is preceded by its wrapper: node (1, 0), an empty validity buffer,
  offsets `[0, k]`, and RecordBatch.length is 1;
- the types a table keeps from a DoPut (schema.keeps_upload_type) in Arrow's own layouts: a map as
  a list of its entries struct (node, validity, then keys and values), a list_view as validity,
  offsets and sizes over its whole child, a union as type ids (and a dense union's offsets) with
  no validity, then its members, and a null column as a node (n, n) with no buffers.

Input arrays may be slices (any offset); their buffers are referenced, not copied, except where a
bitmap starts mid-byte or offsets must be rebased.

Reading produces one array per column, each with its own length, sliced from the body without
copying; every node, offset and length is checked first and anything inconsistent raises
ProtocolError.

`encode_batches` splits the rows of one phase (adds or mods) of a logical update into batches
following Deephaven's `batch_size` / `max_message_size` rules (docs/messages.md#batch-sizing); `BatchSizer` holds those
rules and `split_rows` plays them out for a given row size.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Iterator, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol.fbread import FbTable, root
from tickwire.protocol.fbwrite import FbWriter
from tickwire.protocol.flight import BytesLike, encode_flight_data, flight_data_size
from tickwire.protocol.schema import fill_sentinels, has_sentinel, is_list_wrapper_field

if TYPE_CHECKING:
    import numpy.typing as npt
    from typing_extensions import Buffer  # any object with the buffer protocol (PEP 688)

__all__ = [
    "HEADER_SCHEMA",
    "HEADER_DICTIONARY_BATCH",
    "HEADER_RECORD_BATCH",
    "METADATA_V5",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "INITIAL_BATCH_SIZE",
    "EncodedBatch",
    "MessageInfo",
    "BatchSizer",
    "encode_record_batch",
    "encode_batches",
    "split_rows",
    "read_message_header",
    "decode_record_batch",
]

HEADER_SCHEMA, HEADER_DICTIONARY_BATCH, HEADER_RECORD_BATCH = 1, 2, 3
METADATA_V5 = 4
DEFAULT_MAX_MESSAGE_SIZE = 100 * 1024 * 1024
INITIAL_BATCH_SIZE = 4096
_MAX_BATCH = 2**31 - 1
_ZEROS = bytes(64)


def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _fixed_width(t: pa.DataType) -> Optional[int]:
    """Byte width of a fixed-width (non-bit) type, None otherwise."""
    if pa.types.is_boolean(t) or pa.types.is_nested(t) or pa.types.is_dictionary(t):
        return None
    if pa.types.is_fixed_size_binary(t) and not pa.types.is_decimal(t):
        byte_width: int = t.byte_width
        return byte_width
    try:
        bits = t.bit_width
    except ValueError:
        return None
    return bits // 8 if bits >= 8 and bits % 8 == 0 else None


def _is_var_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_binary(t))


# ----------------------------------------------------------------------------------------------
# writing
# ----------------------------------------------------------------------------------------------

class _BodyWriter:
    __slots__ = ("parts", "buffers", "nodes", "offset")

    def __init__(self) -> None:
        self.parts: list[Buffer] = []
        self.buffers: list[tuple[int, int]] = []
        self.nodes: list[tuple[int, int]] = []
        self.offset = 0

    def empty(self) -> None:
        self.buffers.append((self.offset, 0))

    def add(self, *pieces: Buffer) -> None:
        """Appends one buffer made of `pieces` (bytes-like), zero-padded to a multiple of 8."""
        n = 0
        for p in pieces:
            size = memoryview(p).nbytes
            if size:
                self.parts.append(p)
                n += size
        padded = _pad8(n)
        if padded > n:
            self.parts.append(_ZEROS[: padded - n])
        self.buffers.append((self.offset, padded))
        self.offset += padded


def _bitmap_pieces(buf: Optional[pa.Buffer], bit_offset: int, n: int) -> list[Buffer]:
    """Bits [bit_offset, bit_offset + n) of `buf` starting at bit 0, bits past n zeroed, padded to
    whole 64-bit words. Byte-aligned input is referenced, not copied (except the last partial byte)."""
    words = ((n + 63) // 64) * 8
    nbytes = (n + 7) // 8
    if buf is None:
        raise ProtocolError("missing bitmap buffer")
    if bit_offset % 8 == 0:
        start = bit_offset // 8
        mv = memoryview(buf)[start:start + nbytes]
        if mv.nbytes < nbytes:
            raise ProtocolError(f"bitmap of {mv.nbytes} bytes is too short for {n} bits")
        full, rem = divmod(n, 8)
        pieces: list[Buffer] = [mv[:full]] if full else []
        if rem:
            pieces.append(bytes([mv[full] & ((1 << rem) - 1)]))
    else:
        bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")[bit_offset:bit_offset + n]
        pieces = [np.packbits(bits, bitorder="little").tobytes()]
    if words > nbytes:
        pieces.append(_ZEROS[: words - nbytes] if words - nbytes <= len(_ZEROS) else bytes(words - nbytes))
    return pieces


def _rebased_offsets(arr: pa.Array) -> tuple[np.ndarray, int, int]:
    """int32 offsets of a string/binary/list array starting at 0, and the child/data range they cover."""
    n = len(arr)
    raw = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + n + 1)[arr.offset:]
    first, last = int(raw[0]), int(raw[-1])
    return (raw - np.int32(first) if first else raw), first, last


def _write_empty(w: _BodyWriter, t: pa.DataType) -> None:
    """A column with no rows: field node (0, 0) and zero-length buffers (children included)."""
    w.nodes.append((0, 0))
    if pa.types.is_null(t):
        return  # a null column has no buffers
    if pa.types.is_union(t):  # no validity: type ids (and offsets), then every member
        w.empty()
        if t.mode == "dense":
            w.empty()
        for i in range(t.num_fields):
            _write_empty(w, t.field(i).type)
        return
    w.empty()
    if pa.types.is_map(t):
        w.empty()
        w.nodes.append((0, 0))  # its entries struct: validity, then the keys and the values
        w.empty()
        _write_empty(w, t.key_type)
        _write_empty(w, t.item_type)
    elif pa.types.is_list_view(t):
        w.empty()
        w.empty()  # sizes
        _write_empty(w, t.value_type)
    elif _is_var_binary(t):
        w.empty()
        w.empty()
    elif pa.types.is_list(t):
        w.empty()
        _write_empty(w, t.value_type)
    elif pa.types.is_fixed_size_list(t):
        _write_empty(w, t.value_type)
    elif pa.types.is_boolean(t) or _fixed_width(t) is not None:
        w.empty()
    else:
        raise ProtocolError(f"unsupported Arrow type for Barrage: {t}")


def _map_entries(t: pa.DataType) -> pa.DataType:
    """The entries struct a map column's offsets index."""
    return pa.struct([t.key_field, t.item_field])


def _own_values(a: pa.Array, i: int, dtype: "npt.DTypeLike") -> memoryview:
    """The rows of `a` in its buffer `i` of fixed-width entries (a union's type ids or offsets, a
    list_view's offsets or sizes), without copying (pyarrow's accessors of these ignore a slice's offset)."""
    return np.frombuffer(a.buffers()[i], dtype=dtype, count=a.offset + len(a))[a.offset:].data


def _write_validity(w: _BodyWriter, arr: pa.Array, nulls: int) -> None:
    if nulls:
        w.add(*_bitmap_pieces(arr.buffers()[0], arr.offset, len(arr)))
    else:
        w.empty()


def _write_column(w: _BodyWriter, arr: pa.Array, dh_nulls: bool) -> None:
    t = arr.type
    n = len(arr)
    if n == 0:
        _write_empty(w, t)
        return
    nulls = arr.null_count
    if pa.types.is_boolean(t):
        w.nodes.append((n, nulls))
        _write_validity(w, arr, nulls)
        w.add(*_bitmap_pieces(arr.buffers()[1], arr.offset, n))
        return
    if _is_var_binary(t):
        w.nodes.append((n, nulls))
        _write_validity(w, arr, nulls)
        offs, first, last = _rebased_offsets(arr)
        w.add(offs.data)
        if last > first:
            w.add(memoryview(arr.buffers()[2])[first:last])
        else:
            w.empty()
        return
    if pa.types.is_list(t):
        w.nodes.append((n, nulls))
        _write_validity(w, arr, nulls)
        offs, first, last = _rebased_offsets(arr)
        w.add(offs.data)
        _write_column(w, arr.values.slice(first, last - first), dh_nulls)
        return
    if pa.types.is_map(t):  # a list of its entries struct
        w.nodes.append((n, nulls))
        _write_validity(w, arr, nulls)
        offs, first, last = _rebased_offsets(arr)
        w.add(offs.data)
        entries = arr.values.slice(first, last - first)
        w.nodes.append((len(entries), entries.null_count))  # (a map's entries are never null)
        _write_validity(w, entries, entries.null_count)
        for i in range(2):  # (sliced as the entries are; their nulls always in a validity buffer)
            _write_column(w, entries.field(i), False)
        return
    if pa.types.is_list_view(t):
        # offsets and sizes of the rows sent, over the whole child (a list_view child has no order)
        w.nodes.append((n, nulls))
        _write_validity(w, arr, nulls)
        w.add(_own_values(arr, 1, "<i4"))
        w.add(_own_values(arr, 2, "<i4"))
        _write_column(w, arr.values, dh_nulls)
        return
    if pa.types.is_union(t):
        # no validity (a null is a member's null): type ids, a dense union's offsets into its
        # whole members, a sparse union's members sliced as the union is
        w.nodes.append((n, 0))
        w.add(_own_values(arr, 1, np.int8))
        if t.mode == "dense":
            w.add(_own_values(arr, 2, "<i4"))
        for i in range(t.num_fields):  # (their nulls always in a validity buffer)
            _write_column(w, arr.field(i), False)
        return
    if pa.types.is_null(t):
        w.nodes.append((n, n))
        return
    if pa.types.is_fixed_size_list(t):
        # no offsets: the child holds list_size values per row, null rows included
        w.nodes.append((n, nulls))
        _write_validity(w, arr, nulls)
        _write_column(w, arr.values.slice(arr.offset * t.list_size, n * t.list_size), dh_nulls)
        return
    width = _fixed_width(t)
    if width is None or pa.types.is_decimal32(t) or pa.types.is_decimal64(t):
        raise ProtocolError(f"unsupported Arrow type for Barrage: {t} (convert with schema.to_wire_array first)")
    sentinel = has_sentinel(t)
    if nulls and sentinel:
        arr = fill_sentinels(arr)
    skip_validity = dh_nulls and sentinel
    w.nodes.append((n, 0 if skip_validity else nulls))
    _write_validity(w, arr, 0 if skip_validity else nulls)
    start = arr.offset * width
    if width:
        w.add(memoryview(arr.buffers()[1])[start:start + n * width])
    else:
        w.empty()  # fixed_size_binary[0]


@dataclass
class EncodedBatch:
    """One encoded RecordBatch: the Message flatbuffer, the body as a list of buffers, the body's
    length, and the number of rows it carries (the largest column length). Unpacks as
    `header, body_parts, body_length = batch`."""

    header: bytes
    body_parts: list[Buffer]
    body_length: int
    rows: int

    def __iter__(self) -> Iterator[Union[bytes, list[Buffer], int]]:
        return iter((self.header, self.body_parts, self.body_length))

    def body(self) -> bytes:
        return b"".join(self.body_parts)

    def flight_data(self, app_metadata: Optional[bytes] = None) -> bytes:
        """The serialized FlightData carrying this batch (body field always present)."""
        return encode_flight_data(self.header, app_metadata, body_parts=self.body_parts)

    def flight_data_size(self, app_metadata_size: Optional[int] = None) -> int:
        return flight_data_size(len(self.header), self.body_length, app_metadata_size)


def _message_header(length: int, nodes: list[tuple[int, int]], buffers: list[tuple[int, int]],
                    body_length: int) -> bytes:
    """Message{RecordBatch} in Deephaven's builder order (docs/messages.md#record-batch-headers),
    written by FbWriter: the bytes flatbuffers.Builder gives for that order (tests/test_fbwrite.py),
    at a fifth of its cost for a few columns; every message a publisher sends has one."""
    w = FbWriter()
    # FieldNode {length, null_count} and Buffer {offset, length}: two little-endian int64 each
    nodes_vec = w.structs_vector(struct.pack(f"<{2 * len(nodes)}q", *chain.from_iterable(nodes)), len(nodes), 8)
    buffers_vec = w.structs_vector(struct.pack(f"<{2 * len(buffers)}q", *chain.from_iterable(buffers)),
                                   len(buffers), 8)
    w.start(5)  # RecordBatch: length, nodes, buffers, compression, variadicBufferCounts
    w.offset(1, nodes_vec)
    w.offset(2, buffers_vec)
    if length:
        w.scalar(0, "<q", 8, length)
    rb = w.end()
    w.start(5)  # Message: version, header_type, header, bodyLength, custom_metadata
    w.scalar(1, "<B", 1, HEADER_RECORD_BATCH)
    w.offset(2, rb)
    w.scalar(0, "<h", 2, METADATA_V5)
    if body_length:
        w.scalar(3, "<q", 8, body_length)
    return w.finish(w.end())


def encode_record_batch(
    columns: Sequence[Optional[pa.Array]],
    types: Optional[Sequence[pa.DataType]] = None,
    *,
    use_deephaven_nulls: bool = False,
    columns_as_list: bool = False,
    length: int = 0,
) -> EncodedBatch:
    """One RecordBatch message (`length`: its row count when it has no columns to say it).

    `columns[i]` holds column i's rows in this batch (wire types, see `schema.to_wire_array`), or
    None when the column is not sent (field node (0, 0) and zero-length buffers; in list mode an
    empty list). `types` are the unwrapped wire types of all columns; they are required when a
    column is None and are checked against the arrays otherwise. RecordBatch.length is the
    largest column length (1 in list mode)."""
    if types is not None and len(columns) != len(types):
        raise ValueError(f"{len(columns)} columns for a schema of {len(types)}")
    w = _BodyWriter()
    rows = 0
    for i, arr in enumerate(columns):
        t = types[i] if types is not None else None
        if arr is not None:
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
            if t is not None and arr.type != t:
                raise ProtocolError(f"column {i} has type {arr.type} where the schema says {t}")
            t = arr.type
        elif t is None:
            raise ValueError(f"column {i} is None and no type was given for it")
        k = 0 if arr is None else len(arr)
        rows = max(rows, k)
        if columns_as_list:
            w.nodes.append((1, 0))
            w.empty()
            w.add(np.array([0, k], dtype=np.int32).data)
        if arr is None:
            _write_empty(w, t)
        else:
            _write_column(w, arr, use_deephaven_nulls)
    if not columns:
        rows = length
    header = _message_header(1 if columns_as_list else rows, w.nodes, w.buffers, w.offset)
    return EncodedBatch(header, w.parts, w.offset, rows)


class BatchSizer:
    """Deephaven's batch sizing (docs/messages.md#batch-sizing, `processBatches`).

    `next_rows` is the row count to try next: min(4096, batch_size) at first, then
    min(batch_size, max(1, int(limit // bytes_per_row * 0.9))) from the last attempt's
    bytes per row (unchanged when that is 0). `accept(rows, nbytes)` records an attempt and says
    whether to send it: a FlightData of `limit` bytes or more is dropped and retried smaller
    (always fewer rows), unless it holds a single row."""

    def __init__(self, batch_size: int = 0, max_message_size: int = 0, initial_rows: int = 0):
        self.max_batch = batch_size if batch_size > 0 else _MAX_BATCH
        self.limit = max_message_size if max_message_size > 0 else DEFAULT_MAX_MESSAGE_SIZE
        self.next_rows = min(initial_rows if initial_rows > 0 else INITIAL_BATCH_SIZE, self.max_batch)

    def accept(self, rows: int, nbytes: int) -> bool:
        if rows <= 0:
            raise ValueError("a batch holds at least one row")
        ok = nbytes < self.limit or rows == 1
        per_row = nbytes // rows
        nxt = self.next_rows
        if per_row > 0:
            nxt = min(self.max_batch, max(1, int((self.limit // per_row) * 0.9)))
        if not ok:
            nxt = min(nxt, rows - 1)
        self.next_rows = nxt
        return ok


def split_rows(n_rows: int, *, batch_size: int = 0, max_message_size: int = 0, bytes_per_row: int,
               fixed_bytes: int = 0) -> list[int]:
    """The batch sizes Deephaven's rules give for `n_rows` rows when a batch of r rows serializes
    to `fixed_bytes + r * bytes_per_row` bytes."""
    sizer = BatchSizer(batch_size, max_message_size)
    out: list[int] = []
    done = 0
    while done < n_rows:
        rows = max(1, min(sizer.next_rows, n_rows - done))
        if sizer.accept(rows, fixed_bytes + rows * bytes_per_row):
            out.append(rows)
            done += rows
    return out


def encode_batches(
    columns: Sequence[Optional[pa.Array]],
    types: Optional[Sequence[pa.DataType]] = None,
    *,
    use_deephaven_nulls: bool = False,
    columns_as_list: bool = False,
    batch_size: int = 0,
    max_message_size: int = 0,
    overhead: int = 0,
    metadata_size: int = 0,
    initial_rows: int = 0,
    rows: int = 0,
) -> Iterator[EncodedBatch]:
    """Splits one phase (adds or mods) of a logical update into record batches (docs/messages.md#batch-sizing).

    Batch j covers the ordinals [o, o + L) of every column: ragged columns give fewer rows or
    none (an empty column), columns that are None stay unsent. Columns are sliced without copying.
    Each attempt is measured as its FlightData size (header and body fields) plus `overhead`, plus
    `metadata_size` for the first batch (the one that carries the app_metadata); `BatchSizer`
    decides the sizes, trying `initial_rows` first when given (Deephaven's 4096 otherwise).
    Yields nothing when every column is empty or None. A table without columns gives its row
    count as `rows` (RecordBatch.length is all that carries it)."""
    total = max((len(c) for c in columns if c is not None), default=0) if columns else rows
    sizer = BatchSizer(batch_size, max_message_size, initial_rows)
    extra = overhead + metadata_size
    o = 0
    while o < total:
        rows = max(1, min(sizer.next_rows, total - o))
        part = [None if c is None else c.slice(min(o, len(c)), max(0, min(rows, len(c) - o))) for c in columns]
        enc = encode_record_batch(part, types, use_deephaven_nulls=use_deephaven_nulls,
                                  columns_as_list=columns_as_list, length=rows)
        enc.rows = rows
        if sizer.accept(rows, enc.flight_data_size() + extra):
            yield enc
            o += rows
            extra = overhead


# ----------------------------------------------------------------------------------------------
# reading
# ----------------------------------------------------------------------------------------------

@dataclass
class MessageInfo:
    """A parsed Arrow Message header. For batches, `nodes` is an (k, 2) int64 array of
    (length, null_count) and `buffers` an (m, 2) int64 array of (offset, length)."""

    header_type: int
    body_length: int
    version: int = METADATA_V5
    length: int = 0
    nodes: Optional[np.ndarray] = None
    buffers: Optional[np.ndarray] = None
    dictionary_id: int = 0
    is_delta: bool = False
    compressed: bool = False


def _struct_array(t: FbTable, slot: int, name: str) -> np.ndarray:
    v = t.vector(slot, name, 16)
    if v is None:
        return np.zeros((0, 2), dtype=np.int64)
    start, count = v
    return np.frombuffer(t.buf, dtype="<i8", count=2 * count, offset=start).reshape(count, 2).astype(np.int64)


def read_message_header(header: Union[BytesLike, MessageInfo]) -> MessageInfo:
    """Parses an Arrow Message flatbuffer (raw, as in FlightData.data_header)."""
    if isinstance(header, MessageInfo):
        return header
    msg = root(header, "arrow Message")
    version = msg.scalar(0, "<h", 0, "version")
    if version < 3 or version > METADATA_V5:
        raise ProtocolError(f"arrow Message: unsupported metadata version V{version + 1}")
    htype = msg.scalar(1, "<B", 0, "header_type")
    body_length = msg.scalar(3, "<q", 0, "bodyLength")
    if body_length < 0:
        raise ProtocolError(f"arrow Message: negative bodyLength {body_length}")
    info = MessageInfo(htype, body_length, version)
    if htype == HEADER_SCHEMA:
        return info
    if htype == HEADER_RECORD_BATCH:
        rb = msg.table(2, "header")
    elif htype == HEADER_DICTIONARY_BATCH:
        db = msg.table(2, "header")
        if db is None:
            raise ProtocolError("arrow Message: DictionaryBatch header missing")
        info.dictionary_id = db.scalar(0, "<q", 0, "id")
        info.is_delta = bool(db.scalar(2, "<B", 0, "isDelta"))
        rb = db.table(1, "data")
    else:
        raise ProtocolError(f"arrow Message: unsupported header type {htype}")
    if rb is None:
        raise ProtocolError("arrow Message: RecordBatch header missing")
    info.length = rb.scalar(0, "<q", 0, "length")
    info.nodes = _struct_array(rb, 1, "nodes")
    info.buffers = _struct_array(rb, 2, "buffers")
    info.compressed = rb.table(3, "compression") is not None
    if info.length < 0:
        raise ProtocolError(f"arrow RecordBatch: negative length {info.length}")
    if info.nodes.size and info.nodes.min() < 0:
        raise ProtocolError("arrow RecordBatch: negative field node length or null count")
    return info


class _Reader:
    def __init__(self, info: MessageInfo, body: pa.Buffer):
        assert info.nodes is not None and info.buffers is not None  # read_message_header sets them for batches
        self.nodes: np.ndarray = info.nodes
        self.buffers: np.ndarray = info.buffers
        self.body = body
        self.ni = 0
        self.bi = 0

    def node(self, name: str) -> tuple[int, int]:
        if self.ni >= len(self.nodes):
            raise ProtocolError(f"record batch: no field node left for column {name!r}")
        ln, nc = (int(x) for x in self.nodes[self.ni])
        self.ni += 1
        if nc > ln:
            raise ProtocolError(f"record batch: column {name!r} has null_count {nc} > length {ln}")
        if ln >= 2**31 - 1:
            raise ProtocolError(f"record batch: column {name!r} length {ln} is too large")
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


_EMPTY = pa.py_buffer(b"")
_ZERO_OFFSET = pa.py_buffer(np.zeros(1, dtype=np.int32).tobytes())


def _from_buffers(t: pa.DataType, n: int, buffers: list[Optional[pa.Buffer]], nulls: int, name: str,
                  children: Optional[list[pa.Array]] = None) -> pa.Array:
    try:
        return pa.Array.from_buffers(t, n, buffers, null_count=nulls, children=children)
    except (pa.ArrowException, ValueError, TypeError) as exc:
        raise ProtocolError(f"record batch: column {name!r} ({t}) is malformed: {exc}") from None


def _read_column(r: _Reader, t: pa.DataType, name: str) -> pa.Array:
    n, nulls = r.node(name)
    if pa.types.is_null(t):
        return pa.nulls(n)
    if pa.types.is_union(t):
        return _read_union(r, t, n, name)
    validity = r.buffer(name)
    if nulls:
        _need(validity, (n + 7) // 8, "validity", name)
    else:
        validity = None
    if pa.types.is_fixed_size_list(t):
        child = _read_column(r, t.value_type, name + "[]")
        if len(child) < n * t.list_size:
            raise ProtocolError(f"record batch: fixed-size list column {name!r} of {n} rows needs "
                                f"{n * t.list_size} values, the child has {len(child)}")
        return _from_buffers(t, n, [validity], nulls, name, children=[child])
    if pa.types.is_list_view(t):
        offsets, sizes = r.buffer(name), r.buffer(name)
        _need(offsets, 4 * n, "offsets", name)
        _need(sizes, 4 * n, "sizes", name)
        child = _read_column(r, t.value_type, name + "[]")
        return _from_buffers(t, n, [validity, offsets if n else _EMPTY, sizes if n else _EMPTY], nulls, name,
                             children=[child])
    if _is_var_binary(t) or pa.types.is_list(t) or pa.types.is_map(t):
        offsets = r.buffer(name)
        if n:
            _need(offsets, 4 * (n + 1), "offsets", name)
            assert offsets is not None  # _need refused a missing buffer
            offs = np.frombuffer(offsets, dtype="<i4", count=n + 1)
            if offs[0] < 0 or (n and np.any(offs[1:] < offs[:-1])):
                raise ProtocolError(f"record batch: column {name!r} has negative or decreasing offsets")
            end = int(offs[-1])
        else:
            offsets = _ZERO_OFFSET
            end = 0
        if pa.types.is_list(t) or pa.types.is_map(t):
            child = _read_entries(r, t, name) if pa.types.is_map(t) else _read_column(r, t.value_type, name + "[]")
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


def _read_entries(r: _Reader, t: pa.DataType, name: str) -> pa.Array:
    """The entries struct of a map column: its node and validity, then the keys and the values."""
    n, nulls = r.node(name)
    validity = r.buffer(name)
    if nulls:
        _need(validity, (n + 7) // 8, "validity", name)
    else:
        validity = None
    keys = _read_column(r, t.key_type, name + ".key")
    items = _read_column(r, t.item_type, name + ".value")
    if len(keys) < n or len(items) < n:
        raise ProtocolError(f"record batch: map column {name!r} has {n} entries but fewer keys or values")
    return _from_buffers(_map_entries(t), n, [validity], nulls, name, children=[keys, items])


def _read_union(r: _Reader, t: pa.DataType, n: int, name: str) -> pa.Array:
    type_ids = r.buffer(name)
    _need(type_ids, n, "type ids", name)
    buffers: list[Optional[pa.Buffer]] = [None, type_ids if n else _EMPTY]
    if t.mode == "dense":
        offsets = r.buffer(name)
        _need(offsets, 4 * n, "offsets", name)
        buffers.append(offsets if n else _EMPTY)
    children = [_read_column(r, t.field(i).type, f"{name}.{t.field(i).name}") for i in range(t.num_fields)]
    if t.mode == "sparse" and any(len(c) < n for c in children):
        raise ProtocolError(f"record batch: sparse union column {name!r} of {n} rows has a shorter member")
    return _from_buffers(t, n, buffers, 0, name, children=children)


def _has_var_width(t: pa.DataType) -> bool:
    """Whether reading a column of type `t` needs Arrow's full validation (offsets, type ids, UTF-8)."""
    if pa.types.is_map(t) or pa.types.is_union(t) or pa.types.is_list_view(t) or pa.types.is_struct(t):
        return True
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
        return _has_var_width(t.value_type)
    return _is_var_binary(t)


def _column_fields(schema: _SchemaLike, columns_as_list: bool) -> list[tuple[str, pa.DataType]]:
    out: list[tuple[str, pa.DataType]] = []
    for i, f in enumerate(schema):
        if isinstance(f, pa.DataType):
            out.append((f"#{i}", f))
            continue
        try:  # a schema read from the wire may hold names that are not UTF-8: pyarrow fails on reading them
            if columns_as_list and is_list_wrapper_field(f):
                out.append((f.name, f.type.value_type))
            else:
                out.append((f.name, f.type))
        except UnicodeDecodeError:
            raise ProtocolError(f"record batch: the name of schema field {i} (or of its list child) is not valid "
                                "UTF-8") from None
    return out


#: a pa.Schema, a list of fields or a list of types
_SchemaLike = Union[pa.Schema, Sequence[pa.Field], Sequence[pa.DataType]]


def decode_record_batch(header: Union[BytesLike, MessageInfo], body: Union[BytesLike, pa.Buffer, None],
                        schema: _SchemaLike, *, columns_as_list: bool = False) -> list[pa.Array]:
    """Reads a RecordBatch into one array per column, each with its own length (ragged batches).

    `header` is the Message flatbuffer (or a `MessageInfo` from `read_message_header`), `body`
    the FlightData body (bytes, memoryview or pa.Buffer; arrays reference it without copying),
    `schema` a pa.Schema, a list of fields or a list of types. In list mode each column arrives
    wrapped in a one-element list (docs/messages.md#columns-as-list) and the values inside are
    returned; the schema may be the wrapped one from the stream's Schema message
    (`list_wrapped_schema`) or the unwrapped one.
    Sentinels are not converted (see `schema.sentinels_to_nulls`)."""
    info = read_message_header(header)
    if info.header_type not in (HEADER_RECORD_BATCH, HEADER_DICTIONARY_BATCH):
        raise ProtocolError(f"arrow Message of header type {info.header_type} is not a record batch")
    if info.compressed:
        raise ProtocolError("compressed record batch bodies are not supported")
    buf: pa.Buffer
    if body is None:
        buf = _EMPTY
    elif isinstance(body, pa.Buffer):
        buf = body
    else:
        try:
            buf = pa.py_buffer(body)
        except TypeError:
            raise ProtocolError(f"record batch body must be bytes-like, got {type(body).__name__}") from None
    if buf.size < info.body_length:
        raise ProtocolError(f"record batch: body has {buf.size} bytes, the header declares {info.body_length}")
    fields = _column_fields(schema, columns_as_list)
    r = _Reader(info, buf)
    out = []
    for name, t in fields:
        if columns_as_list:
            wrapper = _read_column(r, pa.list_(pa.field(name, t)), name)
            if len(wrapper) != 1:
                raise ProtocolError(f"list-wrapped column {name!r} has {len(wrapper)} lists, expected 1")
            if wrapper.null_count:
                raise ProtocolError(f"list-wrapped column {name!r} is null")
            start, stop = (int(x) for x in np.frombuffer(wrapper.buffers()[1], dtype="<i4", count=2))
            out.append(wrapper.values.slice(start, stop - start))
        else:
            arr = _read_column(r, t, name)
            if len(arr) > info.length:
                raise ProtocolError(f"record batch: column {name!r} has {len(arr)} rows, more than the batch "
                                    f"length {info.length}")
            out.append(arr)
    if columns_as_list and fields and info.length != 1:
        raise ProtocolError(f"list-mode record batch has length {info.length}, expected 1")
    if r.ni != len(r.nodes) or r.bi != len(r.buffers):
        raise ProtocolError(f"record batch: {len(r.nodes) - r.ni} field node(s) and {len(r.buffers) - r.bi} "
                            f"buffer(s) left over after {len(fields)} column(s)")
    for (name, _t), arr in zip(fields, out):
        try:
            # full validation checks offsets and UTF-8; fixed-width values are only checked structurally,
            # because Deephaven's null sentinel (-2^63) is not a valid date or time of day
            arr.validate(full=_has_var_width(arr.type))
        except pa.ArrowException as exc:
            raise ProtocolError(f"record batch: column {name!r} is invalid: {exc}") from None
    return out
