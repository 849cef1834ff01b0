"""Decimal, timestamp, date, time, duration, unsigned integer, float16, fixed_size_binary,
fixed_size_list and list columns uploaded with DoPut, read back by DoGet, GetFlightInfo,
`list-tables`, tickwire's Barrage client and pydeephaven (docs/types.md).

Deephaven 42.7 keeps the Arrow schema of an upload (its `BarrageSchema` table attribute) and
serves the table with exactly those types; it refuses decimal32/decimal64 columns and times of
day outside one day, and reads uint16 0xFFFF and list elements equal to a null sentinel as null.
The tickwire tests run always; the same uploads against a real Deephaven
server (tests/interop/dh_server.py) are `slow` and must give the same answers, nulls included.
"""
from __future__ import annotations

import datetime
import json
import struct
import threading
from decimal import Decimal

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire.clients.client import BarrageClient
from tickwire.server.app import TickwireServer
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine, EngineConfig

D = Decimal
_TS = [datetime.datetime(2024, 1, 2, 3, 4, 5), None, datetime.datetime(1969, 12, 31, 23, 59, 59)]
_DATES = [datetime.date(2024, 1, 2), None, datetime.date(1960, 1, 1)]

#: column -> (values, deephaven:type); every column has a null in row 1
ACCEPTED: dict[str, tuple[pa.Array, str]] = {
    "Dec10_2": (pa.array([D("1.50"), None, D("-12345678.99")], pa.decimal128(10, 2)), "java.math.BigDecimal"),
    "Dec38_10": (pa.array([D("1234567890123456789012345678.0123456789"), None, D("-0.0000000001")],
                          pa.decimal128(38, 10)), "java.math.BigDecimal"),
    "Dec5_0": (pa.array([D("100"), None, D("0")], pa.decimal128(5, 0)), "java.math.BigDecimal"),
    "Dec5_m2": (pa.array([D("1E+2"), None, D("-3E+4")], pa.decimal128(5, -2)), "java.math.BigDecimal"),
    "Dec256": (pa.array([D("1.5"), None, D("-2")], pa.decimal256(50, 5)), "java.math.BigDecimal"),
    "TsS": (pa.array(_TS, pa.timestamp("s")), "java.time.Instant"),
    "TsMs": (pa.array(_TS, pa.timestamp("ms")), "java.time.Instant"),
    "TsUs": (pa.array(_TS, pa.timestamp("us")), "java.time.Instant"),
    "TsNs": (pa.array(_TS, pa.timestamp("ns")), "java.time.Instant"),
    "TsSUtc": (pa.array(_TS, pa.timestamp("s", "UTC")), "java.time.Instant"),
    "TsNsUtc": (pa.array(_TS, pa.timestamp("ns", "UTC")), "java.time.Instant"),
    "TsMsNy": (pa.array(_TS, pa.timestamp("ms", "America/New_York")), "java.time.ZonedDateTime"),
    "TsNsNy": (pa.array(_TS, pa.timestamp("ns", "America/New_York")), "java.time.ZonedDateTime"),
    "Date32": (pa.array(_DATES, pa.date32()), "java.time.LocalDate"),
    "Date64": (pa.array(_DATES, pa.date64()), "java.time.LocalDate"),
    "TimeS": (pa.array([datetime.time(1, 2, 3), None, datetime.time(0)], pa.time32("s")), "java.time.LocalTime"),
    "TimeMs": (pa.array([datetime.time(1, 2, 3, 4000), None, datetime.time(0)], pa.time32("ms")),
               "java.time.LocalTime"),
    "TimeUs": (pa.array([datetime.time(1, 2, 3, 4), None, datetime.time(0)], pa.time64("us")), "java.time.LocalTime"),
    "TimeNs": (pa.array([1, None, 86_399_999_999_999], pa.time64("ns")), "java.time.LocalTime"),
    "DurS": (pa.array([1, None, -5], pa.duration("s")), "java.time.Duration"),
    "DurMs": (pa.array([1, None, -5], pa.duration("ms")), "java.time.Duration"),
    "U8": (pa.array([1, None, 255], pa.uint8()), "short"),
    "U16": (pa.array([1, None, 65534], pa.uint16()), "char"),
    "U32": (pa.array([1, None, 2**32 - 1], pa.uint32()), "long"),
    "U64": (pa.array([1, None, 2**64 - 1], pa.uint64()), "java.math.BigInteger"),
    "F16": (pa.array([1.5, None, -2.0], pa.float16()), "float"),
    "Fsb": (pa.array([b"abc", None, b"\x00\xff\x01"], pa.binary(3)), "byte[]"),
    "FslI32": (pa.array([[1, 2], None, [3, None]], pa.list_(pa.int32(), 2)), "int[]"),
    "FslU8": (pa.array([[1, 255], None, [None, 0]], pa.list_(pa.uint8(), 2)), "short[]"),
    "FslF16": (pa.array([[1.5, None], None, [0.0, 2.0]], pa.list_(pa.float16(), 2)), "float[]"),
    "FslFsb": (pa.array([[b"a", b"b"], None, [None, b"c"]], pa.list_(pa.binary(1), 2)), "byte[][]"),
    "ListU8": (pa.array([[1, 255], None, [None, 0]], pa.list_(pa.uint8())), "short[]"),
    "ListU32": (pa.array([[1, 2**32 - 1], None, []], pa.list_(pa.uint32())), "long[]"),
    "ListU64": (pa.array([[1, 2**64 - 1], None, [None]], pa.list_(pa.uint64())), "java.math.BigInteger[]"),
    "ListF16": (pa.array([[1.5, -2.0], None, [None]], pa.list_(pa.float16())), "float[]"),
    "ListFsb": (pa.array([[b"ab", b"cd"], None, [None]], pa.list_(pa.binary(2))), "byte[][]"),
    "ListFsl": (pa.array([[[1, 2]], None, [None, [3, None]]], pa.list_(pa.list_(pa.int32(), 2))), "int[][]"),
    "ListListU8": (pa.array([[[1]], None, [None, [2, None]]], pa.list_(pa.list_(pa.uint8()))), "short[][]"),
    "ListI32": (pa.array([[1, 2], None, [None]], pa.list_(pa.int32())), "int[]"),
    "ListStr": (pa.array([["a"], None, [None, ""]], pa.list_(pa.string())), "java.lang.String[]"),
}

#: uploads whose values Deephaven reads as null: column -> (values, what comes back). A uint16 is a
#: `char`, whose null is 0xFFFF; list elements are Java primitives with their null sentinels.
NULLED: dict[str, tuple[pa.Array, list]] = {
    "U16Max": (pa.array([65535, None, 0], pa.uint16()), [None, None, 0]),
    "ListU16Max": (pa.array([[1, 65535], None, [None, 0]], pa.list_(pa.uint16())), [[1, None], None, [None, 0]]),
    "FslI32Min": (pa.array([[1, -2**31], None, [None, 0]], pa.list_(pa.int32(), 2)), [[1, None], None, [None, 0]]),
    "ListI32Min": (pa.array([[1, -2**31], None, [None]], pa.list_(pa.int32())), [[1, None], None, [None]]),
}

#: uploads Deephaven refuses (INVALID_ARGUMENT)
REFUSED: dict[str, pa.Array] = {
    "Dec32": pa.array([D("1.5"), None], pa.decimal32(5, 1)),
    "Dec64": pa.array([D("1.5"), None], pa.decimal64(15, 1)),
    "TimeTooLate": pa.array([0, 90_000], pa.time32("s")),
    "TimeNegative": pa.array([0, -1], pa.time64("us")),
}


def accepted_table() -> pa.Table:
    return pa.table({name: arr for name, (arr, _dh) in ACCEPTED.items()})


class _Bearer(fl.ClientMiddlewareFactory):
    """Sends `Anonymous` first, then the bearer token the server answered with (one session)."""

    def __init__(self):
        self.token = b"Anonymous"

    def start_call(self, info):
        return _BearerCall(self)


class _BearerCall(fl.ClientMiddleware):
    def __init__(self, factory: _Bearer):
        self.factory = factory

    def sending_headers(self):
        return {"authorization": self.factory.token}

    def received_headers(self, headers):
        for v in headers.get("authorization", ()):
            self.factory.token = v if isinstance(v, bytes) else v.encode()


class Uploader:
    """DoPut / DoGet / GetFlightInfo on export tickets of one session."""

    def __init__(self, target: str):
        self.target = target
        self.client = fl.FlightClient(f"grpc://{target}", middleware=[_Bearer()])
        self.next_id = 0

    def put(self, data: pa.Table) -> int:
        self.next_id += 1
        writer, _ = self.client.do_put(fl.FlightDescriptor.for_path("export", str(self.next_id)), data.schema)
        writer.write_table(data)
        writer.close()
        return self.next_id

    def get(self, export_id: int) -> pa.Table:
        return self.client.do_get(fl.Ticket(b"e" + struct.pack("<i", export_id))).read_all()

    def info_schema(self, export_id: int) -> pa.Schema:
        return self.client.get_flight_info(fl.FlightDescriptor.for_path("export", str(export_id))).schema

    def refusal(self, data: pa.Table) -> str:
        """The error a refused upload ends with (the test fails if it is accepted)."""
        try:
            self.put(data)
        except fl.FlightError as exc:
            return f"{type(exc).__name__}: {exc}"
        except pa.ArrowInvalid as exc:
            return f"ArrowInvalid: {exc}"
        raise AssertionError(f"the upload of {data.schema} was accepted")

    def close(self) -> None:
        self.client.close()


def answer(t: pa.Table) -> dict[str, tuple[str, str, list]]:
    """Column -> (Arrow type, deephaven:type, values)."""
    return {f.name: (str(f.type), (f.metadata or {}).get(b"deephaven:type", b"").decode(),
                     t.column(f.name).to_pylist()) for f in t.schema}


def values(t: pa.Table) -> dict[str, tuple[str, list]]:
    return {f.name: (str(f.type), t.column(f.name).to_pylist()) for f in t.schema}


def expected_answer() -> dict[str, tuple[str, str, list]]:
    return {name: (str(arr.type), dh, arr.to_pylist()) for name, (arr, dh) in ACCEPTED.items()}


# -- tickwire -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tickwire():
    engine = Engine(interval_ms=50)
    server = TickwireServer(engine, port=0).start()
    try:
        yield server
    finally:
        server.stop()
        engine.stop()


@pytest.fixture(scope="module")
def tw(tickwire):
    up = Uploader(f"127.0.0.1:{tickwire.port}")
    yield up
    up.close()


def test_doget_and_flight_info_answer_the_uploaded_types(tw):
    i = tw.put(accepted_table())
    got = answer(tw.get(i))
    assert got == expected_answer()
    schema = tw.info_schema(i)
    assert [str(f.type) for f in schema] == [str(arr.type) for arr, _dh in ACCEPTED.values()]


def test_list_tables_subscriptions_and_snapshots_agree_with_doget(tickwire, tw):
    data = accepted_table()
    writer, _ = tw.client.do_put(fl.FlightDescriptor.for_path("scope", "kept_types"), data.schema)
    writer.write_table(data)
    writer.close()
    flight = fl.FlightClient(f"grpc://127.0.0.1:{tickwire.port}")
    try:
        opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
        doget = flight.do_get(fl.Ticket(b"s/kept_types"), opts).read_all()
        assert answer(doget) == expected_answer()
        (result,) = list(flight.do_action(fl.Action("list-tables", b""), opts))
        listed = {t["name"]: t for t in json.loads(result.body.to_pybytes())}["kept_types"]
        assert [(c["name"], c["type"]) for c in listed["columns"]] == [(f.name, str(f.type)) for f in doget.schema]
        info = flight.get_flight_info(fl.FlightDescriptor.for_path("scope", "kept_types"), opts)
        assert info.schema.equals(doget.schema, check_metadata=True)
        assert flight.get_schema(fl.FlightDescriptor.for_path("scope", "kept_types"), opts).schema.equals(
            doget.schema, check_metadata=True)
    finally:
        flight.close()
    # tickwire's client reads every LocalDate as date32, its natural type for them
    natural = data.set_column(data.schema.get_field_index("Date64"), "Date64", data.column("Date64").cast(pa.date32()))
    with BarrageClient(f"127.0.0.1:{tickwire.port}") as client:
        assert values(client.snapshot("kept_types")) == values(natural)
        sub = client.subscribe("kept_types")
        try:
            assert sub.wait_for(lambda s: s.size == data.num_rows, 10), sub.error
            assert values(sub.table) == values(natural)
        finally:
            sub.close()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_uploads_name_the_column_and_type(tw, name):
    arr = REFUSED[name]
    msg = tw.refusal(pa.table({name: arr}))
    assert "invalid argument" in msg.lower() or "INVALID_ARGUMENT" in msg, msg
    assert repr(name) in msg and str(arr.type) in msg, msg


def test_served_types_keep_only_an_upload_schemas_types():
    """A table of tickwire's own (no upload schema) still sends Deephaven's wire types."""
    from tickwire.protocol.schema import served_types

    schema = accepted_table().schema
    def wire_list(t):
        return pa.list_(pa.field("", t))

    assert served_types(schema) == [pa.binary()] * 5 + [pa.timestamp("ns", "UTC")] * 8 + [pa.date64()] * 2 \
        + [pa.time64("ns")] * 4 + [pa.duration("ns")] * 2 \
        + [pa.int16(), pa.uint16(), pa.int64(), pa.binary(), pa.float32(), pa.binary()] \
        + [wire_list(pa.int32()), wire_list(pa.int16()), wire_list(pa.float32()), wire_list(pa.binary())] \
        + [wire_list(pa.int16()), wire_list(pa.int64()), wire_list(pa.binary()), wire_list(pa.float32()),
           wire_list(pa.binary()), wire_list(wire_list(pa.int32())), wire_list(wire_list(pa.int16())),
           wire_list(pa.int32()), wire_list(pa.string())]
    assert served_types(schema, {"BarrageSchema": schema}) == list(schema.types)


def test_fixed_size_lists_and_binaries_round_trip_through_record_batches():
    """Barrage record batches carry fixed_size_list (validity, then list_size values per row) and
    fixed_size_binary (byte_width bytes per row), slices and empty columns included."""
    from tickwire.protocol.batches import decode_record_batch, encode_record_batch

    cols = [ACCEPTED[n][0] for n in ("Fsb", "FslI32", "FslFsb", "ListFsl")]
    types = [c.type for c in cols]
    for part in (list(cols), [c.slice(1, 2) for c in cols], [c.slice(3) for c in cols],
                 [c.slice(1, 2) if i % 2 else None for i, c in enumerate(cols)]):
        enc = encode_record_batch(part, types)
        back = decode_record_batch(enc.header, enc.body(), types)
        for sent, got, t in zip(part, back, types):
            assert got.to_pylist() == ([] if sent is None else sent.to_pylist()), t
    zero = pa.array([b"", None, b""], pa.binary(0))
    enc = encode_record_batch([zero], [zero.type])
    assert decode_record_batch(enc.header, enc.body(), [zero.type])[0].to_pylist() == [b"", None, b""]


def test_sentinel_values_come_back_null(tw):
    """uint16 0xFFFF (Deephaven's null char) and list elements equal to their type's null sentinel."""
    got = values(tw.get(tw.put(pa.table({n: arr for n, (arr, _) in NULLED.items()}))))
    assert got == {n: (str(arr.type), want) for n, (arr, want) in NULLED.items()}


# -- the same uploads against Deephaven ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def dh(deephaven_server):
    return deephaven_server


@pytest.fixture(scope="module")
def dh_up(dh):
    up = Uploader(dh.target)
    yield up
    up.close()


@pytest.mark.slow
@pytest.mark.interop
def test_deephaven_answers_what_tickwire_answers(dh_up, tw):
    data = accepted_table()
    theirs = dh_up.get(dh_up.put(data))
    ours = tw.get(tw.put(data))
    assert answer(theirs) == expected_answer()  # what docs/types.md records
    assert answer(ours) == answer(theirs)
    assert [f.type for f in dh_up.info_schema(dh_up.next_id)] == [f.type for f in ours.schema]
    nulled = pa.table({n: arr for n, (arr, _) in NULLED.items()})
    theirs = values(dh_up.get(dh_up.put(nulled)))
    assert theirs == {n: (str(arr.type), want) for n, (arr, want) in NULLED.items()}
    assert values(tw.get(tw.put(nulled))) == theirs
    for name, arr in REFUSED.items():
        assert "invalid argument" in dh_up.refusal(pa.table({name: arr})).lower(), name


@pytest.mark.slow
@pytest.mark.interop
def test_pydeephaven_reads_the_same_from_both(dh, tickwire):
    pydeephaven = pytest.importorskip("pydeephaven")
    data = accepted_table()
    got = {}
    for kind, port in (("deephaven", dh.port), ("tickwire", tickwire.port)):
        session = pydeephaven.Session(host="127.0.0.1", port=port)
        try:
            got[kind] = answer(session.import_table(data).to_arrow())
        finally:
            session.close()
    assert got["deephaven"] == expected_answer()
    assert got["tickwire"] == got["deephaven"]


#: the columns of ACCEPTED kept since unsigned integers, float16 and fixed-size types are (a table of
#: them also round-trips through a Parquet checkpoint, which decimal(5, -2) cannot be written to)
_FIXED_SIZE_AND_UNSIGNED = [n for n in ACCEPTED if n.startswith(("U", "F", "List"))]


@pytest.mark.parametrize("checkpoint", [False, True], ids=["journal", "checkpoint"])
def test_a_durable_upload_keeps_its_types_across_a_restart(tmp_path, checkpoint):
    """The upload's schema (the types it is served with) is part of the table's stored metadata;
    the rows come back from the journal, or from a checkpoint, with those types."""
    def serve(port=0):  # a server that builds its own engine on the data directory (stopped with it)
        config = ServerConfig(port=port, web=False, engine=EngineConfig(interval_ms=50, data_dir=tmp_path))
        return TickwireServer(config=config).start()

    data = accepted_table().select(_FIXED_SIZE_AND_UNSIGNED) if checkpoint else accepted_table()
    auth = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    server = serve()
    port = server.port
    try:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "kept"), data.schema, options=auth)
        writer.write_table(data)
        writer.close()
        before = answer(client.do_get(fl.Ticket(b"s/kept"), options=auth).read_all())
        assert before == {n: a for n, a in expected_answer().items() if n in data.column_names}
        if checkpoint:
            storage = server.engine.storage
            assert storage.checkpoint(server.engine.resolve("kept"))
            storage.wait_checkpoints()
            assert list((tmp_path / "default" / "kept" / "checkpoints").glob("*.parquet"))
    finally:
        server.stop()
    server = serve(port)
    try:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        assert answer(client.do_get(fl.Ticket(b"s/kept"), options=auth).read_all()) == before
    finally:
        server.stop()


# -- maps, unions, list_views and nulls ---------------------------------------------------------------------

_I32_MIN = -(2**31)


def _dense(codes, offsets, members, names, type_codes=None):
    return pa.UnionArray.from_dense(pa.array(codes, pa.int8()), pa.array(offsets, pa.int32()), members, names,
                                    type_codes)


def _sparse(codes, members, names, type_codes=None):
    return pa.UnionArray.from_sparse(pa.array(codes, pa.int8()), members, names, type_codes)


#: columns Deephaven 42.7 keeps from an upload in these types (measured against it, see
#: tests/test_doput_conformance.py): column -> (values, deephaven:type); each has 3 rows
UPLOAD_ONLY: dict[str, tuple[pa.Array, str]] = {
    "Map": (pa.array([[("a", 1), ("b", None)], None, []], pa.map_(pa.string(), pa.int32())), "java.util.Map"),
    "MapU8": (pa.array([[(1, 2**64 - 1)], None, [(255, None)]], pa.map_(pa.uint8(), pa.uint64())), "java.util.Map"),
    "MapList": (pa.array([[("a", [1, None])], None, [("b", None)]], pa.map_(pa.string(), pa.list_(pa.int32()))),
                "java.util.Map"),
    "Dense": (_dense([5, 7, 5], [0, 0, 1], [pa.array([1, None], pa.int64()), pa.array(["x"])], ["i", "s"], [5, 7]),
              "java.lang.Object"),
    "Sparse": (_sparse([0, 1, 0], [pa.array([1, 2, None], pa.int64()), pa.array(["x", "y", "z"])], ["i", "s"]),
               "java.lang.Object"),
    "SparseList": (_sparse([0, 1, 0], [pa.array([[1], None, [2, None]], pa.list_(pa.int32())),
                                       pa.array(["x", "y", "z"])], ["l", "s"]), "java.lang.Object"),
    "SparseU8": (_sparse([0, 1, 0], [pa.array([1, 2, 255], pa.uint8()), pa.array(["x", "y", "z"])], ["u", "s"]),
                 "java.lang.Object"),
    "ListView": (pa.array([[1, 2], None, [None]], pa.list_view(pa.int32())), "int[]"),
    "ListViewU8": (pa.array([[1, 255], None, []], pa.list_view(pa.uint8())), "short[]"),
    "ListViewStr": (pa.array([["a"], None, []], pa.list_view(pa.string())), "java.lang.String[]"),
    "ListViewListView": (pa.array([[[1]], None, [None]], pa.list_view(pa.list_view(pa.int32()))), "int[][]"),
    "ListMap": (pa.array([[[("a", 1)]], None, [None]], pa.list_(pa.map_(pa.string(), pa.int32()))),
                "java.util.Map[]"),
    "ListNull": (pa.array([[None], None, []], pa.list_(pa.null())), "java.lang.Object[]"),
    "Null": (pa.nulls(3), "java.lang.Object"),
    "ListUnion": (pa.ListArray.from_arrays(pa.array([0, 1, 1, 3], pa.int32()), _sparse(
        [0, 1, 0], [pa.array([1, 2, None], pa.int64()), pa.array(["x", "y", "z"])], ["i", "s"])), "java.lang.Object[]"),
    "MapUnion": (pa.MapArray.from_arrays(pa.array([0, 1, 1, 2], pa.int32()), pa.array(["a", "b"]), _dense(
        [0, 1], [0, 0], [pa.array([1], pa.int64()), pa.array(["y"])], ["i", "s"])), "java.util.Map"),
    "UnionUnion": (_sparse([0, 1, 0], [_sparse([1, 0, 0], [pa.array([1, 2, 3], pa.int64()), pa.array(["x", "y", "z"])],
                                               ["i", "s"]), pa.array([None, "b", "c"])], ["u", "s"]),
                   "java.lang.Object"),
}

#: uploads of these types whose values Deephaven reads as null: a map's values (not its keys), a
#: list_view's elements and a union's members (instants too) equal to their type's null sentinel
UPLOAD_ONLY_NULLED: dict[str, tuple[pa.Array, list]] = {
    "MapSentinel": (pa.array([[("a", _I32_MIN), ("b", 2)], None], pa.map_(pa.string(), pa.int32())),
                    [[("a", None), ("b", 2)], None]),
    "MapChar": (pa.array([[(65535, 65535)], None], pa.map_(pa.uint16(), pa.uint16())), [[(65535, None)], None]),
    "ListViewChar": (pa.array([[65535, 1], None], pa.list_view(pa.uint16())), [[None, 1], None]),
    "UnionChar": (_sparse([0, 1], [pa.array([65535, 1], pa.uint16()), pa.array(["x", "y"])], ["c", "s"]),
                  [None, "y"]),
    "UnionInstant": (_dense([0, 1], [0, 0], [pa.array([-(2**63)], pa.timestamp("ns")), pa.array(["y"])], ["t", "s"]),
                     [None, "y"]),
    "UnionInt": (_dense([0, 0], [0, 1], [pa.array([_I32_MIN, 3], pa.int32()), pa.array(["y"])], ["i", "s"]),
                 [None, 3]),
}

#: uploads Deephaven refuses although pydeephaven sends them (INVALID_ARGUMENT): 64-bit offsets
#: anywhere, decimal32/64 within lists, maps and unions, structs anywhere but a map's entries
REFUSED_NESTED: dict[str, pa.Array] = {
    "LargeListView": pa.array([[1], None], pa.large_list_view(pa.int32())),
    "LargeList": pa.array([[1], None], pa.large_list(pa.int32())),
    "LargeStr": pa.array(["a", None], pa.large_string()),
    "LargeBin": pa.array([b"a", None], pa.large_binary()),
    "ListViewLargeStr": pa.array([["a"], None], pa.list_view(pa.large_string())),
    "ListDec32": pa.array([[D("1.5")], None], pa.list_(pa.decimal32(5, 1))),
    "FslDec64": pa.array([[D("1.5")], None], pa.list_(pa.decimal64(5, 1), 1)),
    "MapDec32": pa.array([[("a", D("1.5"))], None], pa.map_(pa.string(), pa.decimal32(5, 1))),
    "UnionDec32": _sparse([0, 1], [pa.array([1, 2], pa.int64()), pa.array([D("1.5"), None], pa.decimal32(5, 1))],
                          ["i", "d"]),
    "ListStruct": pa.array([[{"a": 1}], None], pa.list_(pa.struct([("a", pa.int32())]))),
    "MapStruct": pa.array([[("a", {"x": 1})], None], pa.map_(pa.string(), pa.struct([("x", pa.int32())]))),
    "UnionStruct": _sparse([0, 1], [pa.array([{"a": 1}, {"a": 2}]), pa.array(["x", "y"])], ["st", "s"]),
}


def upload_only_table() -> pa.Table:
    return pa.table({name: arr for name, (arr, _dh) in UPLOAD_ONLY.items()})


def expected_upload_only() -> dict[str, tuple[str, str, list]]:
    return {name: (str(arr.type), dh, arr.to_pylist()) for name, (arr, dh) in UPLOAD_ONLY.items()}


def test_maps_unions_list_views_and_nulls_are_kept(tw):
    i = tw.put(upload_only_table())
    got = tw.get(i)
    assert answer(got) == expected_upload_only()
    assert [f.type for f in got.schema] == [arr.type for arr, _dh in UPLOAD_ONLY.values()]
    assert [f.type for f in tw.info_schema(i)] == [arr.type for arr, _dh in UPLOAD_ONLY.values()]
    # Deephaven names java.lang.String the component of Object[] and java.util.Map[]
    assert {f.name: f.metadata.get(b"deephaven:componentType") for f in got.schema
            if f.name in ("ListNull", "ListMap", "ListView")} == \
        {"ListNull": b"java.lang.String", "ListMap": b"java.lang.String", "ListView": b"int"}


def test_upload_only_types_over_several_batches_and_slices(tw):
    """Batches of slices (offsets into members and children) are stored and served row for row."""
    data = upload_only_table()
    writer, _ = tw.client.do_put(fl.FlightDescriptor.for_path("export", "900"), data.schema)
    for start, length in ((1, 2), (0, 1), (2, 1), (0, 3)):
        writer.write_batch(data.slice(start, length).to_batches()[0])
    writer.close()
    got = tw.get(900)
    want = pa.concat_tables([data.slice(1, 2), data.slice(0, 1), data.slice(2, 1), data])
    assert values(got) == values(want)


def barrage_updates(target: str, headers: list, ticket: bytes, count: int, *, columns=None, viewport=None,
                    then=None) -> tuple[pa.Schema, list]:
    """The schema and the first `count` updates of a Barrage subscription (DoExchange) to `ticket`,
    read with tickwire.protocol's decoder; `then()` runs once the first update arrived."""
    import grpc

    from tickwire.protocol.opening import exchange_opening, subscription_request
    from tickwire.protocol.update import StreamDecoder

    channel = grpc.insecure_channel(target)
    call = channel.stream_stream("/arrow.flight.protocol.FlightService/DoExchange",
                                 request_serializer=lambda b: b, response_deserializer=lambda b: b)
    done = threading.Event()

    def requests():
        yield from exchange_opening(subscription_request(ticket, columns=columns, viewport=viewport))
        done.wait(60)  # the subscription lasts while the request stream is open

    responses = call(requests(), metadata=headers, timeout=60)
    decoder = StreamDecoder()
    updates: list = []
    try:
        for raw in responses:
            update = decoder.feed(raw)
            if update is None:
                continue
            updates.append(update)
            if len(updates) == count:
                break
            if len(updates) == 1 and then is not None:
                then()
    finally:
        done.set()
        responses.cancel()
        channel.close()
    assert decoder.schema is not None
    return decoder.schema, updates


def test_upload_only_types_in_subscriptions_and_snapshots(tickwire, tw):
    data = upload_only_table()
    writer, _ = tw.client.do_put(fl.FlightDescriptor.for_path("scope", "upload_only"), data.schema)
    writer.write_table(data)
    writer.close()
    more = data.slice(1, 2)

    def put_more():
        w, _ = tw.client.do_put(fl.FlightDescriptor.for_path("scope", "upload_only"), data.schema)
        w.write_table(more)
        w.close()

    target = f"127.0.0.1:{tickwire.port}"
    schema, (snapshot, added) = barrage_updates(target, [("authorization", "Anonymous")], b"s/upload_only", 2,
                                                then=put_more)
    assert [f.type for f in schema] == list(data.schema.types)
    assert values(snapshot.added_table(schema)) == values(data)
    assert values(added.added_table(schema)) == values(more)
    # a viewport of some columns
    cols = [data.schema.get_field_index(n) for n in ("Dense", "Map", "Null", "ListView")]
    schema, (view,) = barrage_updates(target, [("authorization", "Anonymous")], b"s/upload_only", 1,
                                      columns=cols, viewport=[(1, 3)])
    got = {n: view.added[i].to_pylist() for i, n in enumerate(schema.names) if i in cols}
    assert got == {n: pa.concat_tables([data, more]).column(n).to_pylist()[1:4]
                   for n in ("Dense", "Map", "Null", "ListView")}
    # tickwire's client reads the columns it holds (maps, list_views, nulls)
    plain = [n for n in data.column_names if not pa.types.is_union(data.schema.field(n).type)]
    with BarrageClient(target) as client:
        assert values(client.snapshot("upload_only", columns=plain)) == values(
            pa.concat_tables([data, more]).select(plain))


def test_upload_only_sentinel_values_come_back_null(tw):
    got = values(tw.get(tw.put(pa.table({n: arr for n, (arr, _) in UPLOAD_ONLY_NULLED.items()}))))
    assert got == {n: (str(arr.type), want) for n, (arr, want) in UPLOAD_ONLY_NULLED.items()}


@pytest.mark.parametrize("name", sorted(REFUSED_NESTED))
def test_refused_nested_and_large_types_name_the_column_and_type(tw, name):
    arr = REFUSED_NESTED[name]
    msg = tw.refusal(pa.table({name: arr}))
    assert "invalid argument" in msg.lower() or "INVALID_ARGUMENT" in msg, msg
    assert repr(name) in msg and str(arr.type) in msg, msg


def test_a_refusal_ends_the_call_before_the_client_does(tw):
    """The refusal of a schema is the DoPut call's own status, sent as soon as the schema is read:
    the client has neither written a batch nor half-closed when it arrives."""
    schema = pa.schema([("LV", pa.large_list_view(pa.int32()))])
    opts = fl.FlightCallOptions(timeout=30)
    writer, reader = tw.client.do_put(fl.FlightDescriptor.for_path("export", "901"), schema, opts)
    assert reader.read() is None  # the server ended the call
    with pytest.raises(pa.ArrowInvalid) as err:  # (pyarrow's INVALID_ARGUMENT)
        writer.close()
    assert "'LV'" in str(err.value) and "large_list_view<item: int32>" in str(err.value), err.value
    # the export the upload named fails with that refusal: a call naming it hears it at once
    with pytest.raises(pa.ArrowInvalid) as err:
        tw.get(901)
    assert "'LV'" in str(err.value) and "large_list_view" in str(err.value), err.value


def test_union_map_and_list_view_columns_keep_their_rows_through_overwrites_and_compactions():
    """Maps, list_views and columns holding unions keep the Arrow arrays written: rows overwritten many times (more
    chunks and more replaced rows than the column keeps) come back as last written."""
    import numpy as np

    from tickwire.server.engine.graph.column_store import ColumnStore

    names = ["Dense", "Sparse", "ListUnion", "MapUnion", "UnionUnion", "Map", "MapList", "ListView", "ListViewStr"]
    data = pa.table({n: UPLOAD_ONLY[n][0] for n in names})
    store = ColumnStore(data.schema, capacity=16)
    expected = {}
    rng = np.random.default_rng(7)
    for step in range(200):
        slots = rng.choice(40, size=3, replace=False).astype(np.int64)
        rows = data.take(pa.array(rng.permutation(3)))
        store.write(slots, rows)
        for slot, row in zip(slots.tolist(), rows.to_pylist()):
            expected[slot] = row
        if step % 50 == 49:
            keys = np.array(sorted(expected), dtype=np.int64)
            got = store.gather(keys)
            assert got.schema == data.schema
            assert got.to_pylist() == [expected[k] for k in keys.tolist()]
    column = store.columns[0]
    assert len(column.chunks) <= column.max_chunks


def test_tables_without_the_upload_schema_send_java_text_and_lists():
    """What a table made from an upload by head, tail or view sends for these types (as
    Deephaven does): utf8 toString() of maps, unions and nulls, lists for list_views."""
    from tickwire.protocol.schema import to_wire_array, wire_type_for

    want = {
        "Map": ["{a=1, b=null}", None, "{}"], "MapU8": ["{1=18446744073709551615}", None, "{255=null}"],
        "Dense": ["1", "x", None], "Sparse": ["1", "y", None], "SparseU8": ["1", "y", "255"],
        "ListView": [[1, 2], None, [None]], "ListViewListView": [[[1]], None, [None]],
        "ListMap": [["{a=1}"], None, [None]], "Null": [None, None, None], "ListUnion": [["1"], [], ["y", None]],
        "MapUnion": ["{a=1}", "{}", "{b=y}"], "UnionUnion": ["x", "b", "3"],
    }
    for name, values_ in want.items():
        arr = UPLOAD_ONLY[name][0]
        for start in (0, 1):
            wire = to_wire_array(arr.slice(start))
            wire.validate(full=True)
            assert wire.type == wire_type_for(arr.type), name
            assert wire.to_pylist() == values_[start:], name
    floats = _sparse([0, 0, 0, 1], [pa.array([1.0, 1.5, -3.0, None]), pa.array(["a", "b", "c", "d"])], ["f", "s"])
    assert to_wire_array(floats).to_pylist() == ["1.0", "1.5", "-3.0", "d"]
    from tickwire.errors import ProtocolError
    with pytest.raises(ProtocolError, match="no Java text"):
        to_wire_array(UPLOAD_ONLY["MapList"][0])
