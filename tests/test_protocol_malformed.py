"""Malformed input to the sans-I/O decoders: always ProtocolError, with a message that is short and
printable, since a server sends it back to the client as the status detail."""
from __future__ import annotations

import pytest

from tickwire.protocol.errors import ProtocolError
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
