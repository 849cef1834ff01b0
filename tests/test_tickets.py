import pytest

from tickwire.errors import ProtocolError
from tickwire.protocol.tickets import (
    AppTicket,
    ExportTicket,
    ScopeTicket,
    SharedTicket,
    TicketError,
    parse_ticket,
    ticket_from_path,
)


@pytest.mark.parametrize(
    "raw,expected",
    [
        (b"s/static_mixed", ScopeTicket("static_mixed")),
        (bytes.fromhex("6501000000"), ExportTicket(1)),
        (bytes.fromhex("65ffffffff"), ExportTicket(-1)),
        (b"a/app1/f/trades", AppTicket("app1", "trades")),
        (b"h\x01\x02", SharedTicket(b"\x01\x02")),
    ],
)
def test_round_trip(raw, expected):
    t = parse_ticket(raw)
    assert t == expected
    assert t.to_bytes() == raw
    assert ticket_from_path(t.to_path()) == t


def test_golden_export_ticket_bytes():
    # the Java client's first export (barrage_java/0002): result_id ticket "e\x01\x00\x00\x00"
    assert ExportTicket(1).to_bytes() == b"e\x01\x00\x00\x00"
    assert ExportTicket(1).to_path() == ["export", "1"]


@pytest.mark.parametrize(
    "raw,code,words",
    [
        (b"", "FAILED_PRECONDITION", "not supplied"),
        (b"s", "FAILED_PRECONDITION", "s/<name>"),
        (b"sx", "FAILED_PRECONDITION", "s/<name>"),
        (b"e\x01\x00", "FAILED_PRECONDITION", "4-byte"),
        (b"e\x00\x00\x00\x00", "INVALID_ARGUMENT", "export id 0"),
        (b"zzz", "FAILED_PRECONDITION", "no resolver for route 'z'"),
        (b"a/x/y", "FAILED_PRECONDITION", "a/<app>/f/<field>"),
        (b"s/\xff\xfe", "INVALID_ARGUMENT", "UTF-8"),
    ],
)
def test_bad_tickets(raw, code, words):
    with pytest.raises(TicketError, match=words) as info:
        parse_ticket(raw)
    assert info.value.code == code
    assert isinstance(info.value, ProtocolError)


@pytest.mark.parametrize(
    "path,words",
    [([], "empty"), (["scope"], "scope"), (["export", "x"], "decimal"), (["export", "0"], "invalid"),
     (["nope", "a"], "no resolver"), (["shared", "zz"], "hex")],
)
def test_bad_paths(path, words):
    with pytest.raises(TicketError, match=words):
        ticket_from_path(path)
