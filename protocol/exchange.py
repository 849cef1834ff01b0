"""The server side of a DoExchange request stream, sans-I/O: FlightData bytes in, events out.

    reader = ExchangeReader()
    for raw in request_stream:
        event = reader.feed(raw)          # Opening, Subscribe, ViewChange or Snapshot
        ...
    event = reader.close()                # HalfClose, when the client half-closes

The rules are those of docs/flows.md#doexchange-subscriptions: a first FlightData without
`app_metadata` is pyarrow's descriptor-only opening message and is skipped
(docs/client-traps.md#pyarrows-descriptor-only-opening-message); every later message must carry
a Barrage request; only subscription and snapshot requests are handled; the first request fixes
the kind of the stream, and a later subscription request is a view change
(docs/flows.md#view-changes). A refused message raises `ExchangeError` (INVALID_ARGUMENT), after
which the reader accepts nothing more.

`feed` is CPU work only (it parses the request's flatbuffers), so a caller may run it in a worker
thread for large messages, as long as one message is fed at a time and in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.barrage import BarrageMessageType
from tickwire.protocol.flight import BytesLike, FlightDescriptor, decode_flight_data

__all__ = [
    "ExchangeError",
    "ExchangeReader",
    "Opening",
    "Subscribe",
    "ViewChange",
    "Snapshot",
    "HalfClose",
    "ExchangeEvent",
    "parse_request",
]

_HANDLED = (BarrageMessageType.SUBSCRIPTION_REQUEST, BarrageMessageType.SNAPSHOT_REQUEST)


class ExchangeError(ProtocolError):
    """A request stream the server refuses; `code` is the gRPC status name to answer with."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT"):
        super().__init__(message, code)


@dataclass(frozen=True)
class Opening:
    """The first message carried no Barrage metadata (pyarrow's opening message): nothing to do."""

    descriptor: Optional[FlightDescriptor] = None


@dataclass(frozen=True)
class Subscribe:
    """The request that opens a subscription stream."""

    request: barrage.SubscriptionRequest


@dataclass(frozen=True)
class ViewChange:
    """A later subscription request on a subscription stream: new viewport, columns or direction
    (its ticket is ignored)."""

    request: barrage.SubscriptionRequest


@dataclass(frozen=True)
class Snapshot:
    """A snapshot request. `first` is True for the request that opened the stream; later ones on
    a snapshot stream are accepted and carry nothing to answer."""

    request: barrage.SnapshotRequest
    first: bool = True


@dataclass(frozen=True)
class HalfClose:
    """The client half-closed its side of the stream."""


ExchangeEvent = Union[Opening, Subscribe, ViewChange, Snapshot, HalfClose]


def parse_request(app_metadata: bytes) -> tuple[BarrageMessageType,
                                                 Union[barrage.SubscriptionRequest, barrage.SnapshotRequest]]:
    """(type, request) of a DoExchange message's Barrage metadata; only subscription and snapshot
    requests are accepted."""
    try:
        wrapper = barrage.BarrageMessageWrapper.from_bytes(app_metadata)
        if wrapper.msg_type not in _HANDLED:
            raise ExchangeError(f"DoExchange: unhandled BarrageMessageType: {wrapper.msg_type}")
        kind, request = barrage.unwrap(app_metadata)
        assert isinstance(request, (barrage.SubscriptionRequest, barrage.SnapshotRequest))  # the _HANDLED kinds
        return kind, request
    except ExchangeError:
        raise
    except ProtocolError as exc:
        raise ExchangeError(f"bad Barrage request: {exc}") from None


class ExchangeReader:
    """Reads the client-to-server half of one DoExchange call.

    `kind` is the stream's kind once its first request arrived (SUBSCRIPTION_REQUEST or
    SNAPSHOT_REQUEST), else None; `closed` is True after `close()` or a refused message."""

    def __init__(self) -> None:
        self.kind: Optional[BarrageMessageType] = None
        self.closed = False
        self._messages = 0

    def feed(self, data: BytesLike) -> ExchangeEvent:
        """The event of one FlightData (bytes-like). Raises ExchangeError for a message the server
        refuses."""
        if self.closed:
            raise ExchangeError("DoExchange: a message after the end of the request stream")
        try:
            return self._feed(data)
        except BaseException:
            self.closed = True
            raise

    def _feed(self, data: BytesLike) -> ExchangeEvent:
        try:
            fd = decode_flight_data(data)
        except ProtocolError as exc:
            raise ExchangeError(f"malformed FlightData: {exc}") from None
        first = self._messages == 0
        self._messages += 1
        if fd.app_metadata is None:
            if first:
                return Opening(fd.descriptor)
            raise ExchangeError("failed to receive Barrage request metadata")
        mtype, request = parse_request(fd.app_metadata)
        if self.kind is None:
            self.kind = mtype
            if isinstance(request, barrage.SnapshotRequest):  # mtype SNAPSHOT_REQUEST
                return Snapshot(request, first=True)
            return Subscribe(request)
        if mtype != self.kind:
            raise ExchangeError(f"DoExchange stream is a {self.kind.name}; cannot accept a {mtype.name}")
        if isinstance(request, barrage.SnapshotRequest):  # mtype SNAPSHOT_REQUEST
            return Snapshot(request, first=False)
        return ViewChange(request)

    def close(self) -> HalfClose:
        """The client half-closed: the end of the request stream."""
        self.closed = True
        return HalfClose()
