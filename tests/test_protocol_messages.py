"""Barrage message objects and FlightData: round trips, absent vs empty, and malformed input."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.flight import FlightDescriptor, decode_flight_data, encode_flight_data
from tickwire.protocol.rowset import keys_to_ranges

from .golden import GOLDEN, flight_streams

ranges = st.lists(st.integers(0, 2**40), max_size=12, unique=True).map(
    lambda ks: keys_to_ranges(np.array(sorted(ks), dtype=np.int64)))
maybe_ranges = st.none() | ranges
colsets = st.none() | st.lists(st.integers(0, 70), unique=True, max_size=20).map(
    lambda xs: np.array(sorted(xs), dtype=np.int64))
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)

sub_options = st.builds(barrage.SubscriptionOptions, column_conversion_mode=st.integers(1, 3),
                        use_deephaven_nulls=st.booleans(), min_update_interval_ms=i32, batch_size=i32,
                        max_message_size=i32, columns_as_list=st.booleans(), preview_list_length_limit=i64)
snap_options = st.builds(barrage.SnapshotOptions, column_conversion_mode=st.integers(1, 3),
                         use_deephaven_nulls=st.booleans(), batch_size=i32, max_message_size=i32,
                         preview_list_length_limit=i64)
tickets = st.none() | st.binary(min_size=1, max_size=20)


@st.composite
def shifts(draw):
    n = draw(st.integers(0, 5))
    starts, ends, dests = [], [], []
    pos = 10
    for _ in range(n):
        s = pos + draw(st.integers(1, 1000))
        e = s + draw(st.integers(0, 100))
        starts.append(s)
        ends.append(e)
        dests.append(s + draw(st.integers(1, 5)))
        pos = e + 10
    return tuple(np.array(x, dtype=np.int64) for x in (starts, ends, dests))


messages = st.one_of(
    st.builds(barrage.SubscriptionRequest, ticket=tickets, columns=colsets, viewport=maybe_ranges,
              options=st.none() | sub_options, reverse_viewport=st.booleans(), subscription_token=tickets),
    st.builds(barrage.SnapshotRequest, ticket=tickets, columns=colsets, viewport=maybe_ranges,
              options=st.none() | snap_options, reverse_viewport=st.booleans()),
    st.builds(barrage.PublicationRequest, ticket=tickets,
              options=st.none() | st.builds(barrage.PublicationOptions, use_deephaven_nulls=st.booleans())),
    st.builds(barrage.UpdateMetadata, first_seq=i64, last_seq=i64, is_snapshot=st.booleans(),
              effective_viewport=maybe_ranges, effective_reverse_viewport=st.booleans(),
              effective_column_set=colsets, added_rows=maybe_ranges, removed_rows=maybe_ranges,
              shift_data=st.none() | shifts(), added_rows_included=maybe_ranges,
              mod_column_nodes=st.none() | st.lists(ranges, max_size=6), table_size=i64),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages)
def test_messages_round_trip(msg):
    data = barrage.wrap(msg)
    kind, back = barrage.unwrap(data)
    assert kind == msg.MSG_TYPE
    assert back == msg
    assert type(msg).from_bytes(msg.to_bytes()) == msg


def test_absent_and_empty_are_different():
    absent = barrage.SubscriptionRequest(ticket=b"s/t")
    empty = barrage.SubscriptionRequest(ticket=b"s/t", columns=np.zeros(0, np.int64),
                                        viewport=np.zeros((0, 2), np.int64))
    a = barrage.SubscriptionRequest.from_bytes(absent.to_bytes())
    e = barrage.SubscriptionRequest.from_bytes(empty.to_bytes())
    assert a.columns is None and a.viewport is None
    assert e.columns is not None and e.columns.size == 0
    assert e.viewport is not None and e.viewport.shape == (0, 2)
    md = barrage.UpdateMetadata(effective_column_set=np.zeros(0, np.int64))
    assert barrage.UpdateMetadata.from_bytes(md.to_bytes()).effective_column_set.size == 0
    assert barrage.UpdateMetadata.from_bytes(barrage.UpdateMetadata().to_bytes()).effective_column_set is None


def test_defaults_are_not_written():
    import struct

    from tickwire.protocol.fbread import root

    def written_slots(data):
        t = root(data, "t")
        slots = [struct.unpack_from("<H", t.buf, t.vt + 4 + 2 * i)[0] for i in range((t.vt_len - 4) // 2)]
        return [i for i, off in enumerate(slots) if off]

    assert written_slots(barrage.UpdateMetadata().to_bytes()) == []
    assert written_slots(barrage.UpdateMetadata(table_size=7, first_seq=0).to_bytes()) == [11]
    opts = barrage.SubscriptionRequest(options=barrage.SubscriptionOptions(batch_size=4096)).to_bytes()
    t = root(opts, "req").table(3, "options")
    assert t.scalar(3, "<i", 0, "batch_size") == 4096
    assert t.vt_len == 4 + 2 * 4  # slots after batch_size are default and not even in the vtable


def test_wrong_magic_and_unknown_type_are_reported():
    good = barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/t"))
    bad_magic = barrage.BarrageMessageWrapper(msg_type=5, payload=b"x" * 8, magic=0x12345678).to_bytes()
    with pytest.raises(ProtocolError, match="wrong Barrage magic 0x12345678"):
        barrage.unwrap(bad_magic)
    unknown = barrage.BarrageMessageWrapper(msg_type=42, payload=barrage.SubscriptionRequest().to_bytes()).to_bytes()
    with pytest.raises(ProtocolError, match="unhandled BarrageMessageType: 42"):
        barrage.unwrap(unknown)
    assert barrage.unwrap(good)[0] == barrage.BarrageMessageType.SUBSCRIPTION_REQUEST


def test_out_of_range_offsets_are_reported():
    data = bytearray(barrage.UpdateMetadata(added_rows=np.array([[0, 9]]), table_size=5).to_bytes())
    data[0:4] = (len(data) + 100).to_bytes(4, "little")
    with pytest.raises(ProtocolError, match="outside"):
        barrage.UpdateMetadata.from_bytes(bytes(data))


def _fuzz_targets():
    base = [barrage.wrap(barrage.UpdateMetadata(first_seq=3, added_rows=np.array([[0, 99]]),
                                                 mod_column_nodes=[np.array([[5, 5]])], table_size=100)),
            barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/abc", viewport=np.array([[0, 9]]),
                                                     options=barrage.SubscriptionOptions(batch_size=4096)))]
    if GOLDEN.exists():
        for _p, _o, client_md, server in flight_streams()[:6]:
            base += client_md[:1]
            for r in server[:3]:
                md = decode_flight_data(r.payload).app_metadata
                if md:
                    base.append(md)
    return base


FUZZ_BASE = _fuzz_targets()


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(FUZZ_BASE), st.data())
def test_fuzz_mutated_messages_only_raise_protocol_error(base, data):
    raw = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "byte"]))
        if op == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        elif raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255)) if op == "byte" else raw[i] ^ (1 << data.draw(st.integers(0, 7)))
    try:
        barrage.unwrap(bytes(raw))
    except ProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80))
def test_fuzz_random_bytes(raw):
    for fn in (barrage.unwrap, barrage.UpdateMetadata.from_bytes, barrage.SubscriptionRequest.from_bytes,
               decode_flight_data):
        try:
            fn(raw)
        except ProtocolError:
            pass


# ----------------------------------------------------------------------------------------------
# FlightData
# ----------------------------------------------------------------------------------------------

def test_flight_data_field_order_and_forced_body():
    data = encode_flight_data(b"HDR", b"MD", force_body=True)
    assert data == b"\x12\x03HDR\x1a\x02MD\xc2\x3e\x00"
    assert encode_flight_data(b"HDR") == b"\x12\x03HDR"  # schema messages: header only
    desc = FlightDescriptor.for_command(b"dphn")
    data = encode_flight_data(None, b"M", descriptor=desc)
    fd = decode_flight_data(data)
    assert fd.descriptor == desc and fd.app_metadata == b"M" and fd.data_body is None
    fd = decode_flight_data(encode_flight_data(b"H", None, body_parts=[b"ab", memoryview(b"cd")]))
    assert bytes(fd.data_body) == b"abcd"


def test_flight_data_any_field_order_and_unknown_fields():
    # body first, an unknown varint field 7, then metadata and header
    raw = b"\xc2\x3e\x02xy" + b"\x38\x05" + b"\x1a\x01m" + b"\x12\x01h"
    fd = decode_flight_data(raw)
    assert (fd.data_header, fd.app_metadata, bytes(fd.data_body)) == (b"h", b"m", b"xy")


def test_descriptor_path_round_trip():
    d = FlightDescriptor.for_path("scope", "trades")
    assert FlightDescriptor.from_bytes(d.to_bytes()) == d


@pytest.mark.parametrize("raw,words", [(b"\x12\x05ab", "runs past the end"), (b"\x12", "truncated varint"),
                                       (b"\x13\x00", "unsupported wire type"), (b"\x00\x01", "field number 0")])
def test_malformed_flight_data(raw, words):
    with pytest.raises(ProtocolError, match=words):
        decode_flight_data(raw)
