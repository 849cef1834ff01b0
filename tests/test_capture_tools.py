"""The capture proxy (tests/interop/capture.py) and the capture comparison (tests/interop/compare.py).

Everything runs on loopback: a pyarrow.flight server and a tiny raw-bytes grpc echo server behind a
CaptureProxy, and modified copies of the golden captures in tmp_path."""
from __future__ import annotations

import json
import shutil
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.interop.capture import CaptureProxy, write_record
from tests.interop.compare import (
    ALLOWED_DIFFERENCES,
    DEFAULT_ALLOW,
    compare_captures,
    describe_call,
    format_differences,
    load_calls,
    read_records,
)
from tickwire.protocol import barrage
from tickwire.protocol import rowset as rs
from tickwire.protocol.flight import decode_flight_data, encode_flight_data, encode_varint
from tickwire.protocol.proto import flight_pb2
from tickwire.protocol.schema import read_schema_message, schema_message
from tickwire.protocol.update import StreamDecoder, decode_stream, encode_update

from .golden import GOLDEN, golden_dirs

needs_golden = pytest.mark.skipif(not golden_dirs(), reason="golden captures not available")
ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def copy_golden(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(GOLDEN / name, dst)
    for p in dst.iterdir():  # golden files are read-only
        p.chmod(0o644)
    dst.chmod(0o755)
    return dst


def rewrite(cap: Path, records: list) -> None:
    with open(cap, "wb") as fh:
        for r in records:
            write_record(fh, r.direction, r.t_us, r.payload)


def set_payloads(cap: Path, payloads: list[tuple[str, bytes]]) -> None:
    with open(cap, "wb") as fh:
        for i, (d, p) in enumerate(payloads):
            write_record(fh, d, i * 1000, p)


def edit_index(folder: Path, call_id: int, **changes) -> None:
    idx = json.loads((folder / "index.json").read_text())
    for e in idx:
        if e["id"] == call_id:
            e.update(changes)
    (folder / "index.json").write_text(json.dumps(idx))


def texts(diffs) -> str:
    return format_differences(diffs)


def server_payloads(cap: Path) -> list[bytes]:
    return [r.payload for r in read_records(cap) if r.direction == "S"]


def client_records(cap: Path) -> list[tuple[str, bytes]]:
    return [(r.direction, r.payload) for r in read_records(cap) if r.direction == "C"]


def record_batch_without_body(payload: bytes) -> bytes:
    fd = decode_flight_data(payload)
    out = b"\x12" + encode_varint(len(fd.data_header)) + fd.data_header
    if fd.app_metadata is not None:
        out += b"\x1a" + encode_varint(len(fd.app_metadata)) + fd.app_metadata
    return out


# ------------------------------------------------------------------------------------------------
# (a) the proxy
# ------------------------------------------------------------------------------------------------

TABLE = pa.table({"a": pa.array(range(100), pa.int64()), "s": pa.array([f"v{i}" if i % 7 else None
                                                                          for i in range(100)])})


class _Headers(fl.ServerMiddleware):
    def sending_headers(self):
        return {"authorization": "Bearer tok-123"}


class _HeadersFactory(fl.ServerMiddlewareFactory):
    def start_call(self, info, headers):
        return _Headers()


class _Server(fl.FlightServerBase):
    def __init__(self):
        super().__init__("grpc://127.0.0.1:0", middleware={"h": _HeadersFactory()})
        self.put_rows = 0

    def do_get(self, context, ticket):
        if ticket.ticket != b"t":
            raise fl.FlightServerError(f"no such ticket {ticket.ticket!r}")
        return fl.RecordBatchStream(TABLE)

    def list_flights(self, context, criteria):
        for name in ("x", "y"):
            yield fl.FlightInfo(TABLE.schema, fl.FlightDescriptor.for_path(name),
                                [fl.FlightEndpoint(name.encode(), [])], TABLE.num_rows, -1)

    def get_flight_info(self, context, descriptor):
        raise fl.FlightUnauthenticatedError("who are you")

    def do_put(self, context, descriptor, reader, writer):
        self.put_rows += reader.read_all().num_rows

    def do_exchange(self, context, descriptor, reader, writer):
        writer.begin(reader.schema)
        for chunk in reader:
            writer.write_batch(chunk.data)


class _Received(fl.ClientMiddleware):
    def __init__(self, sink):
        self.sink = sink

    def received_headers(self, headers):
        self.sink.append(headers)


class _ReceivedFactory(fl.ClientMiddlewareFactory):
    def __init__(self):
        self.headers = []

    def start_call(self, info):
        return _Received(self.headers)


@pytest.fixture()
def flight_server():
    server = _Server()
    yield server
    server.shutdown()


def test_proxy_records_flight_calls_in_the_golden_format(flight_server, tmp_path):
    out = tmp_path / "cap"
    received = _ReceivedFactory()
    with CaptureProxy(f"127.0.0.1:{flight_server.port}", out) as proxy:
        assert proxy.port > 0 and proxy.target == f"127.0.0.1:{proxy.port}"
        client = fl.connect(f"grpc://{proxy.target}", middleware=[received])
        got = client.do_get(fl.Ticket(b"t"), ANON).read_all()
        infos = list(client.list_flights())
        with pytest.raises(fl.FlightUnauthenticatedError, match="who are you"):
            client.get_flight_info(fl.FlightDescriptor.for_path("x"))
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("p"), TABLE.schema)
        writer.write_table(TABLE, max_chunksize=30)
        writer.close()
        writer, reader = client.do_exchange(fl.FlightDescriptor.for_command(b"echo"))
        writer.begin(TABLE.schema)
        writer.write_table(TABLE.slice(0, 10))
        writer.done_writing()
        echoed = reader.read_all()
        writer.close()
        client.close()
    # the client saw the server's answers through the proxy
    assert got.equals(TABLE)
    assert [i.descriptor.path for i in infos] == [[b"x"], [b"y"]]
    assert flight_server.put_rows == 100
    assert echoed.equals(TABLE.slice(0, 10))
    assert any(h.get("authorization") == ["Bearer tok-123"] for h in received.headers)

    index = json.loads((out / "index.json").read_text())
    golden_keys = set(json.loads((GOLDEN / "flight_doget" / "index.json").read_text())[0]) if golden_dirs() else set()
    assert golden_keys <= set(index[0])
    assert [(e["id"], e["method"].rpartition("/")[2], e["file"], e["status"]) for e in index] == [
        (1, "DoGet", "0001_FlightService_DoGet.cap", "OK"),
        (2, "ListFlights", "0002_FlightService_ListFlights.cap", "OK"),
        (3, "GetFlightInfo", "0003_FlightService_GetFlightInfo.cap", "UNAUTHENTICATED"),
        (4, "DoPut", "0004_FlightService_DoPut.cap", "OK"),
        (5, "DoExchange", "0005_FlightService_DoExchange.cap", "OK"),
    ]
    assert "who are you" in index[2]["details"]
    assert ["authorization", "Anonymous"] in index[0]["request_metadata"]
    assert ["authorization", "Bearer tok-123"] in index[0]["response_initial_metadata"]

    # every file parses back, and its counts agree with the index
    for e in index:
        recs = read_records(out / e["file"])
        assert sum(r.direction == "C" for r in recs) == e["n_client_msgs"]
        assert sum(r.direction == "S" for r in recs) == e["n_server_msgs"]
        assert sum(len(r.payload) for r in recs if r.direction == "S") == e["server_bytes"]
        assert [r.t_us for r in recs] == sorted(r.t_us for r in recs)
    # DoGet: the client's Ticket, then the server's FlightData, which decode to the table
    doget = read_records(out / index[0]["file"])
    assert flight_pb2.Ticket.FromString(doget[0].payload).ticket == b"t"
    schema, updates = decode_stream(r.payload for r in doget if r.direction == "S")
    assert schema.equals(TABLE.schema)
    assert pa.Table.from_batches([pa.record_batch(u.added, schema=schema) for u in updates]).equals(TABLE)
    # ListFlights: one FlightInfo per flight, with the schema in IPC form
    lf = [flight_pb2.FlightInfo.FromString(r.payload) for r in read_records(out / index[1]["file"])
          if r.direction == "S"]
    assert [list(i.flight_descriptor.path) for i in lf] == [["x"], ["y"]]
    assert read_schema_message(lf[0].schema).equals(TABLE.schema)
    # DoPut (client streaming): descriptor + schema + 4 batches of at most 30 rows, no response
    put = read_records(out / index[3]["file"])
    assert index[3]["n_server_msgs"] == 0
    put_schema, put_updates = decode_stream(r.payload for r in put if r.direction == "C")
    assert put_schema.equals(TABLE.schema)
    assert [len(u.added[0]) for u in put_updates] == [30, 30, 30, 10]
    assert decode_flight_data(put[0].payload).descriptor.path == ["p"]
    # DoExchange (bidi): both directions recorded
    ex = read_records(out / index[4]["file"])
    assert {r.direction for r in ex} == {"C", "S"}

    # the recorded directory describes and compares like a golden one
    for e in index:
        lines = describe_call(out / e["file"], e["method"])
        assert len(lines) == e["n_client_msgs"] + e["n_server_msgs"]
    doget_lines = describe_call(out / index[0]["file"])
    assert doget_lines[0] == "C #1 Ticket ticket=t"
    assert doget_lines[1].startswith("S #2 FlightData header=Schema[2](a:int64; s:string)")
    assert "header=RecordBatch length=100" in doget_lines[2]
    assert compare_captures(out, out) == []


class _EchoHandler(grpc.GenericRpcHandler):
    """/echo.E/Unary: one reply; /echo.E/Fail: an error with details and trailers;
    /echo.E/Forever: replies to every request and never ends on its own."""

    def __init__(self):
        self.cancelled = threading.Event()

    def service(self, details):
        method = details.method

        def behaviour(requests, context):
            context.add_callback(self.cancelled.set)
            if method == "/echo.E/Unary":
                for r in requests:
                    context.send_initial_metadata([("x-initial", "i1")])
                    context.set_trailing_metadata([("x-trailing", "t1"), ("x-bin", b"\x00\x01")])
                    yield b"pong:" + r
            elif method == "/echo.E/Fail":
                list(requests)
                context.set_trailing_metadata([("x-why", "because")])
                context.set_code(grpc.StatusCode.FAILED_PRECONDITION)
                context.set_details("precondition failed here")
            else:
                for r in requests:
                    yield r[::-1]
                while context.is_active():
                    time.sleep(0.01)

        return grpc.stream_stream_rpc_method_handler(behaviour)


@pytest.fixture()
def echo_server():
    handler = _EchoHandler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", handler
    server.stop(0).wait()


def test_proxy_relays_raw_calls_statuses_metadata_and_cancellation(echo_server, tmp_path):
    upstream, handler = echo_server
    out = tmp_path / "echo"
    with CaptureProxy(upstream, out) as proxy, grpc.insecure_channel(proxy.target) as ch:
        unary = ch.unary_unary("/echo.E/Unary")
        reply, call = unary.with_call(b"ping", metadata=[("authorization", "Anonymous"), ("x-req", "r1")])
        assert reply == b"pong:ping"
        assert ("x-initial", "i1") in call.initial_metadata()
        assert ("x-trailing", "t1") in call.trailing_metadata()
        assert ("x-bin", b"\x00\x01") in call.trailing_metadata()
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary("/echo.E/Fail")(b"x")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == "precondition failed here"
        assert ("x-why", "because") in err.value.trailing_metadata()
        # a bidi call the client cancels after two round trips
        sent = [b"abc", b"xyz"]
        gate = threading.Event()

        def requests():
            yield sent[0]
            gate.wait(5)
            yield sent[1]
            gate.wait(5)

        forever = ch.stream_stream("/echo.E/Forever")(requests())
        first = next(forever)
        gate.set()
        second = next(forever)
        forever.cancel()
        assert (first, second) == (b"cba", b"zyx")
        assert handler.cancelled.wait(5)  # the proxy cancelled the upstream call too
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(c["status"] == "UNFINISHED" for c in proxy.calls):
            time.sleep(0.01)
    index = json.loads((out / "index.json").read_text())
    assert [e["method"] for e in index] == ["/echo.E/Unary", "/echo.E/Fail", "/echo.E/Forever"]
    assert [e["file"] for e in index] == ["0001_E_Unary.cap", "0002_E_Fail.cap", "0003_E_Forever.cap"]
    u, f, fe = index
    assert u["status"] == "OK" and ["x-req", "r1"] in u["request_metadata"]
    assert ["x-initial", "i1"] in u["response_initial_metadata"]
    assert ["x-trailing", "t1"] in u["response_trailing_metadata"]
    assert ["x-bin", "base64:AAE="] in u["response_trailing_metadata"]
    assert [(r.direction, r.payload) for r in read_records(out / u["file"])] == [("C", b"ping"), ("S", b"pong:ping")]
    assert (f["status"], f["details"]) == ("FAILED_PRECONDITION", "precondition failed here")
    assert ["x-why", "because"] in f["response_trailing_metadata"]
    assert fe["status"] == "CLIENT_CANCELLED (upstream CANCELLED)"
    assert [(r.direction, r.payload) for r in read_records(out / fe["file"])] == [
        ("C", b"abc"), ("S", b"cba"), ("C", b"xyz"), ("S", b"zyx")]
    assert "[0003] <- /echo.E/Forever CLIENT_CANCELLED" in (out / "proxy.log").read_text()


# ------------------------------------------------------------------------------------------------
# (b) every golden directory equals itself
# ------------------------------------------------------------------------------------------------

@needs_golden
@pytest.mark.parametrize("name", [p.name for p in golden_dirs()])
def test_golden_dir_compares_equal_to_itself(name):
    assert compare_captures(GOLDEN / name, GOLDEN / name) == []
    assert compare_captures(GOLDEN / name, GOLDEN / name, allow=()) == []
    for c in load_calls(GOLDEN / name)[:6]:
        lines = describe_call(c.file, c.method)
        assert len(lines) == len(read_records(c.file))


@needs_golden
def test_describe_call_normalizes_tokens_and_reports_barrage_fields():
    lines = describe_call(GOLDEN / "flight_doget" / "0001_FlightService_DoGet.cap")
    assert lines[0] == "C #1 Ticket ticket=s/static_mixed"
    assert lines[1].startswith("S #2 FlightData header=Schema[10](I8:int8{deephaven:isSortable=true, "
                               "deephaven:type=byte}")
    first, last = lines[2], lines[3]
    assert "header=RecordBatch length=819" in first and "layout=pad8" in first and "body=37624B" in first
    assert ("app_metadata=UPDATE_METADATA(first_seq=-1 last_seq=-1 is_snapshot=True effective_viewport=819 {0-818} "
            "effective_reverse_viewport=False effective_column_set=absent added_rows=1000 {0-999} "
            "removed_rows=absent shift_data=0 shifts added_rows_included=819 {0-818} mod_column_nodes=absent "
            "table_size=absent)") in first
    assert "effective_viewport=absent" in last and "added_rows_included=181 {819-999}" in last
    # tokens in session calls become placeholders
    close = describe_call(GOLDEN / "pydeephaven" / "0008_SessionService_CloseSession.cap")
    assert close[0] == "C #1 HandshakeRequest payload=<token>"
    sub = describe_call(GOLDEN / "ticking_keyed" / "0003_FlightService_DoExchange.cap")
    assert sub[0] == "C #1 FlightData descriptor=CMD 'dphn' header=absent body=absent"
    assert "SUBSCRIPTION_REQUEST(ticket=export:1 columns=absent viewport=absent" in sub[1]
    assert "columns_as_list=True" in sub[1]
    assert "first_seq=<seq>" in sub[3] and "mod_column_nodes=4 sizes=[0, 0, 0, 0]" in sub[3]
    assert "table_size=20" in sub[3]


def test_describe_call_placeholders_for_session_tokens_times_and_uuids(tmp_path):
    from tickwire.protocol.proto import session_pb2, table_pb2
    cap = tmp_path / "0001_SessionService_NewSession.cap"
    req = session_pb2.HandshakeRequest(auth_protocol=0, payload=b"Anonymous")
    resp = session_pb2.HandshakeResponse(metadata_header=b"authorization",
                                         session_token=b"9f1c2d3e-1111-2222-3333-444455556666",
                                         token_deadline_time_millis=1_700_000_000_000,
                                         token_expiration_delay_millis=300_000)
    set_payloads(cap, [("C", req.SerializeToString()), ("S", resp.SerializeToString())])
    assert describe_call(cap) == [
        "C #1 HandshakeRequest payload=<token>",
        "S #2 HandshakeResponse metadata_header='authorization'; session_token=<token>; "
        "token_deadline_time_millis=<time>; token_expiration_delay_millis=<time>",
    ]
    cap2 = tmp_path / "0002_TableService_FetchTable.cap"
    err = table_pb2.ExportedTableCreationResponse(
        success=False, error_info="Details Logged w/ID 'a1b2c3d4-0000-1111-2222-333344445555'")
    set_payloads(cap2, [("S", err.SerializeToString())])
    assert describe_call(cap2, "TableService/FetchTable") == [
        "S #1 ExportedTableCreationResponse error_info=\"Details Logged w/ID '<uuid>'\""]
    with pytest.raises(ValueError, match="unknown gRPC method"):
        describe_call(cap2, "/no.Such/Method")


# ------------------------------------------------------------------------------------------------
# (c) real differences are reported, and named
# ------------------------------------------------------------------------------------------------

@needs_golden
def test_dropped_schema_is_reported(tmp_path):
    other = copy_golden("flight_doget", tmp_path)
    cap = other / "0001_FlightService_DoGet.cap"
    recs = read_records(cap)
    rewrite(cap, [r for i, r in enumerate(recs) if i != 1])  # record #2 is the Schema
    diffs = compare_captures(GOLDEN / "flight_doget", other)
    t = texts(diffs)
    assert all(d.call.startswith("#1 ") for d in diffs), t
    assert any(d.aspect == "order" and "no Schema FlightData before the record batches" in d.message for d in diffs), t
    assert any(d.aspect == "schema" and "schema missing in other" in d.message for d in diffs), t


@needs_golden
def test_second_schema_and_schema_not_first_are_reported(tmp_path):
    other = copy_golden("flight_doget", tmp_path)
    cap = other / "0002_FlightService_DoGet.cap"
    recs = read_records(cap)
    rewrite(cap, [recs[0], recs[2], recs[1], recs[1]])  # batch, schema, schema
    t = texts(compare_captures(GOLDEN / "flight_doget", other))
    assert "2 Schema FlightData" in t and "not the Schema" in t, t


@needs_golden
def test_changed_status_is_reported(tmp_path):
    other = copy_golden("flight_doget", tmp_path)
    edit_index(other, 2, status="INTERNAL", details="boom")
    diffs = compare_captures(GOLDEN / "flight_doget", other)
    assert [(d.call, d.aspect) for d in diffs] == [("#2 FlightService/DoGet", "status")]
    assert "status OK in golden, INTERNAL in other" in diffs[0].message


@needs_golden
def test_status_details_only_compared_when_the_rule_is_off(tmp_path):
    other = copy_golden("pydeephaven", tmp_path)
    edit_index(other, 2, details="Cancelled by the client")
    assert compare_captures(GOLDEN / "pydeephaven", other) == []
    strict = compare_captures(GOLDEN / "pydeephaven", other, allow=DEFAULT_ALLOW - {"status_details"})
    assert [d.aspect for d in strict] == ["status"] and "Cancelled by the client" in strict[0].message


@needs_golden
def test_auth_exchange_differences_are_reported(tmp_path):
    other = copy_golden("pydeephaven", tmp_path)
    idx = json.loads((other / "index.json").read_text())
    # a new token on every response is fine (the token value is normalized) ...
    for e in idx:
        e["response_initial_metadata"] = [[k, "Bearer 00000000-1111-2222-3333-444444444444" if k == "authorization"
                                           else v] for k, v in e["response_initial_metadata"]]
        e["request_metadata"] = [[k, "Bearer 00000000-1111-2222-3333-444444444444" if v.startswith("Bearer")
                                  else v] for k, v in e["request_metadata"]]
    (other / "index.json").write_text(json.dumps(idx))
    assert compare_captures(GOLDEN / "pydeephaven", other) == []
    # ... but a missing Anonymous, a token never issued and a missing Bearer answer are not
    idx[0]["request_metadata"] = [m for m in idx[0]["request_metadata"] if m[0] != "authorization"]
    idx[2]["request_metadata"] = [["authorization", "Bearer 99999999-1111-2222-3333-444444444444"]]
    idx[3]["response_initial_metadata"] = []
    (other / "index.json").write_text(json.dumps(idx))
    diffs = compare_captures(GOLDEN / "pydeephaven", other)
    t = texts(diffs)
    assert "#1 ConfigService/GetConfigurationConstants: request authorization header 'Anonymous' in golden, " \
           "'<none>' in other" in t, t
    assert "#3 TableService/FetchTable: other call #3 sends a Bearer token that no earlier response issued" in t, t
    assert "#4 FlightService/DoGet: response authorization header 'Bearer <token>' in golden, '<none>' in other" \
           in t, t
    assert {d.aspect for d in diffs} == {"auth"}


@needs_golden
def test_transport_headers_only_compared_when_the_rule_is_off(tmp_path):
    other = copy_golden("flight_doget", tmp_path)
    idx = json.loads((other / "index.json").read_text())
    idx[0]["response_initial_metadata"] = [m for m in idx[0]["response_initial_metadata"] if m[0] != "vary"]
    idx[0]["response_initial_metadata"].append(["date", "Mon, 01 Jan 2024 00:00:00 GMT"])
    (other / "index.json").write_text(json.dumps(idx))
    assert compare_captures(GOLDEN / "flight_doget", other) == []
    strict = compare_captures(GOLDEN / "flight_doget", other, allow=DEFAULT_ALLOW - {"transport_headers"})
    assert [str(d) for d in strict] == [
        "[headers] #1 FlightService/DoGet: response initial header names: missing in other ['vary'], only in other []"]


@needs_golden
def test_metadata_on_a_second_flightdata_is_reported_but_batch_split_is_allowed(tmp_path):
    golden_cap = GOLDEN / "flight_doget" / "0001_FlightService_DoGet.cap"
    payloads = server_payloads(golden_cap)
    dec = StreamDecoder()
    ups = [u for u in (dec.feed(p) for p in payloads) if u is not None]
    types = [f.type for f in dec.schema]
    md1 = decode_flight_data(payloads[1]).app_metadata
    split = encode_update(md1, types, ups[0].added, None, batch_size=300)  # 819 rows -> 300 + 300 + 219
    assert len(split) == 3 and decode_flight_data(split[1]).app_metadata is None
    other = copy_golden("flight_doget", tmp_path)
    cap = other / golden_cap.name
    head = client_records(golden_cap)
    set_payloads(cap, head + [("S", payloads[0])] + [("S", p) for p in split] + [("S", payloads[2])])
    assert compare_captures(GOLDEN / "flight_doget", other) == []
    strict = texts(compare_captures(GOLDEN / "flight_doget", other, allow=DEFAULT_ALLOW - {"batch_split"}))
    assert "message 1 (snapshot): batches of [819, 181] rows in golden, [300, 300, 219, 181] in other" in strict, strict
    # now the second FlightData of the message carries the metadata as well
    fd = decode_flight_data(split[1])
    bad = encode_flight_data(fd.data_header, md1, fd.data_body)
    set_payloads(cap, head + [("S", payloads[0]), ("S", split[0]), ("S", bad), ("S", split[2]), ("S", payloads[2])])
    diffs = compare_captures(GOLDEN / "flight_doget", other)
    t = texts(diffs)
    assert any(d.aspect == "order" and "record #4: app_metadata on a FlightData inside the message begun at record #3"
               in d.message for d in diffs), t


@needs_golden
def test_metadata_only_flightdata_and_missing_body_are_reported(tmp_path):
    golden_cap = GOLDEN / "flight_doget" / "0003_FlightService_DoGet.cap"
    payloads = server_payloads(golden_cap)
    md = decode_flight_data(payloads[1]).app_metadata
    other = copy_golden("flight_doget", tmp_path)
    cap = other / golden_cap.name
    set_payloads(cap, client_records(golden_cap) + [("S", payloads[0]), ("S", encode_flight_data(None, md)),
                                                    ("S", record_batch_without_body(payloads[1]))])
    diffs = compare_captures(GOLDEN / "flight_doget", other)
    t = texts(diffs)
    assert "record #3: metadata-only FlightData (UPDATE_METADATA, no data_header)" in t, t
    assert "record #4: RecordBatch FlightData without the data_body field" in t, t
    assert all(d.call == "#3 FlightService/DoGet" for d in diffs), t


@needs_golden
def test_changed_field_type_in_schema_is_reported(tmp_path):
    golden_cap = GOLDEN / "flight_doget" / "0001_FlightService_DoGet.cap"
    recs = read_records(golden_cap)
    schema = read_schema_message(decode_flight_data(recs[1].payload).data_header)
    i = schema.get_field_index("I16")
    changed = schema.set(i, pa.field("I16", pa.int32(), metadata=schema.field(i).metadata))
    other = copy_golden("flight_doget", tmp_path)
    recs[1] = type(recs[1])(recs[1].direction, recs[1].t_us, encode_flight_data(schema_message(changed)))
    rewrite(other / golden_cap.name, recs)
    diffs = compare_captures(GOLDEN / "flight_doget", other)
    assert [str(d) for d in diffs] == [
        "[schema] #1 FlightService/DoGet: server schema: field 'I16': type int16 in golden, int32 in other"]
    # field metadata and schema metadata differences are named as well
    changed = schema.set(i, pa.field("I16", pa.int16(), metadata={"deephaven:type": "int"}))
    changed = changed.with_metadata({**changed.metadata, b"deephaven:attribute.Extra": b"x"})
    recs[1] = type(recs[1])(recs[1].direction, recs[1].t_us, encode_flight_data(schema_message(changed)))
    rewrite(other / golden_cap.name, recs)
    t = texts(compare_captures(GOLDEN / "flight_doget", other))
    assert "field 'I16' metadata: key 'deephaven:isSortable' missing in other (golden 'true')" in t, t
    assert "field 'I16' metadata: key 'deephaven:type' is 'short' in golden, 'int' in other" in t, t
    assert "schema metadata: key 'deephaven:attribute.Extra' only in other ('x')" in t, t


@needs_golden
def test_schema_header_of_fetch_table_is_compared(tmp_path):
    golden_cap = GOLDEN / "pydeephaven" / "0003_TableService_FetchTable.cap"
    recs = read_records(golden_cap)
    from tickwire.protocol.proto import table_pb2
    resp = table_pb2.ExportedTableCreationResponse.FromString(recs[1].payload)
    schema = read_schema_message(resp.schema_header)
    resp.schema_header = schema.remove(schema.get_field_index("Ch")).serialize().to_pybytes()
    other = copy_golden("pydeephaven", tmp_path)
    recs[1] = type(recs[1])("S", recs[1].t_us, resp.SerializeToString())
    rewrite(other / golden_cap.name, recs)
    t = texts(compare_captures(GOLDEN / "pydeephaven", other))
    assert "[schema] #3 TableService/FetchTable: response 1 (ExportedTableCreationResponse) schema #1: field names " \
           "differ" in t and "'Ch'" in t, t


@needs_golden
def test_barrage_field_presence_in_deltas_is_reported(tmp_path):
    golden_cap = GOLDEN / "ticking_keyed" / "0003_FlightService_DoExchange.cap"
    recs = read_records(golden_cap)
    fd = decode_flight_data(recs[4].payload)  # the first delta
    _, md = barrage.unwrap(fd.app_metadata)
    assert not md.is_snapshot and md.shift_data is not None
    md.shift_data = None
    md.table_size = 0
    recs[4] = type(recs[4])("S", recs[4].t_us, encode_flight_data(fd.data_header, barrage.wrap(md), fd.data_body))
    other = copy_golden("ticking_keyed", tmp_path)
    rewrite(other / golden_cap.name, recs)
    diffs = compare_captures(GOLDEN / "ticking_keyed", other)
    t = texts(diffs)
    assert "delta message at record #5: metadata field shift_data present in golden, absent in other" in t, t
    assert "delta message at record #5: metadata field table_size present in golden, absent in other" in t, t
    assert {d.aspect for d in diffs} == {"metadata"}, t


@needs_golden
def test_ticking_values_are_normalized_but_missing_deltas_are_not(tmp_path):
    golden_cap = GOLDEN / "ticking_keyed" / "0003_FlightService_DoExchange.cap"
    recs = read_records(golden_cap)
    other = copy_golden("ticking_keyed", tmp_path)
    # fewer deltas (a shorter recording): allowed for a ticking table
    rewrite(other / golden_cap.name, recs[:7])
    assert compare_captures(GOLDEN / "ticking_keyed", other) == []
    strict = texts(compare_captures(GOLDEN / "ticking_keyed", other, allow=DEFAULT_ALLOW - {"ticking_values"}))
    assert "10 logical messages in golden" in strict and "4 in other (snapshot, delta, delta, delta)" in strict, strict
    # no delta at all is reported
    rewrite(other / golden_cap.name, recs[:4])
    t = texts(compare_captures(GOLDEN / "ticking_keyed", other))
    assert "golden has 9 delta messages, other none" in t, t


@needs_golden
def test_static_row_counts_are_compared(tmp_path):
    # a static table's snapshot that misses rows is a difference even with every rule on
    golden_cap = GOLDEN / "flight_doget" / "0001_FlightService_DoGet.cap"
    recs = read_records(golden_cap)
    other = copy_golden("flight_doget", tmp_path)
    rewrite(other / golden_cap.name, recs[:3])  # only the first piece
    t = texts(compare_captures(GOLDEN / "flight_doget", other))
    assert "message 1 (snapshot): 1000 added data rows in golden, 819 in other" in t, t


@needs_golden
def test_method_sequence_and_request_differences_are_reported(tmp_path):
    other = copy_golden("pydeephaven", tmp_path)
    idx = json.loads((other / "index.json").read_text())
    (other / "index.json").write_text(json.dumps([e for e in idx if e["id"] != 6]))  # drop the Release
    t = texts(compare_captures(GOLDEN / "pydeephaven", other))
    assert "[methods] golden call #6 SessionService/Release has no partner in other" in t, t
    other2 = copy_golden("ticking_append", tmp_path)
    cap = other2 / "0002_TableService_FetchTable.cap"
    from tickwire.protocol.proto import table_pb2
    recs = read_records(cap)
    req = table_pb2.FetchTableRequest.FromString(recs[0].payload)
    req.source_id.ticket.ticket = b"s/other_table"
    recs[0] = type(recs[0])("C", recs[0].t_us, req.SerializeToString())
    rewrite(cap, recs)
    t = texts(compare_captures(GOLDEN / "ticking_append", other2))
    assert "source_id={ticket={ticket=s/ticking_append}} missing in other" in t
    assert "source_id={ticket={ticket=s/other_table}} only in other" in t


@needs_golden
def test_server_constants_rule(tmp_path):
    from tickwire.protocol.proto import config_pb2
    cap_name = "0001_ConfigService_GetConfigurationConstants.cap"
    recs = read_records(GOLDEN / "pydeephaven" / cap_name)
    resp = config_pb2.ConfigurationConstantsResponse.FromString(recs[1].payload)
    del resp.config_values["groovy.version"]
    resp.config_values["http.session.durationMs"].string_value = "60000"
    resp.config_values["tickwire.version"].string_value = "0.1"
    other = copy_golden("pydeephaven", tmp_path)
    rewrite(other / cap_name, [recs[0], type(recs[1])("S", recs[1].t_us, resp.SerializeToString())])
    assert compare_captures(GOLDEN / "pydeephaven", other) == []
    strict = texts(compare_captures(GOLDEN / "pydeephaven", other, allow=DEFAULT_ALLOW - {"server_constants"}))
    assert "groovy.version" in strict and "tickwire.version" in strict and "60000" in strict, strict
    resp.config_values["barrage.version"].string_value = "0.9"
    rewrite(other / cap_name, [recs[0], type(recs[1])("S", recs[1].t_us, resp.SerializeToString())])
    t = texts(compare_captures(GOLDEN / "pydeephaven", other))
    assert "config_values[barrage.version]={string_value='1.0.0'} missing in other" in t, t


def test_calls_filter_and_unknown_rules(tmp_path):
    with pytest.raises(ValueError, match="unknown allowed-difference rule"):
        compare_captures(tmp_path, tmp_path, allow={"everything"})
    assert set(ALLOWED_DIFFERENCES) == set(DEFAULT_ALLOW)
    assert {"batch_split", "snapshot_pieces", "ticking_values", "bearer_token"} <= DEFAULT_ALLOW


@needs_golden
def test_calls_filter_pairs_by_method_order():
    # pydeephaven's DoGets (static_mixed then ticking_keyed) against flight_doget's first two DoGets
    diffs = compare_captures(GOLDEN / "flight_doget", GOLDEN / "pydeephaven", calls=[1, 2])
    t = texts(diffs)
    assert {d.aspect for d in diffs} <= {"auth", "messages"}, t
    assert "ticket=s/static_mixed missing in other" in t and "ticket=export:1 only in other" in t
    assert all(d.call in ("#1 FlightService/DoGet (other #4)", "#2 FlightService/DoGet (other #7)") for d in diffs)
    missing = compare_captures(GOLDEN / "flight_doget", GOLDEN / "pydeephaven", calls=["DoGet"])
    assert "[methods] #3 FlightService/DoGet: no FlightService/DoGet call number 3 in other" in texts(missing)


# ------------------------------------------------------------------------------------------------
# (d) a snapshot in pieces equals the same rows in one message
# ------------------------------------------------------------------------------------------------

def _empty_shifts():
    z = np.zeros(0, dtype=np.int64)
    return (z, z, z)


@needs_golden
def test_doget_snapshot_pieces_equal_one_message(tmp_path):
    golden_cap = GOLDEN / "flight_doget" / "0001_FlightService_DoGet.cap"
    payloads = server_payloads(golden_cap)
    schema, ups = decode_stream(payloads)
    assert [len(u.added[0]) for u in ups] == [819, 181]  # DH sent two pieces
    whole = [pa.concat_arrays([a, b]) for a, b in zip(ups[0].added, ups[1].added)]
    all_rows = np.array([[0, 999]], dtype=np.int64)
    md = barrage.UpdateMetadata(first_seq=-1, last_seq=-1, is_snapshot=True, added_rows=all_rows,
                                shift_data=_empty_shifts(), added_rows_included=all_rows)
    one = encode_update(barrage.wrap(md), [f.type for f in schema], whole, None)
    assert len(one) == 1
    other = copy_golden("flight_doget", tmp_path)
    set_payloads(other / golden_cap.name, client_records(golden_cap) + [("S", payloads[0]), ("S", one[0])])
    assert compare_captures(GOLDEN / "flight_doget", other) == []
    # the other way round too
    assert compare_captures(other, GOLDEN / "flight_doget", calls=[1]) == []
    # without the rule, the framing difference shows
    strict = texts(compare_captures(GOLDEN / "flight_doget", other, allow=DEFAULT_ALLOW - {"snapshot_pieces"}))
    assert "2 logical messages in golden (snapshot, snapshot), 1 in other (snapshot)" in strict, strict
    # one message with fewer rows than the pieces delivered is a difference
    part = barrage.UpdateMetadata(first_seq=-1, last_seq=-1, is_snapshot=True, added_rows=all_rows,
                                  shift_data=_empty_shifts(), added_rows_included=np.array([[0, 899]], np.int64))
    short = encode_update(barrage.wrap(part), [f.type for f in schema], [a.slice(0, 900) for a in whole], None)
    set_payloads(other / golden_cap.name, client_records(golden_cap) + [("S", payloads[0]), ("S", short[0])])
    t = texts(compare_captures(GOLDEN / "flight_doget", other))
    assert "added_rows_included holds 1000 rows in golden, 900 in other" in t, t


@needs_golden
def test_list_mode_subscription_pieces_equal_one_message(tmp_path):
    golden_cap = GOLDEN / "ticking_static_mixed" / "0003_FlightService_DoExchange.cap"
    payloads = server_payloads(golden_cap)
    schema, ups = decode_stream(payloads, columns_as_list=True, use_deephaven_nulls=True)
    assert [len(u.added[0]) for u in ups] == [819, 181]
    whole = [pa.concat_arrays([a, b]) for a, b in zip(ups[0].added, ups[1].added)]
    all_rows = np.array([[0, 999]], dtype=np.int64)
    empty = rs.EMPTY_RANGES
    md = barrage.UpdateMetadata(first_seq=-1, last_seq=-1, is_snapshot=True,
                                effective_column_set=np.arange(10, dtype=np.int64), added_rows=all_rows,
                                removed_rows=empty, shift_data=_empty_shifts(), added_rows_included=all_rows,
                                mod_column_nodes=[empty] * 10, table_size=1000)
    one = encode_update(barrage.wrap(md), [f.type for f in schema], whole, None, columns_as_list=True,
                        use_deephaven_nulls=True)
    other = copy_golden("ticking_static_mixed", tmp_path)
    set_payloads(other / golden_cap.name, client_records(golden_cap) + [("S", payloads[0])]
                 + [("S", p) for p in one])
    assert compare_captures(GOLDEN / "ticking_static_mixed", other) == []
    # a one-message snapshot that keeps the growing-piece field (effective_viewport) is reported
    md.effective_viewport = all_rows
    one = encode_update(barrage.wrap(md), [f.type for f in schema], whole, None, columns_as_list=True,
                        use_deephaven_nulls=True)
    set_payloads(other / golden_cap.name, client_records(golden_cap) + [("S", payloads[0])]
                 + [("S", p) for p in one])
    t = texts(compare_captures(GOLDEN / "ticking_static_mixed", other))
    assert "message 1 (snapshot): metadata field effective_viewport absent in golden, present in other" in t, t


@needs_golden
def test_one_message_golden_equals_pieces(tmp_path):
    # ticking_keyed's DoGet snapshot is one message of 20 rows; two pieces of 10 deliver the same rows
    golden_cap = GOLDEN / "pydeephaven" / "0007_FlightService_DoGet.cap"
    payloads = server_payloads(golden_cap)
    schema, ups = decode_stream(payloads)
    _, md = barrage.unwrap(decode_flight_data(payloads[1]).app_metadata)
    assert md.is_snapshot and rs.rowset_size(md.added_rows) == 20
    types = [f.type for f in schema]
    pieces = []
    for lo, hi, ev in ((0, 9, np.array([[0, 9]], np.int64)), (10, 19, None)):
        piece = barrage.UpdateMetadata(first_seq=md.first_seq, last_seq=md.last_seq, is_snapshot=True,
                                       effective_viewport=ev, added_rows=md.added_rows, shift_data=_empty_shifts(),
                                       added_rows_included=np.array([[lo, hi]], np.int64))
        pieces += encode_update(barrage.wrap(piece), types, [a.slice(lo, hi - lo + 1) for a in ups[0].added], None)
    other = copy_golden("pydeephaven", tmp_path)
    set_payloads(other / golden_cap.name, client_records(golden_cap) + [("S", payloads[0])]
                 + [("S", p) for p in pieces])
    assert compare_captures(GOLDEN / "pydeephaven", other) == []
    strict = texts(compare_captures(GOLDEN / "pydeephaven", other, allow=DEFAULT_ALLOW - {"snapshot_pieces"}))
    assert "[messages] #7 FlightService/DoGet: 1 snapshot messages in golden, 2 in other" in strict, strict
    assert "snapshot 1: metadata field effective_viewport absent in golden, present in other" in strict, strict
