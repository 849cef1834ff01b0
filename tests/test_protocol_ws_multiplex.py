"""The `grpc-websockets-multiplex` framing: reassembly, the server's encoders, malformed input, a
replay of real browser traffic and a bounded fuzz run."""
from __future__ import annotations

import json
import random
import struct
import time

import pytest

from tests.golden import GOLDEN, read_cap
from tickwire.errors import ProtocolError
from tickwire.protocol.ws_multiplex import (
    CLOSE_BIT,
    GO_AWAY_STREAM_ID,
    ClientConnection,
    GoAwayAcknowledged,
    GoAwayReceived,
    HalfClosed,
    MessageReceived,
    ResponseEnded,
    ResponseMessage,
    ResponseStarted,
    ServerConnection,
    StreamClosedByClient,
    StreamOpened,
    close_reason,
    sanitize_grpc_message,
)

PATH = "/io.deephaven.proto.backplane.grpc.TableService/FetchTable"
HEADERS = [("authorization", "Anonymous"), ("content-type", "application/grpc-web+proto"), ("x-grpc-web", "1")]


def sid(n: int, close: bool = False) -> bytes:
    return struct.pack(">I", n | (CLOSE_BIT if close else 0))


def frame(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def opened(conn: ServerConnection, n: int = 0, path: str = PATH) -> None:
    _, msg = ClientConnection().open_stream(path, HEADERS, stream_id=n)
    [ev] = conn.receive(msg)
    assert ev == StreamOpened(n, path, tuple(HEADERS) + (("grpc-websockets-path", path),))


def feed(conn: ServerConnection, messages) -> list:
    out = []
    for m in messages:
        out += conn.receive(m)
    return out


# ---------------------------------------------------------------------------------- reassembly

def test_open_message_and_half_close_as_the_js_api_sends_them():
    server, client = ServerConnection(), ClientConnection()
    s, hdr = client.open_stream(PATH, HEADERS)
    [ev] = server.receive(hdr)
    assert ev.path == PATH and ev.get("authorization") == "Anonymous" and ev.get("Missing") is None
    msgs = client.send_message(s, b"hello") + client.send_message(s, b"") + [client.half_close(s)]
    assert [len(m) for m in msgs] == [10, 10, 10, 5]
    assert feed(server, msgs) == [MessageReceived(s, b"hello"), MessageReceived(s, b""), HalfClosed(s),
                                  StreamClosedByClient(s)]


def test_path_without_leading_slash_is_normalised():
    server = ServerConnection()
    [ev] = server.receive(sid(3) + b"grpc-websockets-path: a.b.C/D\r\n")
    assert ev == StreamOpened(3, "/a.b.C/D", (("grpc-websockets-path", "a.b.C/D"),))


@pytest.mark.parametrize("payloads", [[b"x" * 300, b"", b"abc"], [b"\x00" * 5, b"\x01\x02"]])
def test_split_one_byte_at_a_time(payloads):
    server = ServerConnection()
    opened(server)
    stream = b"".join(frame(p) for p in payloads)
    events = feed(server, [sid(0) + b"\x00" + stream[i:i + 1] for i in range(len(stream))])
    assert events == [MessageReceived(0, p) for p in payloads]
    assert server.buffered_bytes(0) == 0


def test_prefix_and_body_in_separate_messages_and_several_frames_in_one():
    server = ServerConnection()
    opened(server)
    data = frame(b"one") + frame(b"two") + frame(b"three")
    assert feed(server, [sid(0) + b"\x00" + data[:5], sid(0) + b"\x00" + data[5:17]]) == [
        MessageReceived(0, b"one"), MessageReceived(0, b"two")]
    assert server.buffered_bytes(0) == 1
    assert server.receive(sid(0) + b"\x00" + data[17:]) == [MessageReceived(0, b"three")]


def test_random_split_points_reassemble():
    rnd = random.Random(7)
    for _ in range(50):
        payloads = [rnd.randbytes(rnd.randrange(0, 40)) for _ in range(rnd.randrange(1, 6))]
        stream = b"".join(frame(p) for p in payloads)
        cuts = sorted(rnd.sample(range(1, len(stream)), min(len(stream) - 1, rnd.randrange(0, 8))))
        pieces = [stream[a:b] for a, b in zip([0] + cuts, cuts + [len(stream)])]
        server = ServerConnection()
        opened(server)
        assert feed(server, [sid(0) + b"\x00" + p for p in pieces]) == [MessageReceived(0, p) for p in payloads]


def test_interleaved_streams():
    server, client = ServerConnection(), ClientConnection()
    a, ha = client.open_stream(PATH, HEADERS)
    b, hb = client.open_stream("/arrow.flight.protocol.FlightService/DoExchange", HEADERS)
    assert (a, b) == (0, 1)
    fa, fb = frame(b"A" * 20), frame(b"B" * 30)
    msgs = [ha, hb, sid(a) + b"\x00" + fa[:3], sid(b) + b"\x00" + fb[:7], sid(a) + b"\x00" + fa[3:],
            client.half_close(a), sid(b) + b"\x00" + fb[7:]]
    events = feed(server, msgs)
    assert [type(e).__name__ for e in events] == ["StreamOpened", "StreamOpened", "MessageReceived",
                                                  "HalfClosed", "StreamClosedByClient", "MessageReceived"]
    assert events[2] == MessageReceived(a, b"A" * 20) and events[5] == MessageReceived(b, b"B" * 30)
    assert server.open_streams == {a, b}


def test_close_bit_alone_and_with_data():
    server = ServerConnection()
    opened(server, 0)
    opened(server, 1)
    assert server.receive(sid(0, close=True)) == [StreamClosedByClient(0)]
    assert server.receive(sid(1, close=True) + b"\x00" + frame(b"last")) == [
        MessageReceived(1, b"last"), StreamClosedByClient(1)]
    # closed by the client, still open until the server ends it
    assert server.open_streams == {0, 1}
    server.end_stream(0, 0)
    server.end_stream(1, 0)
    assert server.open_streams == frozenset()
    assert server.receive(sid(0, close=True)) == []  # late message for an ended stream: dropped


# ----------------------------------------------------------------------------------- encoders

def test_server_encoders_and_client_decoder():
    server, client = ServerConnection(), ClientConnection()
    s, hdr = client.open_stream(PATH, HEADERS)
    server.receive(hdr)
    start = server.start_response(s, [("content-type", "application/grpc-web+proto")])
    assert start == sid(s) + b"\x80" + struct.pack(">I", 42) + b"content-type: application/grpc-web+proto\r\n"
    msg = server.send_message(s, b"payload")
    assert msg == sid(s) + b"\x00\x00\x00\x00\x07payload"
    end = server.end_stream(s, "NOT_FOUND", "no 100% match\n\u00e9", [("x-extra", "1")])
    block = b"grpc-status: 5\r\ngrpc-message: no 100 percent match ?\r\nx-extra: 1\r\n"
    assert end == sid(s, close=True) + b"\x80" + struct.pack(">I", len(block)) + block
    events = feed(client, [start, msg, end])
    assert events == [ResponseStarted(s, (("content-type", "application/grpc-web+proto"),)),
                      ResponseMessage(s, b"payload"),
                      ResponseEnded(s, 5, "no 100 percent match ?", (("x-extra", "1"),))]


def test_ok_trailers_have_no_grpc_message_and_trailers_only_answers():
    server, client = ServerConnection(), ClientConnection()
    s, hdr = client.open_stream(PATH)
    server.receive(hdr)
    end = server.end_stream(s, 0)
    assert end == sid(s, close=True) + b"\x80\x00\x00\x00\x10grpc-status: 0\r\n"
    assert len(end) == 25  # as Deephaven's OK trailers in the browser captures
    assert client.receive(end) == [ResponseEnded(s, 0, "", ())]


def test_sanitize_grpc_message():
    """What Deephaven's JS API can read in a trailer: printable ASCII, no ':' (its trailer parser
    splits each line on every ':'), no '%' (it fails on a percent-encoded message); the meaning kept."""
    cases = {
        "Filter: condition 'invoke' is not supported": "Filter - condition 'invoke' is not supported",
        "Method not found: /io.deephaven.proto.backplane.grpc.HierarchicalTableService/Rollup":
            "Method not found - /io.deephaven.proto.backplane.grpc.HierarchicalTableService/Rollup",
        "internal error: KeyError: 'x'": "internal error - KeyError - 'x'",
        "no 100% match": "no 100 percent match",
        "a%b\tc\u2603d~": "a percent b c?d~",
        "line one\r\nline two": "line one line two",
        "ends with a colon:": "ends with a colon -",
        "a::b": "a - b",
        "plain message, already safe (1 < 2)": "plain message, already safe (1 < 2)",
    }
    for message, want in cases.items():
        got = sanitize_grpc_message(message)
        assert got == want, (message, got)
        assert ":" not in got and "%" not in got and all(" " <= c <= "~" for c in got)
        assert sanitize_grpc_message(got) == got
    # in a trailer: exactly one ':' on the grpc-message line, the one after its name
    server, client = ServerConnection(), ClientConnection()
    s, hdr = client.open_stream(PATH)
    server.receive(hdr)
    end = server.end_stream(s, "UNIMPLEMENTED", "Filter: condition 'invoke' is not supported")
    lines = end[9:].split(b"\r\n")
    assert lines[1] == b"grpc-message: Filter - condition 'invoke' is not supported"
    assert all(line.count(b":") == 1 for line in lines if line)


def test_go_away_round_trip():
    server, client = ServerConnection(), ClientConnection()
    ga = server.go_away()
    assert ga == struct.pack(">I", GO_AWAY_STREAM_ID)
    assert client.receive(ga) == [GoAwayReceived()]
    ack = client.acknowledge_go_away()
    assert ack == b"\xff\xff\xff\xff"
    assert server.receive(ack) == [GoAwayAcknowledged()]
    assert server.receive(ack) == []


def test_encoder_misuse_is_a_protocol_error():
    server = ServerConnection()
    with pytest.raises(ProtocolError):
        server.send_message(4, b"")  # never opened
    opened(server)
    with pytest.raises(ProtocolError):
        server.end_stream(0, 99)
    with pytest.raises(ProtocolError):
        server.start_response(0, [("bad name", "x")])
    with pytest.raises(ProtocolError):
        server.start_response(0, [("x", "line\r\nbreak")])


# ---------------------------------------------------------------------------- malformed input

def _opened_server(**kw) -> ServerConnection:
    server = ServerConnection(**kw)
    opened(server)
    return server


MALFORMED = {
    "truncated stream id": ([b"\x00\x00"], "INVALID_ARGUMENT"),
    "empty message": ([b""], "INVALID_ARGUMENT"),
    "no control byte": ([sid(0)], "INVALID_ARGUMENT"),
    "control byte 2": ([sid(0) + b"\x02"], "INVALID_ARGUMENT"),
    "control byte 0xff": ([sid(0) + b"\xff" + frame(b"x")], "INVALID_ARGUMENT"),
    "half-close with bytes": ([sid(0) + b"\x01\x00"], "INVALID_ARGUMENT"),
    "half-close twice": ([sid(0) + b"\x01", sid(0) + b"\x01"], "INVALID_ARGUMENT"),
    "data after half-close": ([sid(0) + b"\x01", sid(0) + b"\x00" + frame(b"x")], "INVALID_ARGUMENT"),
    "message after client close": ([sid(0, True), sid(0) + b"\x00"], "INVALID_ARGUMENT"),
    "half-close inside a frame": ([sid(0) + b"\x00\x00\x00\x00", sid(0, True) + b"\x01"], "INVALID_ARGUMENT"),
    "close inside a frame": ([sid(0) + b"\x00" + frame(b"abc")[:6], sid(0, True)], "INVALID_ARGUMENT"),
    "data for a stream never opened": ([sid(9) + b"\x00" + frame(b"x")], "INVALID_ARGUMENT"),
    "half-close for a stream never opened": ([sid(9) + b"\x01"], "INVALID_ARGUMENT"),
    "close of a stream never opened": ([sid(9, True)], "INVALID_ARGUMENT"),
    "headers not ASCII": ([sid(9) + "grpc-websockets-path: a.B/C\r\nx: \u00e9\r\n".encode()], "INVALID_ARGUMENT"),
    "headers without path": ([sid(9) + b"authorization: Anonymous\r\n"], "INVALID_ARGUMENT"),
    "headers with two paths": ([sid(9) + b"grpc-websockets-path: a.B/C\r\ngrpc-websockets-path: a.B/D\r\n"],
                               "INVALID_ARGUMENT"),
    "path not a method": ([sid(9) + b"grpc-websockets-path: ../etc/passwd\r\n"], "INVALID_ARGUMENT"),
    "header line without colon": ([sid(9) + b"grpc-websockets-path: a.B/C\r\nnonsense\r\n"], "INVALID_ARGUMENT"),
    "header with control char": ([sid(9) + b"grpc-websockets-path: a.B/C\r\nx: a\x00b\r\n"], "INVALID_ARGUMENT"),
    "compressed frame": ([sid(0) + b"\x00" + frame(b"x", flag=1)], "UNIMPLEMENTED"),
    "frame flag 0x80 from the client": ([sid(0) + b"\x00" + frame(b"x", flag=0x80)], "INVALID_ARGUMENT"),
    "message over the limit": ([sid(0) + b"\x00" + struct.pack(">BI", 0, 1025)], "RESOURCE_EXHAUSTED"),
    "header block over the limit": ([sid(9) + b"grpc-websockets-path: a.B/C\r\nx: " + b"y" * 600 + b"\r\n"],
                                    "RESOURCE_EXHAUSTED"),
    "too many streams": ([sid(n) + b"grpc-websockets-path: a.B/C\r\n" for n in range(1, 5)], "RESOURCE_EXHAUSTED"),
    "go-away id without close bit": ([sid(GO_AWAY_STREAM_ID)], "INVALID_ARGUMENT"),
    "go-away acknowledged but never sent": ([sid(GO_AWAY_STREAM_ID, True)], "INVALID_ARGUMENT"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_raises_protocol_error(case):
    messages, code = MALFORMED[case]
    server = _opened_server(max_message_size=1024, max_streams=4, max_header_bytes=512)
    with pytest.raises(ProtocolError) as info:
        feed(server, messages)
    assert info.value.code == code
    close_code, reason = close_reason(info.value)
    assert close_code == (1009 if code == "RESOURCE_EXHAUSTED" else 1002)
    assert len(reason.encode()) <= 123 and reason.isascii()
    # the connection stays failed: the framing cannot be resynchronised
    with pytest.raises(ProtocolError):
        server.receive(sid(0) + b"\x00")
    assert server.open_streams == frozenset()


def test_non_bytes_message_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        ServerConnection().receive("text frame")  # type: ignore[arg-type]


def test_buffered_bytes_stay_bounded():
    server = _opened_server(max_message_size=100)
    server.receive(sid(0) + b"\x00" + struct.pack(">BI", 0, 100) + b"x" * 99)
    assert server.buffered_bytes(0) == 104
    with pytest.raises(ProtocolError):
        _opened_server(max_message_size=100).receive(sid(0) + b"\x00" + struct.pack(">BI", 0, 101))


# ------------------------------------------------------------------------ browser traffic replay

BROWSER_DIRS = [d for d in (GOLDEN / "browser_dh_direct", GOLDEN / "browser_dh_widget")
                if (d / "frames.jsonl").exists()]


def _rebuild(folder):
    """Each client-to-server websocket message of the capture, per websocket connection: the
    headers from index.json, the gRPC-framed requests of the .cap files cut where frames.jsonl
    cuts them, half-closes as control byte 1. The captures keep the gRPC messages, not the raw
    websocket bytes; each rebuilt message has the stream id, close bit and length frames.jsonl
    lists."""
    calls = json.loads((folder / "index.json").read_text())
    by_key = {(c["ws_conn"], c["ws_stream_id"]): c for c in calls}
    streams = {}
    for key, c in by_key.items():
        records = [r.payload for r in read_cap(folder / c["file"]) if r.direction == "C"]
        streams[key] = bytearray(b"".join(frame(p) for p in records))
    conns: dict[str, list[bytes]] = {}
    for line in (folder / "frames.jsonl").read_text().splitlines():
        f = json.loads(line)
        if f["dir"] != "C":
            continue
        key = (f["conn"], f["sid"])
        head = sid(f["sid"], f["close"])
        if f["kind"] == "REQ-HEADERS":
            msg = head + "".join(f"{k}: {v}\r\n" for k, v in by_key[key]["request_metadata"]).encode("ascii")
        elif f["kind"] == "REQ-DATA":
            n = f["len"] - 5
            msg = head + b"\x00" + bytes(streams[key][:n])
            del streams[key][:n]
        elif f["kind"] == "HALF-CLOSE":
            msg = head + b"\x01"
        else:
            raise AssertionError(f["kind"])
        assert len(msg) == f["len"], f
        conns.setdefault(f["conn"], []).append(msg)
    assert all(not rest for rest in streams.values())
    return calls, conns


@pytest.mark.parametrize("folder", BROWSER_DIRS, ids=lambda d: d.name)
def test_replay_of_browser_traffic(folder):
    calls, conns = _rebuild(folder)
    paths, messages, half_closed = [], {}, set()
    for conn_id, msgs in conns.items():
        server = ServerConnection()
        for m in msgs:
            for ev in server.receive(m):
                key = (conn_id, ev.stream_id)
                if isinstance(ev, StreamOpened):
                    paths.append(ev.path)
                    messages[key] = []
                elif isinstance(ev, MessageReceived):
                    messages[key].append(ev.payload)
                elif isinstance(ev, HalfClosed):
                    half_closed.add(key)
    assert paths == [c["method"] for c in calls]
    for c in calls:
        key = (c["ws_conn"], c["ws_stream_id"])
        assert messages[key] == [r.payload for r in read_cap(folder / c["file"]) if r.direction == "C"]
        assert (key in half_closed) == c["client_half_closed"]


@pytest.mark.parametrize("folder", BROWSER_DIRS, ids=lambda d: d.name)
def test_server_encoders_match_the_lengths_deephaven_sent(folder):
    """Rebuilt with the encoders, every header and trailer message has the length Deephaven's had,
    and the client decoder reassembles every reply message from Deephaven's split points."""
    calls = json.loads((folder / "index.json").read_text())
    by_key = {(c["ws_conn"], c["ws_stream_id"]): c for c in calls}
    replies = {k: [r.payload for r in read_cap(folder / c["file"]) if r.direction == "S"] for k, c in by_key.items()}
    # Deephaven too sends a frame's prefix and body apart at times: cut the framed replies where it did
    pending = {k: bytearray(b"".join(frame(p) for p in v)) for k, v in replies.items()}
    received = {k: [] for k in replies}
    servers: dict[str, ServerConnection] = {}
    client = {}
    checked = 0
    for line in (folder / "frames.jsonl").read_text().splitlines():
        f = json.loads(line)
        key = (f["conn"], f["sid"])
        server = servers.setdefault(f["conn"], ServerConnection())
        cl = client.setdefault(f["conn"], ClientConnection())
        c = by_key[key]
        if f["kind"] == "REQ-HEADERS":
            _, msg = cl.open_stream(c["method"], stream_id=f["sid"])
            server.receive(msg)
            continue
        if f["dir"] == "C":
            continue
        if f["kind"] == "RESP-HEADERS":
            msg = server.start_response(f["sid"], c["response_initial_metadata"])
        elif f["kind"] == "RESP-DATA":
            n = f["len"] - 4
            msg = sid(f["sid"]) + bytes(pending[key][:n])
            del pending[key][:n]
        elif f["kind"] == "TRAILERS":
            extra = [(k, v) for k, v in c["response_trailing_metadata"] if k not in ("grpc-status", "grpc-message")]
            msg = server.end_stream(f["sid"], int(f["status"]), f.get("message", ""), extra)
        else:
            raise AssertionError(f["kind"])
        assert len(msg) == f["len"], f
        assert f["close"] == bool(msg[0] & 0x80)
        events = cl.receive(msg)
        received[key] += [e.payload for e in events if isinstance(e, ResponseMessage)]
        if f["kind"] == "TRAILERS":
            assert events[-1].status == int(f["status"])
            assert events[-1].message == f.get("message", "")
        checked += 1
    assert checked
    assert all(not rest for rest in pending.values())
    assert received == replies


# ----------------------------------------------------------------------------------------- fuzz

def _valid_session(rnd: random.Random) -> list[bytes]:
    client = ClientConnection()
    out = []
    ids = []
    for _ in range(rnd.randrange(1, 4)):
        s, hdr = client.open_stream(PATH, HEADERS)
        ids.append(s)
        out.append(hdr)
    for _ in range(rnd.randrange(0, 6)):
        s = rnd.choice(ids)
        out += client.send_message(s, rnd.randbytes(rnd.randrange(0, 30)), split=rnd.random() < 0.5)
    for s in ids:
        if rnd.random() < 0.7:
            out.append(client.half_close(s))
    return out


def _mutate(rnd: random.Random, msgs: list[bytes]) -> list[bytes]:
    msgs = list(msgs)
    for _ in range(rnd.randrange(1, 4)):
        if not msgs:
            msgs.append(rnd.randbytes(rnd.randrange(0, 12)))
            continue
        i = rnd.randrange(len(msgs))
        m = bytearray(msgs[i])
        op = rnd.randrange(6)
        if op == 0 and m:
            m[rnd.randrange(len(m))] = rnd.randrange(256)
        elif op == 1:
            m = m[:rnd.randrange(len(m) + 1)]
        elif op == 2:
            m += rnd.randbytes(rnd.randrange(1, 8))
        elif op == 3:
            msgs.insert(rnd.randrange(len(msgs) + 1), bytes(m))
        elif op == 4:
            del msgs[i]
            continue
        else:
            msgs.insert(i, rnd.randbytes(rnd.randrange(0, 16)))
        msgs[i] = bytes(m)
    return msgs


def test_fuzz_only_protocol_errors():
    rnd = random.Random(20240614)
    deadline = time.monotonic() + 10
    runs = errors = 0
    while runs < 20000 and time.monotonic() < deadline:
        runs += 1
        if rnd.random() < 0.2:
            msgs = [rnd.randbytes(rnd.randrange(0, 24)) for _ in range(rnd.randrange(1, 6))]
        else:
            msgs = _mutate(rnd, _valid_session(rnd))
        server = ServerConnection(max_message_size=64, max_streams=3, max_header_bytes=256)
        try:
            for m in msgs:
                for ev in server.receive(m):
                    assert isinstance(ev, (StreamOpened, MessageReceived, HalfClosed, StreamClosedByClient,
                                           GoAwayAcknowledged))
                for s in server.open_streams:
                    assert server.buffered_bytes(s) <= 64 + 5
                assert len(server.open_streams) <= 3
        except ProtocolError:
            errors += 1
    assert runs > 100 and 0 < errors < runs


def test_fuzz_client_decoder_only_protocol_errors():
    rnd = random.Random(99)
    deadline = time.monotonic() + 4
    runs = 0
    while runs < 5000 and time.monotonic() < deadline:
        runs += 1
        client = ClientConnection(max_message_size=64)
        for n in range(3):
            client.open_stream(PATH, stream_id=n)
        server = ServerConnection()
        good = []
        for n in range(3):
            server.receive(ClientConnection().open_stream(PATH, stream_id=n)[1])
            good += [server.start_response(n, [("a", "b")]), server.send_message(n, rnd.randbytes(10)),
                     server.end_stream(n, rnd.randrange(17), "m")]
        try:
            for m in _mutate(rnd, good):
                client.receive(m)
        except ProtocolError:
            pass
