"""The protobuf definitions in proto/ and their generated modules in tickwire.protocol.proto.

Checked against: the golden captures of real Deephaven 42.7 traffic (every non-data call parses as
its method's request/response type, re-serializes to the identical bytes and matches the readable
decoding in decoded.txt), Deephaven's own generated code shipped by pydeephaven (message, enum
and service descriptors identical), and pyarrow.flight's C++ serializers for the Flight messages.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from google.protobuf import descriptor_pb2, text_format

from tickwire.errors import ProtocolError
from tickwire.protocol.proto import (
    POOL,
    application_pb2,
    config_pb2,
    flight_pb2,
    session_pb2,
    storage_pb2,
    table_pb2,
    ticket_pb2,
)
from tickwire.protocol.proto import methods as M

from .golden import GOLDEN, decoded_records, decoded_sections, golden_dirs, read_cap

ROOT = Path(__file__).resolve().parents[1]
PROTO_OUT = ROOT / "protocol" / "proto"
DATA_METHODS = {"DoGet", "DoExchange", "DoPut", "Handshake"}
DH_PACKAGE = "io.deephaven.proto.backplane.grpc"

needs_golden = pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")


# ---------------------------------------------------------------------------------------------
# Generated code


def test_generated_code_is_reproducible():
    pytest.importorskip("grpc_tools")
    r = subprocess.run([sys.executable, str(ROOT / "proto" / "generate.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_generated_files_are_marked_and_message_only():
    generated = sorted(PROTO_OUT.glob("*_pb2.py"))
    assert [p.name for p in generated] == [f"{s.stem}_pb2.py" for s in sorted((ROOT / "proto").glob("*.proto"))]
    for f in generated + [PROTO_OUT / "__init__.py"]:
        assert f.read_text().startswith("# GENERATED CODE"), f
    assert not (PROTO_OUT / "methods.py").read_text().startswith("# GENERATED CODE")
    assert not list(PROTO_OUT.glob("*_grpc.py"))
    for f in PROTO_OUT.glob("*.py"):
        text = f.read_text()
        assert "import grpc" not in text and "from grpc" not in text, f


def test_full_method_names_and_packages():
    assert flight_pb2.DESCRIPTOR.package == "arrow.flight.protocol"
    for mod in (ticket_pb2, config_pb2, session_pb2, table_pb2, application_pb2, storage_pb2):
        assert mod.DESCRIPTOR.package == DH_PACKAGE
        assert mod.DESCRIPTOR.name == f"tickwire/protocol/proto/{Path(mod.__file__).stem[:-4]}.proto"
    for path in ("/io.deephaven.proto.backplane.grpc.TableService/Batch",
                 "/io.deephaven.proto.backplane.grpc.TableService/FetchTable",
                 "/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants",
                 "/io.deephaven.proto.backplane.grpc.SessionService/Release",
                 "/io.deephaven.proto.backplane.grpc.SessionService/CloseSession",
                 "/io.deephaven.proto.backplane.grpc.ApplicationService/ListFields",
                 "/arrow.flight.protocol.FlightService/DoExchange"):
        assert path in M.METHODS, path
    # ... + Application + Storage + InputTable + HierarchicalTable + Object
    assert len(M.ALL_METHODS) == 10 + 2 + 8 + 46 + 1 + 6 + 2 + 5 + 4


def test_private_pool_coexists_with_deephaven_generated_code():
    dh_ticket = pytest.importorskip("deephaven_core.proto.ticket_pb2")
    ours = ticket_pb2.Ticket(ticket=b"s/x")
    assert ours.DESCRIPTOR.file.pool is POOL
    assert type(ours) is not dh_ticket.Ticket
    assert dh_ticket.Ticket.FromString(ours.SerializeToString()).ticket == b"s/x"
    assert POOL.FindMessageTypeByName(f"{DH_PACKAGE}.BatchTableRequest") is table_pb2.BatchTableRequest.DESCRIPTOR


def test_pure_python_backend_loads_the_modules():
    code = ("from tickwire.protocol.proto import table_pb2, flight_pb2\n"
            "from google.protobuf.internal import api_implementation\n"
            "assert api_implementation.Type() == 'python', api_implementation.Type()\n"
            "r = table_pb2.BatchTableRequest(ops=[table_pb2.BatchTableRequest.Operation("
            "fetch_table=table_pb2.FetchTableRequest(result_id={'ticket': b'e\\x01\\0\\0\\0'}))])\n"
            "b = r.SerializeToString()\n"
            "assert table_pb2.BatchTableRequest.FromString(b) == r\n"
            "e = flight_pb2.FlightEndpoint(); e.expiration_time.FromSeconds(7)\n"
            "assert flight_pb2.FlightEndpoint.FromString(e.SerializeToString()).expiration_time.seconds == 7\n"
            "print(b.hex())\n")
    env = dict(os.environ, PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION="python")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0a0ce2010912070a056501000000"  # ops{fetch_table{result_id{ticket}}}


# ---------------------------------------------------------------------------------------------
# methods.py


def test_methods_agree_with_service_descriptors():
    for path, m in M.METHODS.items():
        d = M.ALL_METHODS[path]
        assert (m.kind, m.request, m.response) == (d.kind, d.request, d.response), path
        assert m.path == path and path == f"/{m.service}/{m.name}"
    assert M.METHODS["/arrow.flight.protocol.FlightService/DoExchange"].kind == M.BIDI
    assert M.METHODS["/io.deephaven.proto.backplane.grpc.TableService/Batch"].kind == M.SERVER_STREAM
    assert M.METHODS["/io.deephaven.proto.backplane.grpc.TableService/FetchTable"].kind == M.UNARY
    assert set(M.methods_of(M.APPLICATION_SERVICE)) == {"ListFields"}
    assert {"DoGet", "DoExchange", "DoPut", "ListFlights", "GetFlightInfo", "GetSchema", "Handshake",
            "DoAction", "ListActions"} <= set(M.methods_of(M.FLIGHT_SERVICE))
    fetch = M.method("/io.deephaven.proto.backplane.grpc.TableService/FetchTable")
    req = table_pb2.FetchTableRequest(result_id=ticket_pb2.Ticket(ticket=b"e\x01\x00\x00\x00"))
    assert fetch.request_deserializer(fetch.serializer(req)) == req
    assert type(fetch.response_deserializer(b"\x10\x01")) is table_pb2.ExportedTableCreationResponse
    assert fetch.response_deserializer(b"\x10\x01").success is True
    assert not fetch.client_streaming and not fetch.server_streaming
    exchange = M.method("/arrow.flight.protocol.FlightService/DoExchange")
    assert exchange.client_streaming and exchange.server_streaming
    with pytest.raises(KeyError, match="NoSuchMethod"):
        M.method("/arrow.flight.protocol.FlightService/NoSuchMethod")
    with pytest.raises(KeyError):
        M.methods_of("no.such.Service")


def test_method_parse_errors_are_protocol_errors():
    m = M.method("/io.deephaven.proto.backplane.grpc.TableService/FetchTable")
    with pytest.raises(ProtocolError, match="FetchTableRequest"):
        m.parse_request(b"\x0a\x05ab")  # length 5, only 2 bytes follow
    with pytest.raises(ProtocolError, match="ExportedTableCreationResponse"):
        m.parse_response(b"\xff")
    with pytest.raises(ValueError):
        M.Method(path="Batch", kind=M.UNARY, request=ticket_pb2.Ticket, response=ticket_pb2.Ticket)
    with pytest.raises(ValueError):
        M.Method(path="/a.B/C", kind="stream", request=ticket_pb2.Ticket, response=ticket_pb2.Ticket)


# ---------------------------------------------------------------------------------------------
# Golden captures


def _calls(data: bool) -> list[tuple[Path, dict]]:
    out = []
    for folder in golden_dirs():
        for entry in json.loads((folder / "index.json").read_text()):
            if (entry["method"].rpartition("/")[2] in DATA_METHODS) == data:
                out.append((folder, entry))
    return out


NON_DATA_CALLS = _calls(data=False)
DATA_CALLS = _calls(data=True)


def _ids(calls):
    return [f"{folder.name}/{entry['file']}" for folder, entry in calls]


@needs_golden
def test_golden_calls_are_all_known():
    assert len(NON_DATA_CALLS) == 59
    assert {e["method"] for _, e in NON_DATA_CALLS + DATA_CALLS} <= set(M.METHODS)


def _parse_all(folder: Path, entry: dict):
    m = M.METHODS[entry["method"]]
    records = read_cap(folder / entry["file"])
    parsed = [(r, m.parse_request(r.payload) if r.direction == "C" else m.parse_response(r.payload)) for r in records]
    return m, parsed


def _has_no_unknown_fields(msg) -> bool:
    stripped = type(msg)()
    stripped.CopyFrom(msg)
    stripped.DiscardUnknownFields()
    return stripped.SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)


def _has_map_field(desc) -> bool:
    return any(f.message_type is not None and f.message_type.GetOptions().map_entry for f in desc.fields)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _top_level_fields(data: bytes) -> list[bytes]:
    """The raw bytes (tag included) of each top-level field of a serialized message."""
    out, pos = [], 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == 2:
            n, pos = _varint(data, pos)
            pos += n
        elif wire == 5:
            pos += 4
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append(data[start:pos])
    assert pos == len(data)
    return out


@needs_golden
@pytest.mark.parametrize("folder,entry", NON_DATA_CALLS, ids=_ids(NON_DATA_CALLS))
def test_golden_call_parses_and_reserializes_identically(folder, entry):
    m, parsed = _parse_all(folder, entry)
    assert sum(r.direction == "C" for r, _ in parsed) == entry["n_client_msgs"]
    assert sum(r.direction == "S" for r, _ in parsed) == entry["n_server_msgs"]
    for r, msg in parsed:
        assert type(msg) is (m.request if r.direction == "C" else m.response)
        out = msg.SerializeToString()
        if _has_map_field(msg.DESCRIPTOR):
            # Map entries are written in each implementation's own order: same fields, any order.
            assert sorted(_top_level_fields(out)) == sorted(_top_level_fields(r.payload))
        else:
            assert out == r.payload
        assert _has_no_unknown_fields(msg), f"{type(msg).__name__} has fields not in proto/"


def _decoded_block(text: str) -> list[str]:
    """The lines of one decoded record after its header line, without their 6-space indent."""
    lines = text.splitlines()[1:]
    return [ln[6:] for ln in lines if ln.startswith("      ")]


@needs_golden
@pytest.mark.parametrize("folder,entry", [c for c in NON_DATA_CALLS if "FlightService" not in c[1]["method"]],
                         ids=_ids([c for c in NON_DATA_CALLS if "FlightService" not in c[1]["method"]]))
def test_golden_deephaven_messages_match_decoded_text(folder, entry):
    """Each Deephaven message, printed in protobuf text format, reads like decoded.txt's rendering."""
    _, parsed = _parse_all(folder, entry)
    records = decoded_records(decoded_sections(folder)[entry["id"]])
    assert len(records) == len(parsed)
    for i, (_, msg) in enumerate(parsed, start=1):
        block = _decoded_block(records[i])
        head = block[0]
        name = type(msg).DESCRIPTOR.name
        if head.endswith("}"):
            assert head == f"{name} {{ {text_format.MessageToString(msg, as_one_line=True)} }}"
            continue
        assert head == name
        ours = text_format.MessageToString(msg).splitlines()
        shown = [ln[2:] for ln in block[1:]]
        assert shown, "multi-line decoding without body"
        for j, line in enumerate(shown):
            more = re.fullmatch(r"\.\.\. \((\d+) more lines\)", line)
            if more:
                assert len(ours) - j == int(more.group(1))
                break
            if j >= len(ours):
                assert line.startswith(("schema_header decoded:", "  ")), line  # decoder's annotations
                continue
            if line.endswith('..."'):
                assert ours[j].startswith(line[:-4]), (j, line)
            else:
                assert ours[j] == line, (j, line)
        else:
            assert len(shown) >= len(ours)


def _golden_call(folder: str, number: int):
    f = GOLDEN / folder
    entry = next(e for e in json.loads((f / "index.json").read_text()) if e["id"] == number)
    return entry, _parse_all(f, entry)[1]


EXPORT_1 = b"e\x01\x00\x00\x00"
STATIC_MIXED_COLUMNS = ["I8", "I16", "I32", "I64", "F32", "F64", "Bool", "Str", "Ts", "Ch"]


@needs_golden
def test_fetch_table_sample_fields():
    entry, ((_, req), (_, resp)) = _golden_call("pydeephaven", 3)
    assert entry["method"].endswith("TableService/FetchTable")
    assert req.source_id.WhichOneof("ref") == "ticket"
    assert req.source_id.ticket.ticket == b"s/static_mixed"
    assert req.result_id.ticket == EXPORT_1
    assert resp.result_id.ticket.ticket == EXPORT_1
    assert resp.success and resp.error_info == ""
    assert resp.schema_header[:4] == b"\xff\xff\xff\xff"
    assert pa.ipc.read_schema(pa.py_buffer(resp.schema_header)).names == STATIC_MIXED_COLUMNS
    assert resp.is_static is True
    assert resp.size == 1000

    _, ((_, req2), (_, resp2)) = _golden_call("pydeephaven", 5)
    assert req2.source_id.ticket.ticket == b"s/ticking_keyed"
    assert req2.result_id.ticket == b"e\x02\x00\x00\x00"
    assert resp2.is_static is False and resp2.size == 20
    assert pa.ipc.read_schema(pa.py_buffer(resp2.schema_header)).names == ["Key", "Timestamp", "Val", "Cnt"]


@needs_golden
def test_batch_fetch_table_sample_fields():
    entry, ((_, req), (_, resp)) = _golden_call("barrage_java", 2)
    assert entry["method"].endswith("TableService/Batch")
    assert len(req.ops) == 1 and req.ops[0].WhichOneof("op") == "fetch_table"
    op = req.ops[0].fetch_table
    assert op.source_id.ticket.ticket == b"s/static_mixed"
    assert op.result_id.ticket == EXPORT_1
    assert resp.result_id.ticket.ticket == EXPORT_1 and resp.success and resp.is_static and resp.size == 1000
    assert pa.ipc.read_schema(pa.py_buffer(resp.schema_header)).names == STATIC_MIXED_COLUMNS


@needs_golden
def test_configuration_constants_samples():
    calls = [c for c in NON_DATA_CALLS if c[1]["method"].endswith("GetConfigurationConstants")]
    assert len(calls) == 8
    for folder, entry in calls:
        _, parsed = _parse_all(folder, entry)
        (_, req), (_, resp) = parsed
        assert req.ByteSize() == 0
        values = resp.config_values
        assert values["barrage.version"].string_value == "1.0.0"
        assert values["deephaven.version"].string_value == "42.7"
        assert int(values["http.session.durationMs"].string_value) == 300000
        assert values["barrage.version"].WhichOneof("kind") == "string_value"


@needs_golden
def test_release_and_close_session_samples():
    entry, ((_, rel), (_, rel_resp)) = _golden_call("pydeephaven", 6)
    assert rel.id.ticket == EXPORT_1 and rel_resp.ByteSize() == 0
    closed = 0
    for folder, entry in [c for c in NON_DATA_CALLS if c[1]["method"].endswith("SessionService/CloseSession")]:
        _, parsed = _parse_all(folder, entry)
        (close,) = [msg for r, msg in parsed if r.direction == "C"]
        header = dict(entry["request_metadata"])["authorization"]
        assert header.startswith("Bearer ")
        # pydeephaven repeats its bearer header in the payload; the Java client sends it empty.
        assert close.payload == (b"" if folder.name == "barrage_java" else header.encode())
        assert all(msg.ByteSize() == 0 for r, msg in parsed if r.direction == "S")
        closed += 1
    assert closed == 7


@needs_golden
def test_list_fields_sample():
    _, ((_, req), (_, update)) = _golden_call("pydeephaven", 2)
    assert req.ByteSize() == 0
    names = [f.field_name for f in update.created]
    assert {"static_mixed", "ticking_append", "ticking_keyed", "ticking_sorted", "blink"} <= set(names)
    for f in update.created:
        assert f.typed_ticket.ticket.ticket == b"s/" + f.field_name.encode()
        assert f.typed_ticket.type == "Table"
        assert f.application_id == "scope" and f.field_description == "query scope variable"
    assert not update.updated and not update.removed


@needs_golden
def test_flight_discovery_matches_decoded_text():
    folder = GOLDEN / "flight_discovery"
    sections = decoded_sections(folder)
    seen = 0
    for entry in json.loads((folder / "index.json").read_text()):
        name = entry["method"].rpartition("/")[2]
        if name in DATA_METHODS:
            continue
        _, parsed = _parse_all(folder, entry)
        records = decoded_records(sections[entry["id"]])
        for i, (r, msg) in enumerate(parsed, start=1):
            text = "\n".join(_decoded_block(records[i]))
            if r.direction == "C":
                if name == "ListFlights":
                    assert msg.expression == b""
                else:
                    path = re.search(r"FlightDescriptor PATH(\[.*\])", text).group(1)
                    assert msg.type == flight_pb2.FlightDescriptor.PATH
                    assert str(list(msg.path)) == path
                continue
            schema = pa.ipc.read_schema(pa.py_buffer(msg.schema))
            assert msg.schema[:4] == b"\xff\xff\xff\xff"
            shown_names = re.findall(r"(\w+):", re.search(r"^schema: (.*)$", text, re.M).group(1))
            assert schema.names == [n for n in shown_names if n not in ("bits", "signed", "precision", "unit", "tz")]
            if name == "GetSchema":
                seen += 1
                continue
            assert str(list(msg.flight_descriptor.path)) == re.search(r"descriptor: PATH(\[.*\])", text).group(1)
            assert msg.flight_descriptor.type == flight_pb2.FlightDescriptor.PATH
            (ep,) = msg.endpoint
            ticket = re.search(r"endpoint: ticket=(b'[^']*') \((\d+)B\) locations=\[\]", text)
            assert repr(ep.ticket.ticket) == ticket.group(1) and len(ep.ticket.ticket) == int(ticket.group(2))
            assert not ep.location
            assert msg.total_records == int(re.search(r"total_records=(-?\d+)", text).group(1))
            assert msg.total_bytes == int(re.search(r"total_bytes=(-?\d+)", text).group(1)) == -1
            seen += 1
    assert seen == 6 + 2 + 2  # ListFlights infos, GetFlightInfo x2, GetSchema x2


@needs_golden
@pytest.mark.parametrize("folder,entry", DATA_CALLS, ids=_ids(DATA_CALLS))
def test_golden_flight_data_parses(folder, entry):
    """DoGet tickets and every FlightData of DoGet/DoExchange parse with the Flight classes.

    Deephaven's server writes an explicit empty data_body (field 1000, length 0) on
    metadata-only messages; proto3 re-serialization leaves it out, which is the only difference
    allowed here."""
    _, parsed = _parse_all(folder, entry)
    for r, msg in parsed:
        out = msg.SerializeToString()
        assert _has_no_unknown_fields(msg)
        if out != r.payload:
            assert isinstance(msg, flight_pb2.FlightData) and msg.data_body == b""
            assert r.payload == out + b"\xc2\x3e\x00"
        if isinstance(msg, flight_pb2.Ticket):
            assert msg.ticket[:1] in (b"e", b"s")
        elif r.direction == "S":
            assert msg.data_header, "server FlightData without an Arrow message header"
        else:
            # DoExchange requests: a descriptor-only opener (C++ client) or Barrage metadata.
            assert msg.app_metadata or msg.flight_descriptor.cmd == b"dphn"


# ---------------------------------------------------------------------------------------------
# Cross-checks with other implementations


def _normalized(msg_desc) -> dict:
    """A descriptor reduced to what defines the wire and the generated API (recursively)."""
    proto = descriptor_pb2.DescriptorProto()
    msg_desc.CopyToProto(proto)
    return _normalize_proto(proto)


def _normalize_proto(proto: descriptor_pb2.DescriptorProto) -> dict:
    oneofs = [o.name for o in proto.oneof_decl]
    return {
        "fields": sorted(
            (f.name, f.number, f.label, f.type, f.type_name,
             oneofs[f.oneof_index] if f.HasField("oneof_index") else None,
             f.proto3_optional, f.options.SerializeToString())
            for f in proto.field),
        "oneofs": sorted(oneofs),
        "nested": {n.name: _normalize_proto(n) for n in proto.nested_type},
        "enums": {e.name: (sorted((v.name, v.number, v.options.SerializeToString()) for v in e.value),
                           e.options.SerializeToString()) for e in proto.enum_type},
        "reserved": sorted((r.start, r.end) for r in proto.reserved_range),
        "options": proto.options.SerializeToString(),
    }


DH_MODULES = ["ticket", "config", "session", "table", "application", "storage"]


@pytest.mark.parametrize("name", DH_MODULES)
def test_messages_identical_to_pydeephaven_generated_code(name):
    theirs = pytest.importorskip(f"deephaven_core.proto.{name}_pb2")
    ours = {"ticket": ticket_pb2, "config": config_pb2, "session": session_pb2, "table": table_pb2,
            "application": application_pb2, "storage": storage_pb2}[name]
    assert ours.DESCRIPTOR.package == theirs.DESCRIPTOR.package
    assert set(ours.DESCRIPTOR.message_types_by_name) == set(theirs.DESCRIPTOR.message_types_by_name)
    for msg_name, d in ours.DESCRIPTOR.message_types_by_name.items():
        assert _normalized(d) == _normalized(theirs.DESCRIPTOR.message_types_by_name[msg_name]), msg_name
    assert ({n: sorted((v.name, v.number) for v in e.values) for n, e in ours.DESCRIPTOR.enum_types_by_name.items()}
            == {n: sorted((v.name, v.number) for v in e.values)
                for n, e in theirs.DESCRIPTOR.enum_types_by_name.items()})

    def services(mod):
        return {s.full_name: sorted((m.name, m.input_type.full_name, m.output_type.full_name,
                                     m.client_streaming, m.server_streaming) for m in s.methods)
                for s in mod.DESCRIPTOR.services_by_name.values()}

    assert services(ours) == services(theirs)


def test_flight_messages_agree_with_pyarrow_serializers():
    """pyarrow does not ship Flight.proto descriptors; its C++ serializers are compared instead."""
    flight = pytest.importorskip("pyarrow.flight")
    schema = pa.schema([("a", pa.int64()), ("b", pa.string())])
    expiry = pa.scalar(1_700_000_000_123_456_789, pa.timestamp("ns", tz="UTC"))
    endpoints = [flight.FlightEndpoint(b"s/t", ["grpc://h:1", "grpc+tls://h:2"], expiry, b"em"),
                 flight.FlightEndpoint(b"e\x01\x00\x00\x00", [])]
    info = flight.FlightInfo(schema, flight.FlightDescriptor.for_path("scope", "t"), endpoints,
                             total_records=12, total_bytes=-1, ordered=True, app_metadata=b"meta")
    ours = flight_pb2.FlightInfo.FromString(info.serialize())
    assert ours.flight_descriptor.type == flight_pb2.FlightDescriptor.PATH
    assert list(ours.flight_descriptor.path) == ["scope", "t"]
    assert pa.ipc.read_schema(pa.py_buffer(ours.schema)).equals(schema)
    assert (ours.total_records, ours.total_bytes, ours.ordered, ours.app_metadata) == (12, -1, True, b"meta")
    e0, e1 = ours.endpoint
    assert e0.ticket.ticket == b"s/t" and [loc.uri for loc in e0.location] == ["grpc://h:1", "grpc+tls://h:2"]
    assert (e0.expiration_time.seconds, e0.expiration_time.nanos) == (1_700_000_000, 123_456_789)
    assert e0.app_metadata == b"em"
    assert e1.ticket.ticket == b"e\x01\x00\x00\x00" and not e1.location and not e1.HasField("expiration_time")
    assert flight.FlightInfo.deserialize(ours.SerializeToString()) == info

    cmd = flight_pb2.FlightDescriptor.FromString(flight.FlightDescriptor.for_command(b"dphn").serialize())
    assert cmd.type == flight_pb2.FlightDescriptor.CMD and cmd.cmd == b"dphn" and not cmd.path
    ticket = flight_pb2.Ticket(ticket=b"s/static_mixed")
    assert flight.Ticket.deserialize(ticket.SerializeToString()).ticket == b"s/static_mixed"
    action = flight_pb2.Action.FromString(flight.Action("list-tables", b"body").serialize())
    assert (action.type, action.body) == ("list-tables", b"body")
    assert flight_pb2.Result.FromString(flight.Result(b"r").serialize()).body == b"r"
    auth = flight_pb2.BasicAuth.FromString(flight.BasicAuth("u", "p").serialize())
    assert (auth.username, auth.password) == ("u", "p")
    sr = flight_pb2.SchemaResult.FromString(flight.SchemaResult(schema).serialize())
    assert pa.ipc.read_schema(pa.py_buffer(sr.schema)).equals(schema)
