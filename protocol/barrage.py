"""Barrage flatbuffer messages as plain Python objects (docs/messages.md#barrage-flatbuffer-messages).

Every message has `to_bytes()` and `from_bytes(data)`. Writing uses the generated builders in
`tickwire.protocol.fb.barrage` in Deephaven's call order, so a decoded Deephaven message re-encodes
to the same bytes; scalars equal to their default are not written (as Java's FlatBufferBuilder
does with force_defaults=false). Reading goes through the bounds-checked table reader of
`tickwire.protocol.fbread`: any offset, vtable or vector that points outside the buffer raises
ProtocolError naming the field, never IndexError, struct.error or silently wrong values.

Decoded values:
- row sets (viewports, added/removed rows, ...): numpy (n, 2) int64 arrays of closed ranges;
- column sets (`columns`, `effective_column_set`): 1-D int64 arrays of column indices;
- `shift_data`: a tuple (starts, ends, dests) of 1-D int64 arrays;
- `mod_column_nodes`: a list with one range array per column.
`None` means the field is absent, which Barrage distinguishes from present-but-empty (absent
`columns` = all columns, an empty array = no columns; absent `viewport` = full subscription).
"""
from __future__ import annotations

import enum
from dataclasses import Field, dataclass, fields
from types import ModuleType
from typing import Any, Callable, ClassVar, Optional, TypeVar, Union

import numpy as np

import flatbuffers
from tickwire.errors import ProtocolError
from tickwire.protocol import rowset as rs
from tickwire.protocol.fb.barrage import BarragePublicationOptions as FbPubOpts
from tickwire.protocol.fb.barrage import BarragePublicationRequest as FbPubReq
from tickwire.protocol.fb.barrage import BarrageSnapshotOptions as FbSnapOpts
from tickwire.protocol.fb.barrage import BarrageSnapshotRequest as FbSnapReq
from tickwire.protocol.fb.barrage import BarrageSubscriptionOptions as FbSubOpts
from tickwire.protocol.fb.barrage import BarrageSubscriptionRequest as FbSubReq
from tickwire.protocol.fbread import FbTable as _Table
from tickwire.protocol.fbread import root as _root
from tickwire.protocol.fbwrite import FbWriter
from tickwire.protocol.flight import BytesLike

__all__ = [
    "MAGIC",
    "BarrageMessageType",
    "BarrageMessageWrapper",
    "SubscriptionOptions",
    "SubscriptionRequest",
    "SnapshotOptions",
    "SnapshotRequest",
    "PublicationOptions",
    "PublicationRequest",
    "UpdateMetadata",
    "wrap",
    "unwrap",
]

MAGIC = 0x6E687064  # the bytes 64 70 68 6e, ASCII "dphn", as a little-endian uint32

# Values of the schema's BarrageMessageType enum (0 None, 1-3 formerly session messages, 4-8 below).
_SCHEMA_MSG_TYPES = range(9)


class BarrageMessageType(enum.IntEnum):
    NONE = 0
    SERIALIZATION_OPTIONS = 4
    SUBSCRIPTION_REQUEST = 5
    UPDATE_METADATA = 6
    SNAPSHOT_REQUEST = 7
    PUBLICATION_REQUEST = 8


# ----------------------------------------------------------------------------------------------
# field codecs
# ----------------------------------------------------------------------------------------------

_T = TypeVar("_T")


def _decode(fn: Callable[[bytes], _T], raw: Optional[bytes], what: str) -> Optional[_T]:
    """Applies a row-set codec to a present field; codec errors name the field."""
    if raw is None:
        return None
    try:
        return fn(raw)
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None


def _rows(raw: Optional[bytes], what: str) -> Optional[np.ndarray]:
    return _decode(rs.decode_rowset, raw, what)


def _cols(raw: Optional[bytes], what: str) -> Optional[np.ndarray]:
    return _decode(rs.decode_bitset, raw, what)


def _enc_rows(r: Optional[np.ndarray]) -> Optional[bytes]:
    return None if r is None else rs.encode_rowset(r)


def _enc_cols(c: Optional[np.ndarray]) -> Optional[bytes]:
    return None if c is None else rs.encode_bitset(c)


def _enc_shifts(s: Optional[Shifts]) -> Optional[bytes]:
    return None if s is None else rs.encode_shifts(*s)


def _vec(builder: flatbuffers.Builder, data: Optional[bytes]) -> int:
    """A byte vector, or 0 (absent) for None. A created vector's offset is never 0."""
    return 0 if data is None else builder.CreateByteVector(bytes(data))


def _finish(builder: flatbuffers.Builder, root: int) -> bytes:
    builder.Finish(root)
    return bytes(builder.Output())


def _int(value: int, bits: int, name: str) -> int:
    v = int(value)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not lo <= v <= hi:
        raise ValueError(f"{name}={v} does not fit in int{bits}")
    return v


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if a is None or b is None:
            return False
        x, y = np.asarray(a), np.asarray(b)
        return x.shape == y.shape and bool(np.array_equal(x, y))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    return bool(a == b)


class _Message:
    """Field-wise equality that understands numpy arrays (and None vs empty)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every subclass is a dataclass

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_eq(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))

    # mutable, compared by value; typeshed's object.__hash__ has no None
    __hash__ = None  # type: ignore[assignment]


# ----------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class SubscriptionOptions(_Message):
    """BarrageSubscriptionOptions (docs/messages.md#subscription-options)."""

    column_conversion_mode: int = 1  # deprecated and ignored; kept for byte-exact round trips
    use_deephaven_nulls: bool = False
    min_update_interval_ms: int = 0
    batch_size: int = 0
    max_message_size: int = 0
    columns_as_list: bool = False
    preview_list_length_limit: int = 0

    def build_into(self, b: flatbuffers.Builder) -> int:
        # flatc's generated create-order (widest fields first, then by descending slot); this is how
        # both the Java and the C++ client build it
        FbSubOpts.Start(b)
        FbSubOpts.AddPreviewListLengthLimit(b, _int(self.preview_list_length_limit, 64, "preview_list_length_limit"))
        FbSubOpts.AddMaxMessageSize(b, _int(self.max_message_size, 32, "max_message_size"))
        FbSubOpts.AddBatchSize(b, _int(self.batch_size, 32, "batch_size"))
        FbSubOpts.AddMinUpdateIntervalMs(b, _int(self.min_update_interval_ms, 32, "min_update_interval_ms"))
        FbSubOpts.AddColumnsAsList(b, bool(self.columns_as_list))
        FbSubOpts.AddUseDeephavenNulls(b, bool(self.use_deephaven_nulls))
        FbSubOpts.AddColumnConversionMode(b, _int(self.column_conversion_mode, 8, "column_conversion_mode"))
        end: int = FbSubOpts.End(b)
        return end

    @classmethod
    def from_table(cls, t: _Table) -> "SubscriptionOptions":
        return cls(
            column_conversion_mode=t.scalar(0, "<b", 1, "column_conversion_mode"),
            use_deephaven_nulls=bool(t.scalar(1, "<B", 0, "use_deephaven_nulls")),
            min_update_interval_ms=t.scalar(2, "<i", 0, "min_update_interval_ms"),
            batch_size=t.scalar(3, "<i", 0, "batch_size"),
            max_message_size=t.scalar(4, "<i", 0, "max_message_size"),
            columns_as_list=bool(t.scalar(5, "<B", 0, "columns_as_list")),
            preview_list_length_limit=t.scalar(6, "<q", 0, "preview_list_length_limit"),
        )


@dataclass(eq=False)
class SnapshotOptions(_Message):
    """BarrageSnapshotOptions (docs/messages.md#snapshot-options)."""

    column_conversion_mode: int = 1
    use_deephaven_nulls: bool = False
    batch_size: int = 0
    max_message_size: int = 0
    preview_list_length_limit: int = 0

    def build_into(self, b: flatbuffers.Builder) -> int:
        FbSnapOpts.Start(b)
        FbSnapOpts.AddPreviewListLengthLimit(b, _int(self.preview_list_length_limit, 64, "preview_list_length_limit"))
        FbSnapOpts.AddMaxMessageSize(b, _int(self.max_message_size, 32, "max_message_size"))
        FbSnapOpts.AddBatchSize(b, _int(self.batch_size, 32, "batch_size"))
        FbSnapOpts.AddUseDeephavenNulls(b, bool(self.use_deephaven_nulls))
        FbSnapOpts.AddColumnConversionMode(b, _int(self.column_conversion_mode, 8, "column_conversion_mode"))
        end: int = FbSnapOpts.End(b)
        return end

    @classmethod
    def from_table(cls, t: _Table) -> "SnapshotOptions":
        return cls(
            column_conversion_mode=t.scalar(0, "<b", 1, "column_conversion_mode"),
            use_deephaven_nulls=bool(t.scalar(1, "<B", 0, "use_deephaven_nulls")),
            batch_size=t.scalar(2, "<i", 0, "batch_size"),
            max_message_size=t.scalar(3, "<i", 0, "max_message_size"),
            preview_list_length_limit=t.scalar(4, "<q", 0, "preview_list_length_limit"),
        )


@dataclass(eq=False)
class PublicationOptions(_Message):
    """BarragePublicationOptions (docs/messages.md#publication-requests)."""

    use_deephaven_nulls: bool = False

    def build_into(self, b: flatbuffers.Builder) -> int:
        FbPubOpts.Start(b)
        FbPubOpts.AddUseDeephavenNulls(b, bool(self.use_deephaven_nulls))
        end: int = FbPubOpts.End(b)
        return end

    @classmethod
    def from_table(cls, t: _Table) -> "PublicationOptions":
        return cls(use_deephaven_nulls=bool(t.scalar(0, "<B", 0, "use_deephaven_nulls")))


# ----------------------------------------------------------------------------------------------
# requests
# ----------------------------------------------------------------------------------------------

def _request_to_bytes(req: Union[SubscriptionRequest, SnapshotRequest], fb: ModuleType,
                      add_options: Callable[[flatbuffers.Builder, int], None], token: Optional[bytes] = None) -> bytes:
    """Subscription and snapshot requests share slots 0-4 (ticket, columns, viewport, options,
    reverse_viewport); both are built in the clients' order: vectors columns, viewport, then the
    options table, then the ticket; fields added in that same order."""
    b = flatbuffers.Builder(64)
    cols = _vec(b, _enc_cols(req.columns))
    vp = _vec(b, _enc_rows(req.viewport))
    opts = req.options.build_into(b) if req.options is not None else 0
    ticket = _vec(b, req.ticket)
    tok = _vec(b, token)
    fb.Start(b)
    if cols:
        fb.AddColumns(b, cols)
    if vp:
        fb.AddViewport(b, vp)
    if opts:
        add_options(b, opts)
    if ticket:
        fb.AddTicket(b, ticket)
    fb.AddReverseViewport(b, bool(req.reverse_viewport))
    if tok:
        fb.AddSubscriptionToken(b, tok)
    return _finish(b, fb.End(b))


def _read_request(data: BytesLike, what: str, options_cls: Union[type[SubscriptionOptions], type[SnapshotOptions]],
                  options_name: str) -> tuple[_Table, dict[str, Any]]:
    """The fields subscription and snapshot requests share, read from slots 0-4."""
    t = _root(data, what)
    opts = t.table(3, options_name)
    return t, {
        "ticket": t.bytes_field(0, "ticket"),
        "columns": _cols(t.bytes_field(1, "columns"), f"{what}.columns"),
        "viewport": _rows(t.bytes_field(2, "viewport"), f"{what}.viewport"),
        "options": None if opts is None else options_cls.from_table(opts),
        "reverse_viewport": bool(t.scalar(4, "<B", 0, "reverse_viewport")),
    }


@dataclass(eq=False)
class SubscriptionRequest(_Message):
    """BarrageSubscriptionRequest (docs/messages.md#subscription-requests). `options` is the
    schema's `subscription_options`."""

    ticket: Optional[bytes] = None
    columns: Optional[np.ndarray] = None  # column indices; None = all columns
    viewport: Optional[np.ndarray] = None  # position ranges; None = full subscription
    options: Optional[SubscriptionOptions] = None
    reverse_viewport: bool = False
    subscription_token: Optional[bytes] = None

    MSG_TYPE: ClassVar[BarrageMessageType] = BarrageMessageType.SUBSCRIPTION_REQUEST

    def to_bytes(self) -> bytes:
        return _request_to_bytes(self, FbSubReq, FbSubReq.AddSubscriptionOptions, self.subscription_token)

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "SubscriptionRequest":
        t, fields_ = _read_request(data, "BarrageSubscriptionRequest", SubscriptionOptions, "subscription_options")
        return cls(**fields_, subscription_token=t.bytes_field(5, "subscription_token"))


@dataclass(eq=False)
class SnapshotRequest(_Message):
    """BarrageSnapshotRequest (docs/messages.md#snapshot-requests). `options` is the schema's
    `snapshot_options`."""

    ticket: Optional[bytes] = None
    columns: Optional[np.ndarray] = None
    viewport: Optional[np.ndarray] = None
    options: Optional[SnapshotOptions] = None
    reverse_viewport: bool = False

    MSG_TYPE: ClassVar[BarrageMessageType] = BarrageMessageType.SNAPSHOT_REQUEST

    def to_bytes(self) -> bytes:
        return _request_to_bytes(self, FbSnapReq, FbSnapReq.AddSnapshotOptions)

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "SnapshotRequest":
        _t, fields_ = _read_request(data, "BarrageSnapshotRequest", SnapshotOptions, "snapshot_options")
        return cls(**fields_)


@dataclass(eq=False)
class PublicationRequest(_Message):
    """BarragePublicationRequest (docs/messages.md#publication-requests). `options` is the
    schema's `publish_options`."""

    ticket: Optional[bytes] = None
    options: Optional[PublicationOptions] = None

    MSG_TYPE: ClassVar[BarrageMessageType] = BarrageMessageType.PUBLICATION_REQUEST

    def to_bytes(self) -> bytes:
        b = flatbuffers.Builder(32)
        ticket = _vec(b, self.ticket)
        opts = self.options.build_into(b) if self.options is not None else 0
        FbPubReq.Start(b)
        if ticket:
            FbPubReq.AddTicket(b, ticket)
        if opts:
            FbPubReq.AddPublishOptions(b, opts)
        return _finish(b, FbPubReq.End(b))

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "PublicationRequest":
        t = _root(data, "BarragePublicationRequest")
        opts = t.table(1, "publish_options")
        return cls(ticket=t.bytes_field(0, "ticket"),
                   options=None if opts is None else PublicationOptions.from_table(opts))


# ----------------------------------------------------------------------------------------------
# update metadata
# ----------------------------------------------------------------------------------------------

Shifts = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(eq=False)
class UpdateMetadata(_Message):
    """BarrageUpdateMetadata (docs/messages.md#update-metadata).

    `mod_column_nodes[c]` is the `modified_rows` row set of column c; an entry is None only when a
    BarrageModColumnMetadata table lacks the field (Deephaven always writes it).
    """

    first_seq: int = 0
    last_seq: int = 0
    is_snapshot: bool = False
    effective_viewport: Optional[np.ndarray] = None
    effective_reverse_viewport: bool = False
    effective_column_set: Optional[np.ndarray] = None
    added_rows: Optional[np.ndarray] = None
    removed_rows: Optional[np.ndarray] = None
    shift_data: Optional[Shifts] = None
    added_rows_included: Optional[np.ndarray] = None
    mod_column_nodes: Optional[list[Optional[np.ndarray]]] = None
    table_size: int = 0

    MSG_TYPE: ClassVar[BarrageMessageType] = BarrageMessageType.UPDATE_METADATA

    def to_bytes(self) -> bytes:
        return self.encode_with()

    def encode_with(self, **raw: Any) -> bytes:
        """Encodes, taking already-encoded bytes for any field named in `raw`.

        `raw` maps a field name to its wire bytes (`added_rows=b"..."`, `shift_data=b"..."`, ...) or,
        for `mod_column_nodes`, to a list of per-column `modified_rows` bytes; a publisher uses it to
        encode a row set once and share the bytes between subscribers. A raw value of None means absent.
        """
        # the layout of flatbuffers.Builder given the calls of docs/messages.md#builder-order,
        # through the faster writer of the same bytes (tickwire.protocol.fbwrite)
        w = FbWriter()

        def vec(name: str, encode: Callable[[Any], Optional[bytes]]) -> int:
            data = raw[name] if name in raw else encode(getattr(self, name))
            return w.bytes_vector(data)

        # step 1 (docs/messages.md#builder-order): the vectors, in Deephaven's order
        ev = vec("effective_viewport", _enc_rows)
        ecs = vec("effective_column_set", _enc_cols)
        added = vec("added_rows", _enc_rows)
        removed = vec("removed_rows", _enc_rows)
        shifts = vec("shift_data", _enc_shifts)
        included = vec("added_rows_included", _enc_rows)
        if "mod_column_nodes" in raw:
            node_bytes = raw["mod_column_nodes"]
        elif self.mod_column_nodes is not None:
            node_bytes = [_enc_rows(m) for m in self.mod_column_nodes]
        else:
            node_bytes = None
        mods = 0
        if node_bytes is not None:
            nodes: list[int] = []
            for data in node_bytes:
                v = w.bytes_vector(data)
                w.start(1)  # BarrageModColumnMetadata
                if v:
                    w.offset(0, v)  # modified_rows
                nodes.append(w.end())
            mods = w.offsets_vector(nodes)
        # step 2: the table (BarrageUpdateMetadata, 12 fields), fields in Deephaven's order; a
        # scalar equal to its default is left out, as the builder's Add functions do
        first, last, size = (_int(self.first_seq, 64, "first_seq"), _int(self.last_seq, 64, "last_seq"),
                             _int(self.table_size, 64, "table_size"))
        w.start(12)
        if self.is_snapshot:
            w.scalar(2, "<B", 1, 1)
        if first:
            w.scalar(0, "<q", 8, first)
        if last:
            w.scalar(1, "<q", 8, last)
        for slot, off in ((3, ev), (5, ecs), (6, added), (7, removed), (8, shifts), (9, included), (10, mods)):
            if off:
                w.offset(slot, off)
        if self.effective_reverse_viewport:
            w.scalar(4, "<B", 1, 1)
        if size:
            w.scalar(11, "<q", 8, size)
        return w.finish(w.end())

    @classmethod
    def from_bytes(cls, data: BytesLike) -> "UpdateMetadata":
        w = "BarrageUpdateMetadata"
        t = _root(data, w)
        # the same row set is often sent several times in one message (added_rows and
        # added_rows_included; every modified column's rows): decoded once, shared read-only
        seen: dict[bytes, np.ndarray] = {}

        def rows(raw: Optional[bytes], what: str) -> Optional[np.ndarray]:
            if raw is None:
                return None
            got = seen.get(raw)
            if got is None:
                got = _rows(raw, what)
                assert got is not None
                got.flags.writeable = False
                seen[raw] = got
            return got

        mod_tables = t.tables(10, "mod_column_nodes")
        mods: Optional[list[Optional[np.ndarray]]] = None
        if mod_tables is not None:
            mods = [rows(mt.bytes_field(0, "modified_rows"), f"{w}.mod_column_nodes[{i}].modified_rows")
                    for i, mt in enumerate(mod_tables)]
        return cls(
            first_seq=t.scalar(0, "<q", 0, "first_seq"),
            last_seq=t.scalar(1, "<q", 0, "last_seq"),
            is_snapshot=bool(t.scalar(2, "<B", 0, "is_snapshot")),
            effective_viewport=_rows(t.bytes_field(3, "effective_viewport"), f"{w}.effective_viewport"),
            effective_reverse_viewport=bool(t.scalar(4, "<B", 0, "effective_reverse_viewport")),
            effective_column_set=_cols(t.bytes_field(5, "effective_column_set"), f"{w}.effective_column_set"),
            added_rows=rows(t.bytes_field(6, "added_rows"), f"{w}.added_rows"),
            removed_rows=rows(t.bytes_field(7, "removed_rows"), f"{w}.removed_rows"),
            shift_data=_decode(rs.decode_shifts, t.bytes_field(8, "shift_data"), f"{w}.shift_data"),
            added_rows_included=rows(t.bytes_field(9, "added_rows_included"), f"{w}.added_rows_included"),
            mod_column_nodes=mods,
            table_size=t.scalar(11, "<q", 0, "table_size"),
        )

    # conveniences for readers
    def num_adds(self) -> int:
        """Rows whose data is in the add batches: |added_rows_included|, or |added_rows| if absent."""
        src = self.added_rows_included if self.added_rows_included is not None else self.added_rows
        return 0 if src is None else rs.rowset_size(src)

    def mod_counts(self) -> list[int]:
        """Rows of modified data per column (0 for an absent `modified_rows`); [] without nodes."""
        if self.mod_column_nodes is None:
            return []
        return [0 if m is None else rs.rowset_size(m) for m in self.mod_column_nodes]


# ----------------------------------------------------------------------------------------------
# the wrapper
# ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class BarrageMessageWrapper(_Message):
    """BarrageMessageWrapper (docs/messages.md#the-message-wrapper): the `app_metadata` of every
    Barrage FlightData."""

    msg_type: int = 0
    payload: Optional[bytes] = None  # the schema's msg_payload: a separately finished flatbuffer
    magic: int = MAGIC

    def to_bytes(self) -> bytes:
        mt = int(self.msg_type)
        if not -128 <= mt <= 255:
            raise ValueError(f"msg_type {mt} does not fit in a byte")
        mt = mt - 256 if mt > 127 else mt  # the schema's type is a signed byte
        magic = int(self.magic)
        if not 0 <= magic <= 0xFFFFFFFF:
            raise ValueError(f"magic {magic} does not fit in a uint32")
        # flatbuffers.Builder's layout for these calls, through the faster writer of the same bytes
        w = FbWriter()
        payload = w.bytes_vector(self.payload)
        w.start(3)  # BarrageMessageWrapper: magic (uint32), msg_type (int8), msg_payload

        def head() -> None:
            if magic:
                w.scalar(0, "<I", 4, magic)
            if mt:
                w.scalar(1, "<b", 1, mt)

        if mt == BarrageMessageType.UPDATE_METADATA:
            head()  # the server's order (BarrageMessageWriterImpl)
            if payload:
                w.offset(2, payload)
        else:
            if payload:  # the order of the Java and C++ clients' requests: payload first
                w.offset(2, payload)
            head()
        return w.finish(w.end())

    @classmethod
    def from_bytes(cls, data: BytesLike, *, check_magic: bool = True) -> "BarrageMessageWrapper":
        """Parses a wrapper; raises ProtocolError for a wrong magic (unless `check_magic` is false),
        a message type the schema does not define, or a malformed buffer."""
        t = _root(data, "BarrageMessageWrapper")
        magic = t.scalar(0, "<I", 0, "magic")
        if check_magic and magic != MAGIC:
            raise ProtocolError(f"wrong Barrage magic 0x{magic:08x}; expected 0x{MAGIC:08x} ('dphn')")
        msg_type = t.scalar(1, "<b", 0, "msg_type")
        if msg_type not in _SCHEMA_MSG_TYPES:
            if msg_type < 0:
                why = f"byte 0x{msg_type & 0xFF:02x}, a value reserved for custom use"
            else:
                why = "not defined by Barrage 1.0.0"
            raise ProtocolError(f"unhandled BarrageMessageType: {msg_type} ({why})")
        return cls(msg_type=msg_type, payload=t.bytes_field(2, "msg_payload"), magic=magic)


#: the message classes a wrapper's payload may hold
BarrageMessage = Union[SubscriptionRequest, SnapshotRequest, PublicationRequest, UpdateMetadata]

_BY_TYPE: dict[BarrageMessageType, type[BarrageMessage]] = {
    BarrageMessageType.SUBSCRIPTION_REQUEST: SubscriptionRequest,
    BarrageMessageType.UPDATE_METADATA: UpdateMetadata,
    BarrageMessageType.SNAPSHOT_REQUEST: SnapshotRequest,
    BarrageMessageType.PUBLICATION_REQUEST: PublicationRequest,
    # DoPut options: a BarrageSubscriptionRequest that carries only options (docs/flows.md#doput)
    BarrageMessageType.SERIALIZATION_OPTIONS: SubscriptionRequest,
}


def wrap(message: BarrageMessage, msg_type: Optional[int] = None) -> bytes:
    """Wraps a request or metadata object in a BarrageMessageWrapper and returns its bytes.

    The message type comes from the object's class unless `msg_type` is given (e.g.
    SERIALIZATION_OPTIONS for a SubscriptionRequest sent as DoPut options)."""
    mt = int(msg_type if msg_type is not None else message.MSG_TYPE)
    return BarrageMessageWrapper(msg_type=mt, payload=message.to_bytes()).to_bytes()


def unwrap(data: BytesLike) -> tuple[BarrageMessageType, BarrageMessage]:
    """Parses wrapper bytes and returns (msg_type, typed message object).

    Raises ProtocolError for a wrong magic, a message type this module does not handle (None,
    the unused session types 1-3, custom types), a missing payload, or a malformed payload.
    """
    w = BarrageMessageWrapper.from_bytes(data)
    try:
        kind = BarrageMessageType(w.msg_type)
    except ValueError:
        raise ProtocolError(f"unhandled BarrageMessageType: {w.msg_type} (an unused session message type)") from None
    cls = _BY_TYPE.get(kind)
    if cls is None:
        raise ProtocolError(f"unhandled BarrageMessageType: {w.msg_type} ({kind.name})")
    if w.payload is None:
        raise ProtocolError(f"Barrage {kind.name} message has no payload")
    return kind, cls.from_bytes(w.payload)
