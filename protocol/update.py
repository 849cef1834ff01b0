"""One logical Barrage update <-> its sequence of FlightData (docs/messages.md#record-batch-framing).

A logical message is one `UpdateMetadata` plus the data of its added rows (every column, in row
order) and of its modified rows (each column its own rows). On the wire it is: add batches, then
mod batches, the metadata on the first FlightData only, and a single 0-row batch when there is no
data at all. Readers find the end by counting rows, since Barrage has no batch counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Union

import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.batches import (
    HEADER_DICTIONARY_BATCH,
    HEADER_RECORD_BATCH,
    HEADER_SCHEMA,
    decode_record_batch,
    encode_batches,
    encode_record_batch,
    read_message_header,
)
from tickwire.protocol.flight import BytesLike, FlightData, decode_flight_data, encode_flight_data
from tickwire.protocol.schema import (
    empty_array,
    list_wrapped_schema,
    read_schema_message,
    schema_message,
    sentinels_to_nulls,
    unwrap_list_schema,
)

__all__ = ["BarrageUpdate", "encode_schema", "encode_update", "StreamDecoder"]


@dataclass
class BarrageUpdate:
    """A decoded logical message. `added[c]` holds column c's values of the included added rows,
    `modified[c]` its values of `metadata.mod_column_nodes[c]` (in row order). `metadata` is None
    for record batches that came without Barrage metadata (a plain Arrow Flight stream)."""

    metadata: Optional[barrage.UpdateMetadata]
    added: list[pa.Array] = field(default_factory=list)
    modified: list[pa.Array] = field(default_factory=list)

    def added_table(self, schema: pa.Schema) -> pa.Table:
        return pa.Table.from_arrays(self.added, schema=schema)


def encode_schema(schema: pa.Schema, *, columns_as_list: bool = False) -> bytes:
    """The Schema FlightData (data_header only) that opens every DoGet and DoExchange response."""
    s = list_wrapped_schema(schema) if columns_as_list else schema
    return encode_flight_data(schema_message(s))


def encode_update(
    metadata: bytes,
    types: Sequence[pa.DataType],
    added: Sequence[Optional[pa.Array]] | None,
    modified: Sequence[Optional[pa.Array]] | None,
    *,
    use_deephaven_nulls: bool = False,
    columns_as_list: bool = False,
    batch_size: int = 0,
    max_message_size: int = 0,
    initial_batch_rows: int = 0,
    added_rows: int = 0,
) -> list[bytes]:
    """FlightData payloads of one logical update (`added_rows`: the added row count of a table
    without columns, which only RecordBatch.length carries).

    `metadata` is the wrapped metadata bytes (e.g. `barrage.wrap(UpdateMetadata(...))`), or an empty
    bytes object for a plain Arrow stream (DoGet of a non-Barrage reader gets it all the same).
    `added[c]` / `modified[c]` are the column's values, or None when the column carries nothing in
    this phase (field node (0, 0)). Add batches come first, then mod batches; the metadata goes on the
    first FlightData; with no rows at all the message is one empty batch. `initial_batch_rows`
    is the first batch size to try (Deephaven's 4096 when 0).
    """
    ncols = len(types)
    out: list[bytes] = []
    first_md: Optional[bytes] = metadata if metadata else None
    overhead = len(metadata) + 16
    for phase, rows in ((added, added_rows if ncols == 0 else 0), (modified, 0)):
        if phase is None or (all(c is None or len(c) == 0 for c in phase) and not rows):
            continue
        if len(phase) != ncols:
            raise ValueError(f"{len(phase)} columns for a schema of {ncols}")
        for enc in encode_batches(phase, types, overhead=overhead if first_md is not None else 16,
                                  initial_rows=initial_batch_rows, use_deephaven_nulls=use_deephaven_nulls,
                                  columns_as_list=columns_as_list, batch_size=batch_size,
                                  max_message_size=max_message_size, rows=rows):
            out.append(encode_flight_data(enc.header, first_md, body_parts=enc.body_parts))
            first_md = None
    if not out:
        enc = encode_record_batch([None] * ncols, types, use_deephaven_nulls=use_deephaven_nulls,
                                  columns_as_list=columns_as_list)
        out.append(encode_flight_data(enc.header, first_md, body_parts=enc.body_parts))
    return out


class StreamDecoder:
    """Turns a server-to-client stream of FlightData into schema + logical updates.

    Feed every FlightData (bytes or decoded); `feed` returns a BarrageUpdate when a message
    completes, else None. Deephaven-null sentinels become Arrow nulls when `use_deephaven_nulls`.
    """

    def __init__(self, *, columns_as_list: bool = False, use_deephaven_nulls: bool = False):
        self.columns_as_list = columns_as_list
        self.use_deephaven_nulls = use_deephaven_nulls
        self.wire_schema: Optional[pa.Schema] = None
        self.schema: Optional[pa.Schema] = None
        self._pending: Optional[BarrageUpdate] = None
        self._adds_left = 0
        self._mods_left: list[int] = []
        self._add_parts: list[list[pa.Array]] = []
        self._mod_parts: list[list[pa.Array]] = []

    @property
    def in_message(self) -> bool:
        return self._pending is not None

    def feed(self, data: Union[BytesLike, FlightData]) -> Optional[BarrageUpdate]:
        fd = data if isinstance(data, FlightData) else decode_flight_data(data)
        if not fd.data_header:
            if fd.app_metadata is not None:
                raise ProtocolError("FlightData with metadata but no data header (metadata-only message)")
            return None
        info = read_message_header(fd.data_header)
        if info.header_type == HEADER_SCHEMA:
            if self.schema is not None:
                raise ProtocolError("a second Schema message in the stream")
            self.wire_schema = read_schema_message(fd.data_header)
            self.schema = unwrap_list_schema(self.wire_schema) if self.columns_as_list else self.wire_schema
            return None
        if info.header_type == HEADER_DICTIONARY_BATCH:
            return None  # tolerated; dictionary-encoded columns are not used by tickwire's peers
        if info.header_type != HEADER_RECORD_BATCH:
            raise ProtocolError(f"unexpected Arrow message type {info.header_type}")
        if self.schema is None:
            raise ProtocolError("record batch before the schema")
        if fd.app_metadata is not None:
            if self._pending is not None:
                raise ProtocolError("new Barrage metadata before the previous message was complete")
            kind, md = barrage.unwrap(fd.app_metadata)
            if kind != barrage.BarrageMessageType.UPDATE_METADATA or not isinstance(md, barrage.UpdateMetadata):
                raise ProtocolError(f"server sent Barrage message type {kind.name}, expected update metadata")
            self._start(md)
        elif self._pending is None:
            self._start(None)
        cols = decode_record_batch(info, fd.data_body if fd.data_body is not None else b"", list(self.schema),
                                   columns_as_list=self.columns_as_list)
        self._take(cols)
        if self._adds_left <= 0 and all(m <= 0 for m in self._mods_left):
            return self._finish()
        return None

    def _start(self, md: Optional[barrage.UpdateMetadata]) -> None:
        assert self.schema is not None  # feed starts a message only after the schema
        n = len(self.schema)
        self._pending = BarrageUpdate(md)
        if md is None:
            self._adds_left = -1  # a plain batch: whatever it holds is the whole message
            self._mods_left = [0] * n
        else:
            self._adds_left = md.num_adds()
            counts = md.mod_counts()
            self._mods_left = counts if counts else [0] * n
            if len(self._mods_left) != n:
                raise ProtocolError(f"metadata has {len(self._mods_left)} mod column nodes for {n} columns")
        self._add_parts = [[] for _ in range(n)]
        self._mod_parts = [[] for _ in range(n)]

    def _take(self, cols: list[pa.Array]) -> None:
        if self._adds_left < 0:
            for c, a in enumerate(cols):
                self._add_parts[c].append(a)
            self._adds_left = 0
            return
        if self._adds_left > 0:
            rows = max((len(a) for a in cols), default=0)
            if rows > self._adds_left:
                raise ProtocolError(f"add batch of {rows} rows where {self._adds_left} remained")
            for c, a in enumerate(cols):
                if len(a) not in (0, rows):
                    raise ProtocolError(f"add batch: column {c} has {len(a)} rows, others {rows}")
                self._add_parts[c].append(a)
            self._adds_left -= rows
            return
        for c, a in enumerate(cols):
            if len(a) > self._mods_left[c]:
                raise ProtocolError(f"mod batch: column {c} has {len(a)} rows where {self._mods_left[c]} remained")
            self._mod_parts[c].append(a)
            self._mods_left[c] -= len(a)

    def _finish(self) -> BarrageUpdate:
        up = self._pending
        assert up is not None and self.schema is not None  # _take made the message complete
        fields = list(self.schema)
        up.added = [self._concat(parts, f) for parts, f in zip(self._add_parts, fields)]
        up.modified = [self._concat(parts, f) for parts, f in zip(self._mod_parts, fields)]
        self._pending = None
        return up

    def _concat(self, parts: list[pa.Array], f: pa.Field) -> pa.Array:
        parts = [p for p in parts if len(p)]
        if not parts:
            arr = empty_array(f.type)
        elif len(parts) == 1:
            arr = parts[0]
        else:
            arr = pa.concat_arrays(parts)
        return sentinels_to_nulls(arr) if self.use_deephaven_nulls else arr


def decode_stream(payloads: Iterable[Union[BytesLike, FlightData]],
                  **kw: bool) -> tuple[Optional[pa.Schema], list[BarrageUpdate]]:
    """Decodes a whole server stream; returns (schema, updates)."""
    dec = StreamDecoder(**kw)
    updates = [u for u in (dec.feed(p) for p in payloads) if u is not None]
    if dec.in_message:
        raise ProtocolError("stream ended in the middle of a message")
    return dec.schema, updates
