"""What a client sends, sans-I/O: the opening of a DoExchange subscription or snapshot request,
its later view changes, and a DoPut upload.

    send(exchange_opening(subscription_request(b"s/trades")))   # DoExchange: two FlightData
    send(request_message(subscription_request(b"s/trades", viewport=[(0, 49)])))   # a view change
    send(put_opening(["scope", "t"], schema) + put_batches(table))                # DoPut

A DoExchange opens with a descriptor-only FlightData (`CMD "dphn"`) and then the request, as
pyarrow's `do_exchange` does (docs/client-traps.md#pyarrows-descriptor-only-opening-message), so
a server must handle that form; the request is a wrapped Barrage subscription or snapshot
request (docs/flows.md#doexchange-subscriptions, docs/flows.md#snapshot-requests). A DoPut names
its destination with a PATH descriptor on its first FlightData, then optionally sends the
serialization options, then the Schema and the RecordBatches (docs/flows.md#doput).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tickwire.protocol import barrage
from tickwire.protocol.batches import encode_batches
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.schema import list_wrapped_schema, schema_message

__all__ = [
    "OPENING_COMMAND",
    "subscription_request",
    "snapshot_request",
    "exchange_opening",
    "request_message",
    "put_options",
    "put_opening",
    "put_batches",
]

#: the command of the descriptor on the first FlightData of a DoExchange
OPENING_COMMAND = b"dphn"


def _columns(columns: Optional[npt.ArrayLike]) -> Optional[np.ndarray]:
    return None if columns is None else np.asarray(columns, dtype=np.int64).ravel()


def _viewport(viewport: Optional[npt.ArrayLike]) -> Optional[np.ndarray]:
    return None if viewport is None else np.asarray(viewport, dtype=np.int64).reshape(-1, 2)


def subscription_request(ticket: bytes, *, columns: Optional[npt.ArrayLike] = None,
                         viewport: Optional[npt.ArrayLike] = None, reverse: bool = False,
                         options: Optional[barrage.SubscriptionOptions] = None) -> bytes:
    """The wrapped BarrageSubscriptionRequest: a full subscription without `viewport`, column
    indices in `columns` (None: every column), inclusive position ranges in `viewport`."""
    return barrage.wrap(barrage.SubscriptionRequest(
        ticket=ticket, columns=_columns(columns), viewport=_viewport(viewport), reverse_viewport=bool(reverse),
        options=options if options is not None else barrage.SubscriptionOptions()))


def snapshot_request(ticket: bytes, *, columns: Optional[npt.ArrayLike] = None,
                     viewport: Optional[npt.ArrayLike] = None, reverse: bool = False,
                     options: Optional[barrage.SnapshotOptions] = None) -> bytes:
    """The wrapped BarrageSnapshotRequest (same arguments as `subscription_request`)."""
    return barrage.wrap(barrage.SnapshotRequest(
        ticket=ticket, columns=_columns(columns), viewport=_viewport(viewport), reverse_viewport=bool(reverse),
        options=options if options is not None else barrage.SnapshotOptions()))


def request_message(request: bytes) -> bytes:
    """The FlightData that carries a wrapped Barrage request (a DoExchange's request or view change)."""
    return encode_flight_data(b"", request)


def exchange_opening(request: bytes) -> list[bytes]:
    """The first two FlightData of a DoExchange: the descriptor-only message, then `request`."""
    return [encode_flight_data(b"", None, descriptor=FlightDescriptor.for_command(OPENING_COMMAND)),
            request_message(request)]


def put_options(*, use_deephaven_nulls: bool = False, columns_as_list: bool = False) -> bytes:
    """The wrapped serialization options of an upload (a BarrageSubscriptionRequest holding only
    options, message type SERIALIZATION_OPTIONS, as Deephaven's clients send it)."""
    opts = barrage.SubscriptionOptions(use_deephaven_nulls=use_deephaven_nulls, columns_as_list=columns_as_list)
    return barrage.wrap(barrage.SubscriptionRequest(options=opts), barrage.BarrageMessageType.SERIALIZATION_OPTIONS)


def put_opening(path: Sequence[str], schema: pa.Schema, *, use_deephaven_nulls: bool = False,
                columns_as_list: bool = False, keys: Optional[Sequence[str]] = None) -> list[bytes]:
    """The first FlightData of a DoPut: the destination descriptor (with the options when any is
    set), then the Schema (list-wrapped for `columns_as_list`). `keys` names key columns in the
    schema's `tickwire:keys` metadata, making a new table keyed."""
    if keys:
        schema = schema.with_metadata({**(schema.metadata or {}), b"tickwire:keys": ",".join(keys).encode()})
    desc: Optional[FlightDescriptor] = FlightDescriptor.for_path(*path)
    out = []
    if use_deephaven_nulls or columns_as_list:
        out.append(encode_flight_data(b"", put_options(use_deephaven_nulls=use_deephaven_nulls,
                                                       columns_as_list=columns_as_list), descriptor=desc))
        desc = None
    wire = list_wrapped_schema(schema) if columns_as_list else schema
    out.append(encode_flight_data(schema_message(wire), None, descriptor=desc))
    return out


def put_batches(data: pa.Table | pa.RecordBatch, *, use_deephaven_nulls: bool = False,
                columns_as_list: bool = False, batch_size: int = 0) -> list[bytes]:
    """The RecordBatch FlightData of `data`'s rows (in `data`'s own types; Arrow nulls written as
    Deephaven sentinels when `use_deephaven_nulls`)."""
    if isinstance(data, pa.Table):
        columns = [c.combine_chunks() if c.num_chunks != 1 else c.chunk(0) for c in data.columns]
    else:
        columns = list(data.columns)
    types = [f.type for f in data.schema]
    return [encode_flight_data(enc.header, None, body_parts=enc.body_parts)
            for enc in encode_batches(columns, types, use_deephaven_nulls=use_deephaven_nulls,
                                      columns_as_list=columns_as_list, batch_size=batch_size)]
