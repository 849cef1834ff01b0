"""The server side of a DoPut upload, sans-I/O: FlightData bytes in, events out.

    decoder = UploadDecoder()
    for raw in request_stream:
        for event in decoder.feed(raw):   # Destination, Options, UploadSchema, Batch
            if isinstance(event, Batch):
                table = event.decode()    # CPU work: run it in a worker thread
    end = decoder.close()                 # End, once the client half-closes

The rules are those of docs/flows.md#doput: the first FlightData names the destination with a
PATH descriptor (a later, different descriptor is refused); an optional metadata-only message
carries the serialization options (`use_deephaven_nulls`, `columns_as_list`), or a transaction
(a JSON object, protocol/txn.py: the upload is staged for an exactly-once commit); then one Schema
message, checked before anything is made from it (types with a wire mapping that Deephaven accepts,
or that a table keeps from its upload as Deephaven does: maps, unions, list_views, nulls; the
`tickwire:keys` metadata naming UTF-8 column names of the schema); then RecordBatches. Each
refusal raises `UploadError` (INVALID_ARGUMENT); the decoder accepts nothing after one.

`feed` only parses headers and checks the schema; decoding a batch's body, which costs what the
batch holds, is left to `Batch.decode()`, which reads nothing of the decoder and may run in any
thread (and concurrently with later calls to `feed`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.batches import (
    HEADER_RECORD_BATCH,
    HEADER_SCHEMA,
    MessageInfo,
    decode_record_batch,
    read_message_header,
)
from tickwire.protocol.flight import DESCRIPTOR_PATH, BytesLike, decode_flight_data
from tickwire.protocol.schema import (
    BARRAGE_SCHEMA,
    check_wire_schema,
    from_wire_arrays,
    keeps_upload_type,
    read_schema_message,
    sentinels_to_nulls,
    to_wire_array,
    unwrap_list_schema,
    with_list_values,
)
from tickwire.protocol.txn import Transaction, TxnError, is_transaction, parse_transaction

__all__ = [
    "KEYS_METADATA",
    "UploadError",
    "UploadDecoder",
    "Destination",
    "Options",
    "UploadSchema",
    "Batch",
    "End",
    "UploadEvent",
    "check_put_keys",
    "check_put_types",
    "decode_put_batch",
]

# schema metadata naming the key columns of a table created by DoPut (comma separated): the
# upload creates a keyed (upsert) table instead of an append-only one
KEYS_METADATA = b"tickwire:keys"


class UploadError(ProtocolError):
    """An upload the server refuses; `code` is the gRPC status name to answer with."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT"):
        super().__init__(message, code)


@dataclass(frozen=True)
class Destination:
    """The destination named by the first descriptor: `["scope", name]` or `["export", id]`."""

    path: list[str]


@dataclass(frozen=True)
class Options:
    """Serialization options from a metadata-only message (they apply to the batches after it)."""

    use_deephaven_nulls: bool
    columns_as_list: bool


@dataclass(frozen=True)
class UploadSchema:
    """The upload's schema: unwrapped when the columns come as lists, checked, with the key
    columns its `tickwire:keys` metadata names (empty for an append-only upload)."""

    schema: pa.Schema
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Batch:
    """One RecordBatch, not decoded yet: `decode()` returns its rows as a pa.Table (natural
    values), or raises UploadError. It depends on nothing but its own fields."""

    info: MessageInfo
    body: Optional[bytes | memoryview]
    schema: pa.Schema
    use_deephaven_nulls: bool = False
    columns_as_list: bool = False

    @property
    def num_rows(self) -> int:
        """The row count the header declares (the decoded table's columns may not agree)."""
        return int(self.info.length)

    def decode(self) -> pa.Table:
        return decode_put_batch(self.info, self.body, self.schema, self.use_deephaven_nulls, self.columns_as_list)


@dataclass(frozen=True)
class End:
    """The client half-closed a valid upload; `batches` counts the Batch events."""

    path: list[str]
    schema: pa.Schema
    keys: tuple[str, ...]
    batches: int


UploadEvent = Union[Destination, Options, UploadSchema, Transaction, Batch, End]


def check_put_keys(schema: pa.Schema) -> tuple[str, ...]:
    """The key columns the `tickwire:keys` schema metadata of an upload names: UTF-8 names of
    columns of the schema (empty when the metadata is absent)."""
    raw = (schema.metadata or {}).get(KEYS_METADATA)
    if raw is None:
        return ()
    try:
        keys = [k for k in raw.decode("utf-8").split(",") if k]
    except UnicodeDecodeError:
        raise UploadError("DoPut: schema metadata 'tickwire:keys' is not UTF-8") from None
    missing = [k for k in keys if k not in schema.names]
    if missing:
        shown = ", ".join(repr(k[:64]) for k in missing[:5])
        raise UploadError(f"DoPut: 'tickwire:keys' names {len(missing)} column(s) not in the schema: {shown}")
    return tuple(keys)


def decode_put_batch(info: MessageInfo, body: Optional[BytesLike], schema: pa.Schema, dh_nulls: bool,
                     as_list: bool) -> pa.Table:
    """One uploaded RecordBatch as a pa.Table of natural values: Deephaven nulls read as nulls when
    `dh_nulls`, list-wrapped columns unwrapped when `as_list`; columns of different lengths and
    instants, durations and times that do not fit in nanoseconds are refused."""
    try:
        raw = decode_record_batch(info, body, schema, columns_as_list=as_list)
        arrays = from_wire_arrays(raw, schema)
        # a type the table keeps from the upload stays as sent (a LocalDate sent as date64 is not made date32)
        arrays = [r if keeps_upload_type(f.type) and a.type != f.type and r.type == f.type else a
                  for f, r, a in zip(schema, raw, arrays)]
    except ProtocolError as exc:
        raise UploadError(f"bad record batch: {exc}") from None
    lengths = {len(a) for a in arrays}
    if len(lengths) > 1:
        raise UploadError(f"DoPut record batch columns have different lengths {sorted(lengths)}")
    if dh_nulls:
        arrays = [sentinels_to_nulls(a) for a in arrays]
    # Deephaven stores uint16 as `char` and list elements as Java primitives, whose null sentinels
    # (0xFFFF, -2^31, ...) read as null there whatever the options: so do they here
    arrays = [_char_and_element_nulls(a) for a in arrays]
    for f, a in zip(schema, arrays):  # values every reader must be able to send (e.g. instants in ns)
        if pa.types.is_timestamp(f.type) or pa.types.is_duration(f.type) or pa.types.is_time(f.type):
            try:
                wire = to_wire_array(a)
            except (ProtocolError, pa.ArrowInvalid) as exc:
                raise UploadError(f"DoPut column {f.name!r}: {exc}") from None
            if pa.types.is_time(f.type):
                _check_time_of_day(f, wire)
    return pa.Table.from_arrays(arrays, names=schema.names)


_NS_PER_DAY = 86_400 * 10**9


def _char_and_element_nulls(arr: pa.Array) -> pa.Array:
    """`arr` with its uint16 values 0xFFFF, the sentinel-valued elements of its lists (of any
    kind) and values of its maps, and the sentinel-valued (temporal included) values of its union
    members, made null, as Deephaven reads them; map keys are kept. Whole-array operations, no
    copy when nothing changes."""
    t = arr.type
    if pa.types.is_uint16(t):
        return sentinels_to_nulls(arr)
    if _is_list_like(t):
        return with_list_values(arr, _element_nulls(arr.values))
    if pa.types.is_map(t):
        entries = arr.values
        items = entries.field(1)
        new = _element_nulls(items)
        if new is items:
            return arr
        keys = entries.field(0)
        struct = pa.StructArray.from_arrays([keys, new], fields=[t.key_field, t.item_field])
        validity = arr.buffers()[0] if arr.null_count else None
        return pa.Array.from_buffers(t, len(arr), [validity, arr.buffers()[1]], null_count=arr.null_count,
                                     offset=arr.offset, children=[struct])
    if pa.types.is_union(t):
        return _union_member_nulls(arr)
    return arr


def _element_nulls(child: pa.Array) -> pa.Array:
    """A list element's or map value's reading: Java primitives' sentinels (not instants') are null."""
    ct = child.type
    if _is_list_like(ct) or pa.types.is_uint16(ct) or pa.types.is_map(ct) or pa.types.is_union(ct):
        return _char_and_element_nulls(child)
    return sentinels_to_nulls(child) if not _is_temporal(ct) else child


def _union_member_nulls(arr: pa.Array) -> pa.Array:
    """A union with the sentinel values of its members made null (members are boxed objects in
    Deephaven: instants' sentinels too)."""
    t = arr.type
    members = [arr.field(i) for i in range(t.num_fields)]  # sparse: sliced as the union; dense: whole
    new = [_char_and_element_nulls(m) if pa.types.is_nested(m.type) or pa.types.is_uint16(m.type)
           else sentinels_to_nulls(m) for m in members]
    if all(a is b for a, b in zip(members, new)):
        return arr
    n = len(arr)
    bufs = arr.buffers()  # (pyarrow's type_codes and offsets accessors ignore a slice's offset)
    type_ids = pa.Array.from_buffers(pa.int8(), n, [None, bufs[1]], offset=arr.offset)
    names = [t.field(i).name for i in range(t.num_fields)]
    if t.mode == "dense":
        offsets = pa.Array.from_buffers(pa.int32(), n, [None, bufs[2]], offset=arr.offset)
        return pa.UnionArray.from_dense(type_ids, offsets, new, names, list(t.type_codes))
    return pa.UnionArray.from_sparse(type_ids, new, names, list(t.type_codes))


def _is_list_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t))


def _is_temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t))


def _check_time_of_day(f: pa.Field, ns: pa.Array) -> None:
    """Times (as ns) must lie within a day, as Deephaven's LocalTime does: it refuses the upload otherwise."""
    if len(ns) == 0 or ns.null_count == len(ns):
        return
    v = ns.view(pa.int64())
    lo, hi = pc.min(v).as_py(), pc.max(v).as_py()
    if lo < 0 or hi >= _NS_PER_DAY:
        bad = lo if lo < 0 else hi
        raise UploadError(f"DoPut column {f.name!r} ({f.type}): {bad} ns is not a time of day "
                          f"(0 to 24 h, excluded)")


def check_put_types(schema: pa.Schema) -> None:
    """Refuses the column types Deephaven refuses on DoPut: decimal32 and decimal64 (docs/types.md)
    and the 64-bit-offset types (large_string, large_binary, large_list, large_list_view), at any
    depth (list elements, map keys and values, union members). Raises UploadError naming the
    column and its type."""
    for f in schema:
        bad = _refused_within(f.type)
        if bad is None:
            continue
        within = "" if bad == f.type else f", whose {bad}"
        hint = "send decimal128 or decimal256" if pa.types.is_decimal(bad) else \
            "send its 32-bit-offset form (string, binary, list, list_view)"
        raise UploadError(f"DoPut: column {f.name!r} has type {f.type}{within}, which Deephaven does not accept "
                          f"on DoPut; {hint}")


def _refused_within(t: pa.DataType) -> Optional[pa.DataType]:
    """The first type within `t` (`t` itself included) that Deephaven refuses on DoPut, or None:
    decimal32, decimal64 and the 64-bit-offset types (large_string, large_binary, large_list,
    large_list_view)."""
    if (pa.types.is_decimal32(t) or pa.types.is_decimal64(t) or pa.types.is_large_list_view(t)
            or pa.types.is_large_list(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)):
        return t
    for i in range(t.num_fields):
        bad = _refused_within(t.field(i).type)
        if bad is not None:
            return bad
    return None


class UploadDecoder:
    """Reads the client-to-server half of one DoPut call.

    State, readable at any time: `path` (the destination, once named), `schema` and `keys` (once
    the Schema message arrived), `use_deephaven_nulls` and `columns_as_list` (the options so far),
    `transaction` (once named), `batches` (Batch events so far) and `closed`."""

    def __init__(self) -> None:
        self.path: Optional[list[str]] = None
        self.schema: Optional[pa.Schema] = None
        self.keys: tuple[str, ...] = ()
        self.use_deephaven_nulls = False
        self.columns_as_list = False
        self.batches = 0
        self.closed = False
        self.transaction: Optional[Transaction] = None

    def feed(self, data: BytesLike) -> list[UploadEvent]:
        """The events of one FlightData (bytes-like), in order: a Destination when the first
        descriptor arrives, a Transaction when its app_metadata names one, then at most one of
        Options, UploadSchema or Batch. Raises UploadError
        for a message the server refuses."""
        if self.closed:
            raise UploadError("DoPut: a message after the end of the upload")
        try:
            return self._feed(data)
        except BaseException:
            self.closed = True
            raise

    def _feed(self, data: BytesLike) -> list[UploadEvent]:
        try:
            fd = decode_flight_data(data)
        except ProtocolError as exc:
            raise UploadError(f"malformed FlightData: {exc}") from None
        events: list[UploadEvent] = []
        if fd.descriptor is not None:
            if fd.descriptor.type != DESCRIPTOR_PATH:
                raise UploadError("DoPut needs a PATH flight descriptor naming the destination")
            if self.path is None:
                self.path = list(fd.descriptor.path)
                events.append(Destination(list(self.path)))
            elif list(fd.descriptor.path) != self.path:
                raise UploadError(f"DoPut descriptor changed from {self.path} to {list(fd.descriptor.path)}")
        if self.path is None:
            raise UploadError("Result flight descriptor never provided")
        if fd.app_metadata is not None and is_transaction(fd.app_metadata):
            # an exactly-once write (protocol/txn.py): before or with the first record batch, once
            if self.batches:
                raise UploadError("DoPut: the transaction must come before the first record batch")
            if self.transaction is not None:
                raise UploadError("DoPut: a second transaction in one upload")
            try:
                self.transaction = parse_transaction(fd.app_metadata)
            except TxnError as exc:
                raise UploadError(str(exc)) from None
            events.append(self.transaction)
            if not fd.data_header:
                return events
        elif fd.app_metadata is not None and not fd.data_header:
            try:
                _t, obj = barrage.unwrap(fd.app_metadata)
            except ProtocolError as exc:
                raise UploadError(f"bad DoPut options: {exc}") from None
            if isinstance(obj, barrage.SubscriptionRequest) and obj.options is not None:
                self.use_deephaven_nulls = bool(obj.options.use_deephaven_nulls)
                self.columns_as_list = bool(obj.options.columns_as_list)
                events.append(Options(self.use_deephaven_nulls, self.columns_as_list))
            return events
        if not fd.data_header:
            return events
        try:
            info = read_message_header(fd.data_header)
        except ProtocolError as exc:
            raise UploadError(f"bad Arrow message header: {exc}") from None
        if info.header_type == HEADER_SCHEMA:
            if self.schema is not None:
                raise UploadError("DoPut: a second schema message")
            try:
                schema = read_schema_message(fd.data_header)
                if self.columns_as_list:
                    schema = unwrap_list_schema(schema)
            except UploadError:
                raise
            except ProtocolError as exc:
                raise UploadError(str(exc)) from None
            check_put_types(schema)
            try:
                check_wire_schema(schema, {BARRAGE_SCHEMA: schema})  # with the types an upload keeps
            except ProtocolError as exc:
                raise UploadError(f"DoPut: {exc}") from None
            self.keys = check_put_keys(schema)
            self.schema = schema
            events.append(UploadSchema(schema, self.keys))
            return events
        if info.header_type != HEADER_RECORD_BATCH:
            raise UploadError(f"DoPut: unsupported Arrow message type {info.header_type}")
        if self.schema is None:
            raise UploadError("Schema must be processed before record-batch messages")
        self.batches += 1
        events.append(Batch(info, fd.data_body, self.schema, self.use_deephaven_nulls, self.columns_as_list))
        return events

    def close(self) -> End:
        """The client half-closed. Raises UploadError when the upload named no destination or sent
        no schema."""
        self.closed = True
        if self.path is None:
            raise UploadError("Result flight descriptor never provided")
        if self.schema is None:
            raise UploadError("DoPut: schema never provided")
        return End(list(self.path), self.schema, self.keys, self.batches)
