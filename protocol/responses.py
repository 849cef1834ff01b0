"""The client side of a DoGet or DoExchange response, sans-I/O: FlightData bytes in, events out.

    reader = ResponseReader()
    for raw in response_stream:
        for event in reader.feed(raw):
            if isinstance(event, SchemaReceived): ...   # once, first
            else: ...                                    # UpdateReceived: one logical message
    reader.close()                                       # the stream ended

A thin layer over `update.StreamDecoder` that says when the schema arrives (it opens every
response, docs/flows.md#doexchange-subscriptions) and hands over whole logical messages, plus the
conversions of an update's wire values to natural Arrow values (docs/schema.md#type-mapping).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol.flight import BytesLike, FlightData
from tickwire.protocol.schema import from_wire_arrays
from tickwire.protocol.update import BarrageUpdate, StreamDecoder

__all__ = ["ResponseReader", "SchemaReceived", "UpdateReceived", "ResponseEvent", "natural_added",
           "natural_modified"]


@dataclass(frozen=True)
class SchemaReceived:
    """The response's Schema (the wire schema, `deephaven:type` metadata and all)."""

    schema: pa.Schema


@dataclass(frozen=True)
class UpdateReceived:
    """One whole logical message: a snapshot, an update, or a plain Arrow batch (no metadata)."""

    update: BarrageUpdate

    @property
    def ends_full_snapshot(self) -> bool:
        """True for the last piece of a full subscription's snapshot: a snapshot without an
        effective viewport (docs/viewports.md#growing-snapshots)."""
        md = self.update.metadata
        return md is not None and bool(md.is_snapshot) and md.effective_viewport is None


ResponseEvent = Union[SchemaReceived, UpdateReceived]


class ResponseReader:
    """Reads one server-to-client response stream. `schema` is the wire schema once received."""

    def __init__(self, *, columns_as_list: bool = False, use_deephaven_nulls: bool = False):
        self._decoder = StreamDecoder(columns_as_list=columns_as_list, use_deephaven_nulls=use_deephaven_nulls)

    @property
    def schema(self) -> Optional[pa.Schema]:
        return self._decoder.schema

    @property
    def in_message(self) -> bool:
        return self._decoder.in_message

    def feed(self, data: Union[BytesLike, FlightData]) -> list[ResponseEvent]:
        """The events of one FlightData: SchemaReceived when it is the schema, UpdateReceived when
        it completes a logical message, else nothing. Raises ProtocolError for bad input."""
        had_schema = self._decoder.schema is not None
        u = self._decoder.feed(data)
        if not had_schema and self._decoder.schema is not None:
            return [SchemaReceived(self._decoder.schema)]
        return [] if u is None else [UpdateReceived(u)]

    def close(self) -> None:
        """The stream ended; raises ProtocolError when it ended inside a logical message."""
        if self._decoder.in_message:
            raise ProtocolError("stream ended in the middle of a message")


def natural_added(update: BarrageUpdate, wire_schema: pa.Schema, rows: int) -> list[pa.Array]:
    """The added rows' values as natural Arrow arrays, `rows` long each: a column sent empty (not
    part of this message) is all nulls."""
    cols = [a if a is not None and len(a) == rows else pa.nulls(rows, wire_schema.field(i).type)
            for i, a in enumerate(update.added)]
    return from_wire_arrays(cols, wire_schema)


def natural_modified(update: BarrageUpdate, wire_schema: pa.Schema, column: int) -> pa.Array:
    """Column `column`'s modified values as a natural Arrow array."""
    return from_wire_arrays([update.modified[column]], pa.schema([wire_schema.field(column)]))[0]
