"""Barrage flatbuffer messages as plain Python objects (BARRAGE-WIRE.md §2).

Every message has `to_bytes()` and `from_bytes(data)`. Writing uses the generated builders in
`tickwire.protocol.fb.barrage` in Deephaven's call order, so a decoded Deephaven message re-encodes
to the same bytes; scalars equal to their default are not written (as Java's FlatBufferBuilder
does). Reading goes through a bounds-checked table reader: any offset, vtable or vector that
points outside the buffer raises ProtocolError naming the field, never IndexError or garbage.

Row sets are numpy (n, 2) int64 range arrays, column sets 1-D int64 index arrays, shift data a
tuple (starts, ends, dests). `None` means the field is absent, which Barrage distinguishes from
present-but-empty (absent columns = all columns; an empty array = no columns).
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field, fields
from typing import Any, Optional

import flatbuffers
import numpy as np

from tickwire.protocol import rowset as rs
from tickwire.protocol.errors import ProtocolError
from tickwire.protocol.fbread import FbTable as _Table, root as _root
from tickwire.protocol.fb.barrage import (
    BarrageMessageWrapper as FbWrapper,
    BarrageModColumnMetadata as FbModCol,
    BarragePublicationOptions as FbPubOpts,
    BarragePublicationRequest as FbPubReq,
    BarrageSnapshotOptions as FbSnapOpts,
    BarrageSnapshotRequest as FbSnapReq,
    BarrageSubscriptionOptions as FbSubOpts,
    BarrageSubscriptionRequest as FbSubReq,
    BarrageUpdateMetadata as FbUpdate,
)

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

MAGIC = 0x6E687064  # b"dphn" little-endian


class BarrageMessageType(enum.IntEnum):
    NONE = 0
    SERIALIZATION_OPTIONS = 4
    SUBSCRIPTION_REQUEST = 5
    UPDATE_METADATA = 6
    SNAPSHOT_REQUEST = 7
    PUBLICATION_REQUEST = 8


def _decode(kind: str, fn, raw: Optional[bytes], what: str):
    if raw is None:
        return None
    try:
        return fn(raw)
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None


def _rows(raw, what):
    return _decode("rowset", rs.decode_rowset, raw, what)


def _cols(raw, what):
    return _decode("bitset", rs.decode_bitset, raw, what)


# ----------------------------------------------------------------------------------------------
# writing helpers
# ----------------------------------------------------------------------------------------------

def _vec(builder: flatbuffers.Builder, data: Optional[bytes]) -> int:
    return 0 if data is None else builder.CreateByteVector(bytes(data))


def _enc_rows(r) -> Optional[bytes]:
    return None if r is None else rs.encode_rowset(r)


def _enc_cols(c) -> Optional[bytes]:
    return None if c is None else rs.encode_bitset(c)


def _finish(builder: flatbuffers.Builder, root: int) -> bytes:
    builder.Finish(root)
    return bytes(builder.Output())


def _eq(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and np.array_equal(np.asarray(a), np.asarray(b)) \
            and np.asarray(a).shape == np.asarray(b).shape
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    return a == b


class _Message:
    """Field-wise equality that understands numpy arrays."""

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(_eq(getattr(self, f.name), getattr(other, f.name)) for f in fields(self))


# ----------------------------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class SubscriptionOptions(_Message):
    column_conversion_mode: int = 1  # deprecated and ignored; kept for byte-exact round trips
    use_deephaven_nulls: bool = False
    min_update_interval_ms: int = 0
    batch_size: int = 0
    max_message_size: int = 0
    columns_as_list: bool = False
    preview_list_length_limit: int = 0

    def _build(self, b: flatbuffers.Builder) -> int:
        # flatc's create order (largest fields first, then by descending slot), as the clients build it
        FbSubOpts.Start(b)
        FbSubOpts.AddPreviewListLengthLimit(b, self.preview_list_length_limit)
        FbSubOpts.AddMaxMessageSize(b, self.max_message_size)
        FbSubOpts.AddBatchSize(b, self.batch_size)
        FbSubOpts.AddMinUpdateIntervalMs(b, self.min_update_interval_ms)
        FbSubOpts.AddColumnsAsList(b, self.columns_as_list)
        FbSubOpts.AddUseDeephavenNulls(b, self.use_deephaven_nulls)
        FbSubOpts.AddColumnConversionMode(b, self.column_conversion_mode)
        return FbSubOpts.End(b)

    @classmethod
    def _read(cls, t: _Table) -> "SubscriptionOptions":
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
    column_conversion_mode: int = 1
    use_deephaven_nulls: bool = False
    batch_size: int = 0
    max_message_size: int = 0
    preview_list_length_limit: int = 0

    def _build(self, b: flatbuffers.Builder) -> int:
        FbSnapOpts.Start(b)
        FbSnapOpts.AddPreviewListLengthLimit(b, self.preview_list_length_limit)
        FbSnapOpts.AddMaxMessageSize(b, self.max_message_size)
        FbSnapOpts.AddBatchSize(b, self.batch_size)
        FbSnapOpts.AddUseDeephavenNulls(b, self.use_deephaven_nulls)
        FbSnapOpts.AddColumnConversionMode(b, self.column_conversion_mode)
        return FbSnapOpts.End(b)

    @classmethod
    def _read(cls, t: _Table) -> "SnapshotOptions":
        return cls(
            column_conversion_mode=t.scalar(0, "<b", 1, "column_conversion_mode"),
            use_deephaven_nulls=bool(t.scalar(1, "<B", 0, "use_deephaven_nulls")),
            batch_size=t.scalar(2, "<i", 0, "batch_size"),
            max_message_size=t.scalar(3, "<i", 0, "max_message_size"),
            preview_list_length_limit=t.scalar(4, "<q", 0, "preview_list_length_limit"),
        )


@dataclass(eq=False)
class PublicationOptions(_Message):
    use_deephaven_nulls: bool = False

    def _build(self, b: flatbuffers.Builder) -> int:
        FbPubOpts.Start(b)
        FbPubOpts.AddUseDeephavenNulls(b, self.use_deephaven_nulls)
        return FbPubOpts.End(b)

    @classmethod
    def _read(cls, t: _Table) -> "PublicationOptions":
        return cls(use_deephaven_nulls=bool(t.scalar(0, "<B", 0, "use_deephaven_nulls")))


# ----------------------------------------------------------------------------------------------
# requests
# ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class SubscriptionRequest(_Message):
    ticket: Optional[bytes] = None
    columns: Optional[np.ndarray] = None  # column indices; None = all
    viewport: Optional[np.ndarray] = None  # position ranges; None = full subscription
    options: Optional[SubscriptionOptions] = None
    reverse_viewport: bool = False
    subscription_token: Optional[bytes] = None

    MSG_TYPE = BarrageMessageType.SUBSCRIPTION_REQUEST

    def to_bytes(self) -> bytes:
        b = flatbuffers.Builder(64)
        # Deephaven's creation order: columns, viewport, options, ticket
        cols = _vec(b, _enc_cols(self.columns))
        vp = _vec(b, _enc_rows(self.viewport))
        opts = self.options._build(b) if self.options is not None else 0
        ticket = _vec(b, self.ticket)
        token = _vec(b, self.subscription_token)
        FbSubReq.Start(b)
        if cols:
            FbSubReq.AddColumns(b, cols)
        if vp:
            FbSubReq.AddViewport(b, vp)
        if opts:
            FbSubReq.AddSubscriptionOptions(b, opts)
        if ticket:
            FbSubReq.AddTicket(b, ticket)
        FbSubReq.AddReverseViewport(b, self.reverse_viewport)
        if token:
            FbSubReq.AddSubscriptionToken(b, token)
        return _finish(b, FbSubReq.End(b))

    @classmethod
    def from_bytes(cls, data) -> "SubscriptionRequest":
        t = _root(data, "BarrageSubscriptionRequest")
        opts = t.table(3, "subscription_options")
        return cls(
            ticket=t.bytes_field(0, "ticket"),
            columns=_cols(t.bytes_field(1, "columns"), "BarrageSubscriptionRequest.columns"),
            viewport=_rows(t.bytes_field(2, "viewport"), "BarrageSubscriptionRequest.viewport"),
            options=None if opts is None else SubscriptionOptions._read(opts),
            reverse_viewport=bool(t.scalar(4, "<B", 0, "reverse_viewport")),
            subscription_token=t.bytes_field(5, "subscription_token"),
        )


@dataclass(eq=False)
class SnapshotRequest(_Message):
    ticket: Optional[bytes] = None
    columns: Optional[np.ndarray] = None
    viewport: Optional[np.ndarray] = None
    options: Optional[SnapshotOptions] = None
    reverse_viewport: bool = False

    MSG_TYPE = BarrageMessageType.SNAPSHOT_REQUEST

    def to_bytes(self) -> bytes:
        b = flatbuffers.Builder(64)
        cols = _vec(b, _enc_cols(self.columns))
        vp = _vec(b, _enc_rows(self.viewport))
        opts = self.options._build(b) if self.options is not None else 0
        ticket = _vec(b, self.ticket)
        FbSnapReq.Start(b)
        if cols:
            FbSnapReq.AddColumns(b, cols)
        if vp:
            FbSnapReq.AddViewport(b, vp)
        if opts:
            FbSnapReq.AddSnapshotOptions(b, opts)
        if ticket:
            FbSnapReq.AddTicket(b, ticket)
        FbSnapReq.AddReverseViewport(b, self.reverse_viewport)
        return _finish(b, FbSnapReq.End(b))

    @classmethod
    def from_bytes(cls, data) -> "SnapshotRequest":
        t = _root(data, "BarrageSnapshotRequest")
        opts = t.table(3, "snapshot_options")
        return cls(
            ticket=t.bytes_field(0, "ticket"),
            columns=_cols(t.bytes_field(1, "columns"), "BarrageSnapshotRequest.columns"),
            viewport=_rows(t.bytes_field(2, "viewport"), "BarrageSnapshotRequest.viewport"),
            options=None if opts is None else SnapshotOptions._read(opts),
            reverse_viewport=bool(t.scalar(4, "<B", 0, "reverse_viewport")),
        )


@dataclass(eq=False)
class PublicationRequest(_Message):
    ticket: Optional[bytes] = None
    options: Optional[PublicationOptions] = None

    MSG_TYPE = BarrageMessageType.PUBLICATION_REQUEST

    def to_bytes(self) -> bytes:
        b = flatbuffers.Builder(32)
        ticket = _vec(b, self.ticket)
        opts = self.options._build(b) if self.options is not None else 0
        FbPubReq.Start(b)
        if ticket:
            FbPubReq.AddTicket(b, ticket)
        if opts:
            FbPubReq.AddPublishOptions(b, opts)
        return _finish(b, FbPubReq.End(b))

    @classmethod
    def from_bytes(cls, data) -> "PublicationRequest":
        t = _root(data, "BarragePublicationRequest")
        opts = t.table(1, "publish_options")
        return cls(ticket=t.bytes_field(0, "ticket"),
                   options=None if opts is None else PublicationOptions._read(opts))


# ----------------------------------------------------------------------------------------------
# update metadata
# ----------------------------------------------------------------------------------------------

Shifts = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(eq=False)
class UpdateMetadata(_Message):
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
    mod_column_nodes: Optional[list[np.ndarray]] = None
    table_size: int = 0

    MSG_TYPE = BarrageMessageType.UPDATE_METADATA

    def to_bytes(self) -> bytes:
        return self.encode_with()

    def encode_with(self, **raw: bytes) -> bytes:
        """Encodes; `raw` may supply already-encoded row-set bytes by field name (e.g. added_rows=b'...')
        so a publisher can reuse the bytes it shares between subscribers."""
        b = flatbuffers.Builder(256)

        def rows(name):
            if name in raw:
                return _vec(b, raw[name])
            return _vec(b, _enc_rows(getattr(self, name)))

        ev = rows("effective_viewport")
        ecs = _vec(b, raw.get("effective_column_set", _enc_cols(self.effective_column_set)))
        added = rows("added_rows")
        removed = rows("removed_rows")
        if "shift_data" in raw:
            shifts = _vec(b, raw["shift_data"])
        else:
            shifts = _vec(b, None if self.shift_data is None else rs.encode_shifts(*self.shift_data))
        included = rows("added_rows_included")
        mods = 0
        if self.mod_column_nodes is not None or "mod_column_nodes" in raw:
            encoded = raw.get("mod_column_nodes")
            if encoded is None:
                encoded = [rs.encode_rowset(m) for m in self.mod_column_nodes]
            nodes = []
            for data in encoded:
                v = b.CreateByteVector(bytes(data))
                FbModCol.Start(b)
                FbModCol.AddModifiedRows(b, v)
                nodes.append(FbModCol.End(b))
            FbUpdate.StartModColumnNodesVector(b, len(nodes))
            for n in reversed(nodes):
                b.PrependUOffsetTRelative(n)
            mods = b.EndVector()
        FbUpdate.Start(b)
        FbUpdate.AddIsSnapshot(b, self.is_snapshot)
        FbUpdate.AddFirstSeq(b, self.first_seq)
        FbUpdate.AddLastSeq(b, self.last_seq)
        if ev:
            FbUpdate.AddEffectiveViewport(b, ev)
        if ecs or (self.effective_column_set is not None or "effective_column_set" in raw):
            FbUpdate.AddEffectiveColumnSet(b, ecs)
        if added:
            FbUpdate.AddAddedRows(b, added)
        if removed:
            FbUpdate.AddRemovedRows(b, removed)
        if shifts:
            FbUpdate.AddShiftData(b, shifts)
        if included:
            FbUpdate.AddAddedRowsIncluded(b, included)
        if mods:
            FbUpdate.AddModColumnNodes(b, mods)
        FbUpdate.AddEffectiveReverseViewport(b, self.effective_reverse_viewport)
        FbUpdate.AddTableSize(b, self.table_size)
        return _finish(b, FbUpdate.End(b))

    @classmethod
    def from_bytes(cls, data) -> "UpdateMetadata":
        t = _root(data, "BarrageUpdateMetadata")
        w = "BarrageUpdateMetadata"
        shift_raw = t.bytes_field(8, "shift_data")
        mod_tables = t.tables(10, "mod_column_nodes")
        mods = None
        if mod_tables is not None:
            mods = []
            for i, mt in enumerate(mod_tables):
                raw = mt.bytes_field(0, "modified_rows")
                mods.append(rs.EMPTY_RANGES.copy() if raw is None else _rows(raw, f"{w}.mod_column_nodes[{i}]"))
        return cls(
            first_seq=t.scalar(0, "<q", 0, "first_seq"),
            last_seq=t.scalar(1, "<q", 0, "last_seq"),
            is_snapshot=bool(t.scalar(2, "<B", 0, "is_snapshot")),
            effective_viewport=_rows(t.bytes_field(3, "effective_viewport"), f"{w}.effective_viewport"),
            effective_reverse_viewport=bool(t.scalar(4, "<B", 0, "effective_reverse_viewport")),
            effective_column_set=_cols(t.bytes_field(5, "effective_column_set"), f"{w}.effective_column_set"),
            added_rows=_rows(t.bytes_field(6, "added_rows"), f"{w}.added_rows"),
            removed_rows=_rows(t.bytes_field(7, "removed_rows"), f"{w}.removed_rows"),
            shift_data=_decode("shifts", rs.decode_shifts, shift_raw, f"{w}.shift_data"),
            added_rows_included=_rows(t.bytes_field(9, "added_rows_included"), f"{w}.added_rows_included"),
            mod_column_nodes=mods,
            table_size=t.scalar(11, "<q", 0, "table_size"),
        )

    # conveniences for readers
    def num_adds(self) -> int:
        """Rows whose data is in the add batches: |added_rows_included|, or |added_rows| if absent."""
        src = self.added_rows_included if self.added_rows_included is not None else self.added_rows
        return 0 if src is None else rs.rowset_size(src)

    def mod_counts(self) -> list[int]:
        return [] if self.mod_column_nodes is None else [rs.rowset_size(m) for m in self.mod_column_nodes]


# ----------------------------------------------------------------------------------------------
# the wrapper
# ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class BarrageMessageWrapper(_Message):
    msg_type: int = 0
    payload: Optional[bytes] = None
    magic: int = MAGIC

    def to_bytes(self) -> bytes:
        b = flatbuffers.Builder(len(self.payload or b"") + 32)
        payload = _vec(b, self.payload)
        FbWrapper.Start(b)
        if int(self.msg_type) == BarrageMessageType.UPDATE_METADATA:
            # the server's order (BarrageMessageWriterImpl)
            FbWrapper.AddMagic(b, self.magic)
            FbWrapper.AddMsgType(b, int(self.msg_type))
            if payload:
                FbWrapper.AddMsgPayload(b, payload)
        else:
            # the clients' order for requests (payload first)
            if payload:
                FbWrapper.AddMsgPayload(b, payload)
            FbWrapper.AddMagic(b, self.magic)
            FbWrapper.AddMsgType(b, int(self.msg_type))
        return _finish(b, FbWrapper.End(b))

    @classmethod
    def from_bytes(cls, data, *, check_magic: bool = True) -> "BarrageMessageWrapper":
        t = _root(data, "BarrageMessageWrapper")
        magic = t.scalar(0, "<I", 0, "magic")
        if check_magic and magic != MAGIC:
            raise ProtocolError(f"wrong Barrage magic 0x{magic:08x}; expected 0x{MAGIC:08x} ('dphn')")
        msg_type = t.scalar(1, "<b", 0, "msg_type")
        return cls(msg_type=msg_type, payload=t.bytes_field(2, "msg_payload"), magic=magic)


_BY_TYPE = {
    BarrageMessageType.SUBSCRIPTION_REQUEST: SubscriptionRequest,
    BarrageMessageType.UPDATE_METADATA: UpdateMetadata,
    BarrageMessageType.SNAPSHOT_REQUEST: SnapshotRequest,
    BarrageMessageType.PUBLICATION_REQUEST: PublicationRequest,
    # DoPut options: a BarrageSubscriptionRequest that carries only options (BARRAGE-WIRE.md §7.6)
    BarrageMessageType.SERIALIZATION_OPTIONS: SubscriptionRequest,
}


def wrap(message, msg_type: Optional[int] = None) -> bytes:
    """Wraps a request or metadata object in a BarrageMessageWrapper and returns its bytes."""
    mt = int(msg_type if msg_type is not None else message.MSG_TYPE)
    return BarrageMessageWrapper(msg_type=mt, payload=message.to_bytes()).to_bytes()


def unwrap(data):
    """Parses wrapper bytes and returns (msg_type, typed message object).

    Raises ProtocolError for a wrong magic, an unknown message type, or a malformed payload.
    """
    w = BarrageMessageWrapper.from_bytes(data)
    try:
        kind = BarrageMessageType(w.msg_type)
    except ValueError:
        raise ProtocolError(f"unhandled BarrageMessageType: {w.msg_type}") from None
    cls = _BY_TYPE.get(kind)
    if cls is None:
        raise ProtocolError(f"unhandled BarrageMessageType: {w.msg_type} ({kind.name})")
    if w.payload is None:
        raise ProtocolError(f"Barrage {kind.name} message has no payload")
    return kind, cls.from_bytes(w.payload)
