"""FlightData / FlightDescriptor as raw protobuf bytes (tickwire.protocol.flight)."""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol.batches import encode_record_batch
from tickwire.protocol.flight import (
    DESCRIPTOR_CMD,
    DESCRIPTOR_PATH,
    FlightData,
    FlightDescriptor,
    decode_flight_data,
    encode_flight_data,
    encode_varint,
    flight_data_size,
)
from tickwire.protocol.schema import schema_message

from .golden import GOLDEN, captures, flight_streams, read_cap

HEADER = b"\x10\x00\x00\x00hdr-bytes"


def test_field_order_and_tags():
    desc = FlightDescriptor.for_command(b"dphn")
    out = encode_flight_data(HEADER, b"meta", b"body!", desc)
    raw_desc = desc.to_bytes()
    assert out == (b"\x0a" + bytes([len(raw_desc)]) + raw_desc + b"\x12" + bytes([len(HEADER)]) + HEADER
                   + b"\x1a\x04meta" + b"\xc2\x3e\x05body!")
    assert len(out) == flight_data_size(len(HEADER), 5, 4, len(raw_desc))


def test_record_batch_header_always_gets_a_body_field():
    enc = encode_record_batch([pa.array([], pa.int32())])
    assert enc.body_length == 0
    out = encode_flight_data(enc.header, b"md")
    assert out.endswith(b"\x1a\x02md\xc2\x3e\x00")
    assert decode_flight_data(out).data_body is not None and len(decode_flight_data(out).data_body) == 0
    # the EncodedBatch helper writes the same bytes
    assert enc.flight_data(b"md") == out


def test_schema_header_gets_no_body_field_unless_forced():
    header = schema_message(pa.schema([pa.field("a", pa.int32())]))
    out = encode_flight_data(header)
    assert b"\xc2\x3e" not in out[-3:]
    assert decode_flight_data(out).data_body is None
    assert encode_flight_data(header, force_body=True).endswith(b"\xc2\x3e\x00")
    assert encode_flight_data(header, body=b"").endswith(b"\xc2\x3e\x00")


def test_garbage_header_does_not_trigger_a_body():
    assert decode_flight_data(encode_flight_data(b"\xff" * 3)).data_body is None
    assert decode_flight_data(encode_flight_data(b"\x00" * 40)).data_body is None


def test_body_parts_equal_a_joined_body():
    parts = [b"abc", memoryview(b"defgh"), bytearray(b"\x00" * 300)]
    joined = b"".join(bytes(p) for p in parts)
    assert encode_flight_data(HEADER, body_parts=parts) == encode_flight_data(HEADER, body=joined)
    fd = decode_flight_data(encode_flight_data(HEADER, body_parts=parts))
    assert bytes(fd.data_body) == joined
    with pytest.raises(ValueError):
        encode_flight_data(HEADER, body=b"x", body_parts=[b"y"])


def test_decode_accepts_any_order_skips_unknown_fields_and_is_zero_copy():
    unknown = (b"\x20" + encode_varint(300)  # field 4 varint
               + b"\x29" + b"\x01" * 8  # field 5 fixed64
               + b"\x35" + b"\x02" * 4  # field 6 fixed32
               + b"\xca\x3e\x03xyz")  # field 1001 bytes
    body = b"\xc2\x3e\x04BODY"
    meta = b"\x1a\x02md"
    head = b"\x12\x03hdr"
    desc = FlightDescriptor.for_path("scope", "t").to_bytes()
    buf = bytearray(body + unknown + meta + b"\x0a" + bytes([len(desc)]) + desc + head)
    fd = decode_flight_data(buf)
    assert fd.data_header == b"hdr"
    assert fd.app_metadata == b"md"
    assert fd.descriptor == FlightDescriptor(DESCRIPTOR_PATH, b"", ["scope", "t"])
    assert bytes(fd.data_body) == b"BODY"
    assert isinstance(fd.data_body, memoryview) and fd.data_body.obj is buf  # a view of the input
    buf[3] = ord("b")
    assert bytes(fd.data_body) == b"bODY"


def test_repeated_fields_last_one_wins():
    fd = decode_flight_data(b"\x12\x01a\x12\x01b\x1a\x00")
    assert fd.data_header == b"b" and fd.app_metadata == b""


def test_dataclass_round_trip():
    fd = FlightData(FlightDescriptor.for_command(b"cmd"), HEADER, b"m", b"body")
    again = decode_flight_data(fd.to_bytes())
    assert again.descriptor == fd.descriptor
    assert (again.data_header, again.app_metadata, bytes(again.data_body)) == (HEADER, b"m", b"body")


@pytest.mark.parametrize("bad, what", [
    (b"\x12\x05abc", "runs past the end"),
    (b"\x12", "truncated varint"),
    (b"\x12" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x02\x00", "field number 0"),
    (b"\x13\x00", "wire type 3"),
    (b"\x17", "wire type 7"),
    (b"\x10\x01", "expected length-delimited"),  # data_header as a varint
    (b"\x21\x01\x02", "truncated fixed64"),
    (b"\x25\x01", "truncated fixed32"),
    (b"\x0a\x02\x08", "runs past the end"),
    (b"\x0a\x02\x1a\x01", "runs past the end"),  # path element longer than the descriptor
    (b"\x0a\x03\x1a\x01\xff", "UTF-8"),
    (b"\x0a\x02\x0a\x00", "expected varint"),
])
def test_malformed_protobuf_raises_protocol_error(bad, what):
    with pytest.raises(ProtocolError, match=what):
        decode_flight_data(bad)


def test_non_bytes_input_raises_protocol_error():
    with pytest.raises(ProtocolError):
        decode_flight_data(12345)


@pytest.mark.parametrize("desc", [
    FlightDescriptor.for_path("scope", "static_mixed"),
    FlightDescriptor.for_path("export", "12"),
    FlightDescriptor.for_path("app", "é", "field", ""),
    FlightDescriptor.for_command(b"dphn"),
    FlightDescriptor.for_command(bytes(range(256))),
])
def test_descriptor_matches_protobuf_encoding(desc):
    if desc.type == DESCRIPTOR_PATH:
        ref = flight.FlightDescriptor.for_path(*desc.path).serialize()
    else:
        ref = flight.FlightDescriptor.for_command(desc.cmd).serialize()
    assert desc.to_bytes() == ref
    assert FlightDescriptor.from_bytes(ref) == desc
    assert FlightDescriptor.from_bytes(ref).is_path == (desc.type == DESCRIPTOR_PATH)
    assert FlightDescriptor.from_bytes(ref).is_command == (desc.type == DESCRIPTOR_CMD)


@settings(max_examples=200, deadline=None)
@given(header=st.binary(max_size=300), md=st.none() | st.binary(max_size=300),
       body=st.none() | st.binary(max_size=3000),
       path=st.none() | st.lists(st.text(max_size=20), max_size=4))
def test_round_trip_property(header, md, body, path):
    desc = None if path is None else FlightDescriptor.for_path(*path)
    out = encode_flight_data(header, md, body, desc)
    fd = decode_flight_data(out)
    assert fd.data_header == header
    assert fd.app_metadata == md
    assert fd.descriptor == desc
    if body is not None:
        assert bytes(fd.data_body) == body
    assert len(out) == flight_data_size(len(header), None if fd.data_body is None else len(fd.data_body),
                                        None if md is None else len(md),
                                        None if desc is None else len(desc.to_bytes()))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_error(data):
    try:
        decode_flight_data(data)
    except ProtocolError:
        pass


# ----------------------------------------------------------------------------------------------
# golden captures
# ----------------------------------------------------------------------------------------------

pytestmark_golden = pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")


@pytestmark_golden
def test_every_golden_flight_data_reencodes_byte_identically():
    seen = batches_without_body_arg = 0
    for _path, _opts, _client_md, server in flight_streams():
        for rec in server:
            fd = decode_flight_data(rec.payload)
            body = None if fd.data_body is None else bytes(fd.data_body)
            assert encode_flight_data(fd.data_header, fd.app_metadata, body, fd.descriptor) == rec.payload
            if not body:
                # batches with an empty body and schema messages come out right without saying which is which
                assert encode_flight_data(fd.data_header, fd.app_metadata, descriptor=fd.descriptor) == rec.payload
                batches_without_body_arg += 1
            seen += 1
    assert seen >= 170 and batches_without_body_arg > 20


@pytestmark_golden
def test_golden_client_messages_with_descriptors():
    cmds = 0
    for path in captures("FlightService_DoExchange"):
        for rec in read_cap(path):
            if rec.direction != "C":
                continue
            fd = decode_flight_data(rec.payload)
            if fd.descriptor is not None:
                assert fd.descriptor == FlightDescriptor.for_command(b"dphn")
                cmds += 1
            body = None if fd.data_body is None else bytes(fd.data_body)
            assert encode_flight_data(fd.data_header, fd.app_metadata, body, fd.descriptor) == rec.payload
    assert cmds >= 5
    paths = []
    for path in captures("FlightService_GetFlightInfo") + captures("FlightService_GetSchema"):
        for rec in read_cap(path):
            if rec.direction == "C":
                d = FlightDescriptor.from_bytes(rec.payload)
                assert d.to_bytes() == rec.payload
                paths.append(d.path)
    assert ["scope", "static_mixed"] in paths and ["scope", "blink"] in paths


@pytestmark_golden
def test_fuzzed_golden_payloads_raise_only_protocol_error():
    rng = random.Random(7)
    payloads = [r.payload for _p, _o, _c, server in flight_streams() for r in server][:40]
    for payload in payloads:
        for _ in range(25):
            b = bytearray(payload)
            mode = rng.randrange(3)
            if mode == 0:
                b = b[: rng.randrange(len(b) + 1)]
            elif mode == 1 and b:
                for _ in range(rng.randrange(1, 4)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            else:
                b[:0] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
            try:
                decode_flight_data(bytes(b))
            except ProtocolError:
                pass
