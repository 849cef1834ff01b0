"""The DoExchange request reader (tickwire.protocol.exchange): every event and every refusal,
fed one FlightData at a time, built with tickwire.protocol's own helpers."""
from __future__ import annotations

import numpy as np
import pytest

from tickwire.errors import TickwireError
from tickwire.protocol import ProtocolError, barrage
from tickwire.protocol.barrage import BarrageMessageType
from tickwire.protocol.exchange import (
    ExchangeError,
    ExchangeReader,
    HalfClose,
    Opening,
    Snapshot,
    Subscribe,
    ViewChange,
)
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.opening import (
    OPENING_COMMAND,
    exchange_opening,
    request_message,
    snapshot_request,
    subscription_request,
)

SUB = subscription_request(b"s/t")
SNAP = snapshot_request(b"s/t")
DESCRIPTOR_ONLY = encode_flight_data(b"", None, descriptor=FlightDescriptor.for_command(OPENING_COMMAND))


def feed_all(reader: ExchangeReader, messages) -> list:
    return [reader.feed(m) for m in messages]


def refused(reader: ExchangeReader, message) -> ExchangeError:
    with pytest.raises(ExchangeError) as e:
        reader.feed(message)
    assert e.value.code == "INVALID_ARGUMENT"
    assert isinstance(e.value, ProtocolError) and isinstance(e.value, TickwireError)
    assert reader.closed  # nothing more is accepted after a refusal
    return e.value


# -- events -------------------------------------------------------------------------------------------------------

def test_pyarrow_opening_then_subscription_then_view_changes_then_half_close():
    r = ExchangeReader()
    opening, sub = feed_all(r, exchange_opening(SUB))
    assert opening == Opening(FlightDescriptor.for_command(b"dphn"))
    assert isinstance(sub, Subscribe) and sub.request.ticket == b"s/t" and sub.request.viewport is None
    assert r.kind == BarrageMessageType.SUBSCRIPTION_REQUEST
    change = r.feed(request_message(subscription_request(b"ignored", viewport=[(0, 9)], columns=[1], reverse=True)))
    assert isinstance(change, ViewChange)
    assert change.request.viewport.tolist() == [[0, 9]]
    assert np.asarray(change.request.columns).tolist() == [1]
    assert change.request.reverse_viewport
    assert isinstance(r.feed(request_message(SUB)), ViewChange)
    assert r.close() == HalfClose() and r.closed


def test_java_client_sends_the_request_first():
    r = ExchangeReader()
    ev = r.feed(request_message(SUB))
    assert isinstance(ev, Subscribe) and ev.request.ticket == b"s/t"


def test_subscription_options_reach_the_event():
    opts = barrage.SubscriptionOptions(min_update_interval_ms=250, columns_as_list=True, batch_size=7)
    ev = ExchangeReader().feed(request_message(subscription_request(b"s/t", options=opts)))
    assert ev.request.options.min_update_interval_ms == 250
    assert ev.request.options.columns_as_list and ev.request.options.batch_size == 7


def test_snapshot_request_then_more_snapshot_requests_then_half_close():
    r = ExchangeReader()
    opening, snap = feed_all(r, exchange_opening(snapshot_request(b"s/t", columns=[0, 2], viewport=[(5, 6)])))
    assert isinstance(opening, Opening)
    assert isinstance(snap, Snapshot) and snap.first
    assert snap.request.ticket == b"s/t" and snap.request.viewport.tolist() == [[5, 6]]
    assert r.kind == BarrageMessageType.SNAPSHOT_REQUEST
    again = r.feed(request_message(SNAP))
    assert isinstance(again, Snapshot) and not again.first
    assert isinstance(r.close(), HalfClose)


def test_half_close_before_any_request():
    r = ExchangeReader()
    assert isinstance(r.feed(DESCRIPTOR_ONLY), Opening)
    assert isinstance(r.close(), HalfClose) and r.kind is None


def test_an_opening_message_without_a_descriptor_is_skipped_too():
    r = ExchangeReader()
    assert r.feed(b"") == Opening(None)
    assert isinstance(r.feed(request_message(SUB)), Subscribe)


# -- refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b"\x0a\xff", b"\x1a\x05ab", b"\x07", b"\x12\x01"])
def test_malformed_flight_data(raw):
    err = refused(ExchangeReader(), raw)
    assert str(err).startswith("malformed FlightData: FlightData")


def test_malformed_flight_data_later_in_the_stream():
    r = ExchangeReader()
    r.feed(request_message(SUB))
    assert str(refused(r, b"\x0a\xff")).startswith("malformed FlightData: ")


def test_a_second_message_without_metadata():
    r = ExchangeReader()
    r.feed(DESCRIPTOR_ONLY)
    assert str(refused(r, DESCRIPTOR_ONLY)) == "failed to receive Barrage request metadata"


def test_a_message_without_metadata_after_the_request():
    r = ExchangeReader()
    r.feed(request_message(SUB))
    assert str(refused(r, encode_flight_data(b"", None))) == "failed to receive Barrage request metadata"


@pytest.mark.parametrize("msg_type", [BarrageMessageType.UPDATE_METADATA, BarrageMessageType.SERIALIZATION_OPTIONS,
                                      BarrageMessageType.PUBLICATION_REQUEST, BarrageMessageType.NONE])
def test_unhandled_message_types(msg_type):
    raw = barrage.BarrageMessageWrapper(msg_type=int(msg_type), payload=b"").to_bytes()
    err = refused(ExchangeReader(), request_message(raw))
    assert str(err) == f"DoExchange: unhandled BarrageMessageType: {int(msg_type)}"


def test_unhandled_message_type_later_in_the_stream():
    r = ExchangeReader()
    r.feed(request_message(SUB))
    raw = barrage.BarrageMessageWrapper(msg_type=6, payload=b"").to_bytes()
    assert str(refused(r, request_message(raw))) == "DoExchange: unhandled BarrageMessageType: 6"


@pytest.mark.parametrize("metadata", [b"\x01\x02garbage", b"", b"\x00" * 16])
def test_bad_barrage_wrapper(metadata):
    assert str(refused(ExchangeReader(), request_message(metadata))).startswith("bad Barrage request: ")


def test_wrong_magic():
    raw = barrage.BarrageMessageWrapper(msg_type=5, payload=b"", magic=0x12345678).to_bytes()
    err = refused(ExchangeReader(), request_message(raw))
    assert str(err) == "bad Barrage request: wrong Barrage magic 0x12345678; expected 0x6e687064 ('dphn')"


def test_bad_request_payload():
    raw = barrage.BarrageMessageWrapper(msg_type=5, payload=b"\xff\xff\xff\x7f").to_bytes()
    assert str(refused(ExchangeReader(), request_message(raw))).startswith("bad Barrage request: ")


def test_request_without_payload():
    raw = barrage.BarrageMessageWrapper(msg_type=7, payload=None).to_bytes()
    err = refused(ExchangeReader(), request_message(raw))
    assert str(err) == "bad Barrage request: Barrage SNAPSHOT_REQUEST message has no payload"


def test_a_subscription_stream_refuses_a_snapshot_request():
    r = ExchangeReader()
    feed_all(r, exchange_opening(SUB))
    err = refused(r, request_message(SNAP))
    assert str(err) == "DoExchange stream is a SUBSCRIPTION_REQUEST; cannot accept a SNAPSHOT_REQUEST"


def test_a_snapshot_stream_refuses_a_subscription_request():
    r = ExchangeReader()
    r.feed(request_message(SNAP))
    err = refused(r, request_message(SUB))
    assert str(err) == "DoExchange stream is a SNAPSHOT_REQUEST; cannot accept a SUBSCRIPTION_REQUEST"


def test_nothing_is_accepted_after_a_refusal_or_the_half_close():
    r = ExchangeReader()
    refused(r, b"\x0a\xff")
    with pytest.raises(ExchangeError, match="after the end of the request stream"):
        r.feed(request_message(SUB))
    r = ExchangeReader()
    r.close()
    with pytest.raises(ExchangeError, match="after the end of the request stream"):
        r.feed(request_message(SUB))


def test_non_bytes_input_is_malformed():
    assert str(refused(ExchangeReader(), 12345)).startswith("malformed FlightData: ")


# -- the client's side of the same messages -----------------------------------------------------------------------

def test_opening_messages_are_what_clients_sent_before():
    desc, req = exchange_opening(SUB)
    assert desc == DESCRIPTOR_ONLY
    assert req == encode_flight_data(b"", SUB)
    cols = np.array([0, 2], dtype=np.int64)
    vp = np.array([(0, 49)], dtype=np.int64).reshape(-1, 2)
    assert subscription_request(b"s/t", columns=[0, 2], viewport=[(0, 49)], reverse=True) == barrage.wrap(
        barrage.SubscriptionRequest(ticket=b"s/t", columns=cols, viewport=vp, reverse_viewport=True,
                                    options=barrage.SubscriptionOptions()))
    assert snapshot_request(b"s/t") == barrage.wrap(barrage.SnapshotRequest(ticket=b"s/t",
                                                                            options=barrage.SnapshotOptions()))


def test_response_reader_gives_the_schema_then_whole_messages():
    import pyarrow as pa

    from tickwire.protocol.responses import ResponseReader, SchemaReceived, UpdateReceived, natural_added
    from tickwire.protocol.update import encode_schema, encode_update

    schema = pa.schema([("x", pa.int64()), ("s", pa.string())])
    md = barrage.UpdateMetadata(is_snapshot=True, first_seq=0, last_seq=0,
                                added_rows=np.array([[0, 2]], dtype=np.int64),
                                added_rows_included=np.array([[0, 2]], dtype=np.int64))
    payloads = encode_update(barrage.wrap(md), list(schema.types), [pa.array([1, 2, 3]), pa.array(["a", "b", "c"])],
                             None, batch_size=2)
    assert len(payloads) == 2  # one logical message in two batches
    r = ResponseReader()
    assert r.feed(encode_schema(schema)) == [SchemaReceived(schema)] and r.schema == schema
    assert r.feed(payloads[0]) == [] and r.in_message
    with pytest.raises(ProtocolError, match="in the middle of a message"):
        r.close()
    (ev,) = r.feed(payloads[1])
    assert isinstance(ev, UpdateReceived) and ev.ends_full_snapshot
    assert [a.to_pylist() for a in natural_added(ev.update, schema, 3)] == [[1, 2, 3], ["a", "b", "c"]]
    r.close()
