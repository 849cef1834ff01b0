"""Malformed input to the sans-I/O decoders: always ProtocolError, with a message that is short and
printable, since a server sends it back to the client as the status detail."""
from __future__ import annotations

import pytest

from tickwire.errors import ProtocolError
from tickwire.protocol.tickets import TicketError, parse_ticket, ticket_from_path


def _refused(fn, arg) -> str:
    with pytest.raises(ProtocolError) as e:
        fn(arg)
    msg = str(e.value)
    assert msg.isprintable() and len(msg) < 300, msg
    return msg


@pytest.mark.parametrize("ticket", [b"\x9a\xb6\xcd", b"\x00", b"\x7f", b"\xff" * 40, b" x"])
def test_unroutable_ticket_message_shows_the_byte_in_hex_only(ticket):
    msg = _refused(parse_ticket, ticket)
    assert f"(0x{ticket[0]:02x})" in msg and "'" not in msg.split("ticket 0x")[0]
    assert msg.endswith("...") == (len(ticket) > 16)


def test_unroutable_printable_route_is_still_named():
    assert "no resolver for route 'z' (0x7a)" in _refused(parse_ticket, b"zzz")


@pytest.mark.parametrize("ticket", [b"a/" + b"x" * 10_000, "a/\u202e\u0007".encode() + b"y" * 5000, b"s\x00"])
def test_long_or_odd_tickets_are_cut_in_the_message(ticket):
    with pytest.raises(TicketError) as e:
        parse_ticket(ticket)
    assert e.value.code == "FAILED_PRECONDITION"
    _refused(parse_ticket, ticket)


@pytest.mark.parametrize("path", [["scope", "a" * 5000, "b"], ["export", "9" * 3000 + "x"], ["app", "\x00" * 900],
                                  ["shared", "zz" * 2000], ["\u0007" * 1000], ["export", "1", "\x1b[31m" * 300]])
def test_long_or_odd_descriptor_paths_are_cut_in_the_message(path):
    _refused(ticket_from_path, path)


@pytest.mark.parametrize("ticket", [b"s/bli\x00\x00", b"s/x\x1b[31m", "s/\u202eevil".encode(), b"a/app\x00/f/x",
                                    b"a/app/f/\x07"])
def test_names_with_unprintable_characters_are_invalid(ticket):
    with pytest.raises(TicketError) as e:
        parse_ticket(ticket)
    assert e.value.code == "INVALID_ARGUMENT" and "unprintable" in str(e.value)
    _refused(parse_ticket, ticket)


@pytest.mark.parametrize("path", [["scope", "t\x00"], ["app", "\x01", "field", "f"], ["app", "a", "field", "\u2028"]])
def test_descriptor_names_with_unprintable_characters_are_invalid(path):
    with pytest.raises(TicketError) as e:
        ticket_from_path(path)
    assert e.value.code == "INVALID_ARGUMENT" and "unprintable" in _refused(ticket_from_path, path)


def test_printable_names_still_route():
    assert parse_ticket("s/é∂ƒ table".encode()).name == "é∂ƒ table"
    assert ticket_from_path(["scope", "a b"]).name == "a b"
    assert parse_ticket(b"a/app/f/x").field == "x"


# -- every decoder, fed mutations of valid input ------------------------------------------------------------------

def _mutations(rng, data: bytes, n: int):
    """`n` seeded mutations of `data`: truncations, bit flips, spliced and overwritten bytes."""
    for _ in range(n):
        b = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 5])):
            kind = rng.randrange(4)
            at = rng.randrange(len(b) + 1)
            if kind == 0:
                del b[at:]
            elif kind == 1 and b:
                b[min(at, len(b) - 1)] ^= 1 << rng.randrange(8)
            elif kind == 2:
                b[at:at] = rng.randbytes(rng.choice([1, 4, 8]))
            else:
                b[at:at + 4] = rng.choice([b"\xff\xff\xff\x7f", b"\x00\x00\x00\x80", b"\xff\xff\xff\xff", b"\0\0\0\0"])
        yield bytes(b)


def _only_protocol_errors(fn, data: bytes) -> None:
    try:
        fn(data)
    except ProtocolError as exc:
        msg = str(exc)
        assert msg.isprintable() and len(msg) < 1000, f"{fn.__name__}({data.hex()}): {msg[:300]!r}"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        raise AssertionError(f"{fn.__name__}({data.hex()}) raised {type(exc).__name__}: {exc}") from exc


def test_decoders_raise_only_protocol_errors_for_mutated_input():
    import random

    import numpy as np
    import pyarrow as pa

    from tickwire.protocol import barrage, batches
    from tickwire.protocol.flight import FlightDescriptor, decode_flight_data, encode_flight_data

    rng = random.Random(20240611)
    requests = [
        barrage.SubscriptionRequest(ticket=b"s/t", columns=np.array([0, 2]), viewport=np.array([[0, 5], [9, 20]]),
                                    options=barrage.SubscriptionOptions(batch_size=5), subscription_token=b"tok"),
        barrage.SnapshotRequest(ticket=b"s/t", columns=np.array([1]), viewport=np.array([[0, 2**40]]),
                                options=barrage.SnapshotOptions(max_message_size=9)),
        barrage.PublicationRequest(ticket=b"e\x01\x00\x00\x00", options=barrage.PublicationOptions(True)),
        barrage.UpdateMetadata(first_seq=1, last_seq=2, added_rows=np.array([[0, 3]]), removed_rows=np.array([[5, 6]]),
                               shift_data=(np.array([1]), np.array([2]), np.array([4])),
                               mod_column_nodes=[np.array([[1, 1]]), None], effective_column_set=np.array([0, 1]),
                               effective_viewport=np.array([[0, 9]]), added_rows_included=np.array([[0, 1]])),
    ]
    for req in requests:
        for data in _mutations(rng, barrage.wrap(req), 300):
            _only_protocol_errors(barrage.unwrap, data)
        for data in _mutations(rng, req.to_bytes(), 300):
            _only_protocol_errors(type(req).from_bytes, data)

    schema = pa.schema([("i", pa.int32()), ("s", pa.string()), ("l", pa.list_(pa.int64())), ("b", pa.bool_()),
                        ("ts", pa.timestamp("ns", "UTC")), ("bin", pa.binary())])
    batch = pa.record_batch([pa.array([1, None, 3], pa.int32()), pa.array(["a", None, "ccc"]),
                             pa.array([[1], [], None], pa.list_(pa.int64())), pa.array([True, False, None]),
                             pa.array([1, 2, 3], pa.timestamp("ns", "UTC")), pa.array([b"x", b"", None])],
                            schema=schema)
    msg = pa.ipc.read_message(batch.serialize())
    header, body = msg.metadata.to_pybytes(), msg.body.to_pybytes()

    def record_batch(h, b=body):
        info = batches.read_message_header(h)
        if info.header_type == batches.HEADER_RECORD_BATCH:
            batches.decode_record_batch(info, b, schema)

    def record_body(b):
        batches.decode_record_batch(batches.read_message_header(header), b, schema)

    record_batch(header)  # the unmutated message decodes
    for data in _mutations(rng, header, 400):
        _only_protocol_errors(record_batch, data)
    for data in _mutations(rng, body, 200):
        _only_protocol_errors(record_body, data)
    flight = encode_flight_data(header, barrage.wrap(requests[0]), body, FlightDescriptor.for_path("scope", "t"))
    for data in _mutations(rng, flight, 400):
        _only_protocol_errors(decode_flight_data, data)


@pytest.mark.parametrize("columns_as_list", [False, True])
def test_record_batch_against_a_schema_with_a_non_utf8_field_name(columns_as_list):
    """pyarrow reads a schema whose names are not UTF-8 (it fails only when a name is read):
    `read_schema_message` refuses it, and decoding a batch against such a schema all the same is a
    ProtocolError, not a UnicodeDecodeError."""
    import pyarrow as pa

    from tickwire.protocol import batches
    from tickwire.protocol.schema import read_schema_message

    field_type = pa.list_(pa.field("a", pa.int64())) if columns_as_list else pa.int64()
    schema = pa.schema([pa.field("a", field_type, nullable=not columns_as_list)])
    header = pa.ipc.read_message(schema.serialize()).metadata.to_pybytes()
    bad_header = header.replace(b"\x01\x00\x00\x00a", b"\x01\x00\x00\x00\xff")
    with pytest.raises(ProtocolError, match="not UTF-8"):
        read_schema_message(bad_header)
    framed = b"\xff\xff\xff\xff" + len(bad_header).to_bytes(4, "little") + bad_header
    bad = pa.ipc.read_schema(pa.py_buffer(framed + b"\0" * (-len(framed) % 8)))
    value = pa.array([[1]], field_type) if columns_as_list else pa.array([1], field_type)
    msg = pa.ipc.read_message(pa.record_batch([value], schema=schema).serialize())
    info = batches.read_message_header(msg.metadata.to_pybytes())
    with pytest.raises(ProtocolError, match="not valid UTF-8"):
        batches.decode_record_batch(info, msg.body.to_pybytes(), bad, columns_as_list=columns_as_list)
