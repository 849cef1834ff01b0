"""Deephaven type mapping, schema metadata, schema messages, value conversion and null sentinels
(tickwire.protocol.schema)."""
from __future__ import annotations

import datetime
import decimal
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol.flight import decode_flight_data
from tickwire.protocol.schema import (
    DH_TYPE,
    arrow_type_for_deephaven,
    attributes_from_schema,
    decimal_to_deephaven_binary,
    deephaven_binary_to_decimal,
    deephaven_type_for,
    fill_sentinels,
    from_wire_array,
    from_wire_arrays,
    ipc_encapsulated_schema,
    is_list_wrapper_field,
    list_wrapped_schema,
    read_schema_message,
    schema_message,
    sentinel_for,
    sentinels_to_nulls,
    to_deephaven_schema,
    to_wire_array,
    to_wire_arrays,
    unwrap_list_schema,
    wire_type_for,
)

from .golden import GOLDEN, captures, read_cap

golden = pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")

TS_UTC = pa.timestamp("ns", "UTC")


# ----------------------------------------------------------------------------------------------
# type mapping
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arrow, dh", [
    (pa.int8(), "byte"), (pa.int16(), "short"), (pa.int32(), "int"), (pa.int64(), "long"),
    (pa.uint8(), "short"), (pa.uint16(), "char"), (pa.uint32(), "long"), (pa.uint64(), "java.math.BigInteger"),
    (pa.float16(), "float"), (pa.float32(), "float"), (pa.float64(), "double"),
    (pa.bool_(), "java.lang.Boolean"), (pa.string(), "java.lang.String"), (pa.binary(), "byte[]"),
    (pa.binary(7), "byte[]"), (pa.timestamp("ns"), "java.time.Instant"), (TS_UTC, "java.time.Instant"),
    (pa.timestamp("us", "America/New_York"), "java.time.ZonedDateTime"), (pa.date32(), "java.time.LocalDate"),
    (pa.date64(), "java.time.LocalDate"), (pa.time32("ms"), "java.time.LocalTime"),
    (pa.time64("ns"), "java.time.LocalTime"), (pa.duration("ms"), "java.time.Duration"),
    (pa.month_day_nano_interval(), "org.apache.arrow.vector.PeriodDuration"),
    (pa.decimal128(10, 2), "java.math.BigDecimal"), (pa.decimal256(50, 2), "java.math.BigDecimal"),
    (pa.list_(pa.int32()), "int[]"), (pa.list_(pa.string()), "java.lang.String[]"),
    (pa.list_(pa.list_(pa.float64())), "double[][]"), (pa.list_(pa.int64(), 3), "long[]"),
    (pa.large_list(TS_UTC), "java.time.Instant[]"), (pa.null(), "java.lang.Object"),
    (pa.map_(pa.string(), pa.int32()), "java.util.Map"),
])
def test_deephaven_type_for(arrow, dh):
    assert deephaven_type_for(arrow) == dh


def test_deephaven_type_for_special_cases():
    assert deephaven_type_for(pa.bool_(), nullable=False) == "boolean"
    assert deephaven_type_for(pa.large_string()) == "java.lang.String"
    for t in (pa.large_string(), pa.large_binary(), pa.large_list(pa.int32())):
        with pytest.raises(ProtocolError, match="64-bit offsets"):
            deephaven_type_for(t, allow_large=False)
    with pytest.raises(ProtocolError):
        deephaven_type_for(pa.dictionary(pa.int32(), pa.string()))
    with pytest.raises(ProtocolError):
        deephaven_type_for(pa.struct([pa.field("a", pa.int32())]))


@pytest.mark.parametrize("dh, arrow", [
    ("byte", pa.int8()), ("java.lang.Byte", pa.int8()), ("short", pa.int16()), ("int", pa.int32()),
    ("java.lang.Integer", pa.int32()), ("long", pa.int64()), ("char", pa.uint16()), ("float", pa.float32()),
    ("double", pa.float64()), ("java.lang.Boolean", pa.bool_()), ("boolean", pa.bool_()),
    ("java.lang.String", pa.string()), ("java.time.Instant", TS_UTC), ("java.time.ZonedDateTime", TS_UTC),
    ("java.time.LocalDate", pa.date64()), ("java.time.LocalTime", pa.time64("ns")),
    ("java.time.Duration", pa.duration("ns")), ("java.math.BigDecimal", pa.binary()),
    ("java.math.BigInteger", pa.binary()), ("byte[]", pa.binary()),
    ("org.apache.arrow.vector.PeriodDuration", pa.month_day_nano_interval()),
    ("int[]", pa.list_(pa.field("", pa.int32()))), ("java.lang.String[]", pa.list_(pa.field("", pa.string()))),
    ("io.deephaven.vector.DoubleVector", pa.list_(pa.field("", pa.float64()))),
    ("byte[][]", pa.list_(pa.field("", pa.binary()))),
    ("com.example.Custom", pa.string()),
])
def test_arrow_type_for_deephaven(dh, arrow):
    t = arrow_type_for_deephaven(dh)
    assert t == arrow
    if pa.types.is_list(t):
        assert t.value_field.name == "" and t.value_field.nullable


def test_arrow_type_for_object_vector_and_period():
    assert arrow_type_for_deephaven("io.deephaven.vector.ObjectVector", "java.time.Instant") == pa.list_(TS_UTC)
    assert arrow_type_for_deephaven("io.deephaven.vector.ObjectVector") == pa.list_(pa.string())
    with pytest.raises(ProtocolError, match="Period"):
        arrow_type_for_deephaven("java.time.Period")


@pytest.mark.parametrize("t", [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(), pa.bool_(),
    pa.string(), pa.binary(), TS_UTC, pa.date64(), pa.time64("ns"), pa.duration("ns"),
    pa.list_(pa.field("", pa.int32())), pa.list_(pa.field("", pa.string())),
])
def test_wire_types_map_back_to_themselves(t):
    assert wire_type_for(t) == t
    assert arrow_type_for_deephaven(deephaven_type_for(t)) == t


@pytest.mark.parametrize("user, wire", [
    (pa.timestamp("s"), TS_UTC), (pa.timestamp("us", "Asia/Tokyo"), TS_UTC), (pa.date32(), pa.date64()),
    (pa.time32("s"), pa.time64("ns")), (pa.time64("us"), pa.time64("ns")), (pa.duration("ms"), pa.duration("ns")),
    (pa.decimal128(12, 3), pa.binary()), (pa.uint64(), pa.binary()), (pa.uint8(), pa.int16()),
    (pa.uint32(), pa.int64()), (pa.float16(), pa.float32()), (pa.large_string(), pa.string()),
    (pa.large_binary(), pa.binary()), (pa.binary(4), pa.binary()),
    (pa.large_list(pa.large_string()), pa.list_(pa.string())), (pa.list_(pa.date32(), 2), pa.list_(pa.date64())),
    (pa.dictionary(pa.int8(), pa.string()), pa.string()),
])
def test_wire_type_for_user_types(user, wire):
    assert wire_type_for(user) == wire


# ----------------------------------------------------------------------------------------------
# schemas and metadata
# ----------------------------------------------------------------------------------------------

def _md(f: pa.Field) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (f.metadata or {}).items()}


def test_field_metadata_rules():
    schema = pa.schema([
        pa.field("Px", pa.float64()),
        pa.field("Px__TABLE_NUMBER_FORMAT", pa.string()),
        pa.field("Px__TABLE_STYLE_FORMAT", pa.int64()),
        pa.field("When", pa.timestamp("us", "Europe/Paris"), nullable=False),
        pa.field("When__TABLE_DATE_FORMAT", pa.string()),
        pa.field("__ROW__TABLE_STYLE_FORMAT", pa.int64()),
        pa.field("Arr", pa.list_(pa.int32())),
        pa.field("Strs", pa.large_list(pa.large_string())),
        pa.field("Blob", pa.binary()),
        pa.field("Dec", pa.decimal128(20, 4)),
        pa.field("Custom", pa.string(), metadata={"deephaven:type": "com.example.Thing",
                                                  "deephaven:description": "a thing"}),
    ])
    out = to_deephaven_schema(schema)
    assert all(f.nullable for f in out)
    px = _md(out.field("Px"))
    assert px == {"deephaven:isSortable": "true", "deephaven:type": "double",
                  "deephaven:numberFormatColumn": "Px__TABLE_NUMBER_FORMAT",
                  "deephaven:styleColumn": "Px__TABLE_STYLE_FORMAT"}
    assert _md(out.field("Px__TABLE_NUMBER_FORMAT"))["deephaven:isNumberFormat"] == "true"
    assert _md(out.field("Px__TABLE_STYLE_FORMAT"))["deephaven:isStyle"] == "true"
    when = _md(out.field("When"))
    assert when["deephaven:type"] == "java.time.ZonedDateTime" and when["deephaven:isSortable"] == "true"
    assert when["deephaven:dateFormatColumn"] == "When__TABLE_DATE_FORMAT"
    assert out.field("When").type == TS_UTC
    assert _md(out.field("When__TABLE_DATE_FORMAT"))["deephaven:isDateFormat"] == "true"
    row = _md(out.field("__ROW__TABLE_STYLE_FORMAT"))
    assert row["deephaven:isRowStyle"] == "true" and row["deephaven:isStyle"] == "true"
    arr = _md(out.field("Arr"))
    assert arr == {"deephaven:type": "int[]", "deephaven:componentType": "int"}
    assert out.field("Arr").type.value_field.name == "" and not out.field("Arr").type.value_field.metadata
    assert _md(out.field("Strs")) == {"deephaven:type": "java.lang.String[]",
                                      "deephaven:componentType": "java.lang.String"}
    assert out.field("Strs").type == pa.list_(pa.string())
    assert _md(out.field("Blob")) == {"deephaven:type": "byte[]"}
    assert _md(out.field("Dec")) == {"deephaven:isSortable": "true", "deephaven:type": "java.math.BigDecimal"}
    assert out.field("Dec").type == pa.binary()
    custom = _md(out.field("Custom"))
    assert custom == {"deephaven:type": "com.example.Thing", "deephaven:description": "a thing"}


def test_attributes_metadata_and_typed_round_trip():
    attrs = {"IsFlat": True, "BlinkTable": True, "AddOnly": False, "AppendOnly": True,
             "SortedColumns": "SortVal=Ascending", "Size": 12, "Ratio": 0.5, "Small": np.int16(7),
             "F": np.float32(1.5), "Lookup": object()}
    out = to_deephaven_schema(pa.schema([pa.field("a", pa.int32())]), attrs)
    md = {k.decode(): v.decode() for k, v in out.metadata.items()}
    assert md["deephaven:attribute.IsFlat"] == "true"
    assert md["deephaven:attribute_type.IsFlat"] == "java.lang.Boolean"
    assert md["deephaven:attribute.AddOnly"] == "false"
    assert md["deephaven:attribute_type.SortedColumns"] == "java.lang.String"
    assert md["deephaven:attribute_type.Size"] == "java.lang.Long"
    assert md["deephaven:attribute_type.Ratio"] == "java.lang.Double"
    assert md["deephaven:attribute_type.Small"] == "java.lang.Short"
    assert md["deephaven:attribute_type.F"] == "java.lang.Float"
    assert md["deephaven:unsent.attribute.Lookup"] == ""
    assert "deephaven:attribute.Lookup" not in md
    back = attributes_from_schema(out)
    assert back == {"IsFlat": True, "BlinkTable": True, "AddOnly": False, "AppendOnly": True,
                    "SortedColumns": "SortVal=Ascending", "Size": 12, "Ratio": 0.5, "Small": 7, "F": 1.5}
    bad = pa.schema([], metadata={"deephaven:attribute.X": "abc", "deephaven:attribute_type.X": "java.lang.Integer"})
    with pytest.raises(ProtocolError):
        attributes_from_schema(bad)


def _golden_schema(folder: str, method: str, call: int = 0) -> pa.Schema:
    path = captures(method)
    path = [p for p in path if p.parent.name == folder][call]
    rec = next(r for r in read_cap(path) if r.direction == "S")
    return read_schema_message(decode_flight_data(rec.payload).data_header)


STATIC_MIXED = pa.schema([
    ("I8", pa.int8()), ("I16", pa.int16()), ("I32", pa.int32()), ("I64", pa.int64()), ("F32", pa.float32()),
    ("F64", pa.float64()), ("Bool", pa.bool_()), ("Str", pa.large_string()), ("Ts", pa.timestamp("us")),
    ("Ch", pa.uint16()),
])


@golden
def test_schema_equals_the_golden_static_mixed_schema():
    expected = _golden_schema("flight_doget", "FlightService_DoGet")
    ours = to_deephaven_schema(STATIC_MIXED, {"IsFlat": True})
    assert ours.equals(expected, check_metadata=True)
    assert [dict(f.metadata) for f in ours] == [dict(f.metadata) for f in expected]
    assert dict(ours.metadata) == dict(expected.metadata)


@golden
def test_list_wrapped_schema_equals_the_golden_columns_as_list_schema():
    plain = _golden_schema("flight_doget", "FlightService_DoGet")
    wrapped = _golden_schema("ticking_static_mixed", "FlightService_DoExchange")
    ours = list_wrapped_schema(plain)
    assert ours.equals(wrapped, check_metadata=True)
    for a, b in zip(ours, wrapped):
        assert not a.nullable and a.metadata == b.metadata
        assert a.type.value_field.name == a.name and a.type.value_field.metadata == b.type.value_field.metadata
        assert is_list_wrapper_field(a)
    assert unwrap_list_schema(wrapped).equals(plain, check_metadata=True)
    assert not any(is_list_wrapper_field(f) for f in to_deephaven_schema(pa.schema([("L", pa.list_(pa.int32()))])))
    with pytest.raises(ProtocolError):
        unwrap_list_schema(plain)


def _first_bytes_field(payload: bytes) -> bytes:
    assert payload[0] == 0x0A
    length, shift, pos = 0, 0, 1
    while True:
        b = payload[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return payload[pos:pos + length]


@golden
def test_ipc_encapsulated_schema_from_get_schema_and_flight_info():
    seen = 0
    for path in captures("FlightService_GetSchema") + captures("FlightService_GetFlightInfo"):
        for rec in read_cap(path):
            if rec.direction != "S":
                continue
            raw = _first_bytes_field(rec.payload)  # SchemaResult.schema / FlightInfo.schema (field 1)
            assert raw[:4] == b"\xff\xff\xff\xff" and len(raw) % 8 == 0
            assert struct.unpack_from("<i", raw, 4)[0] <= len(raw) - 8
            schema = read_schema_message(raw)
            assert all(DH_TYPE in f.metadata for f in schema)
            ours = ipc_encapsulated_schema(schema)
            assert ours[:4] == b"\xff\xff\xff\xff" and len(ours) % 8 == 0
            assert struct.unpack_from("<i", ours, 4)[0] == len(ours) - 8
            assert read_schema_message(ours).equals(schema, check_metadata=True)
            seen += 1
    assert seen >= 4
    # GetSchema of static_mixed gives the same schema as its DoGet stream
    get_schema = next(p for p in captures("FlightService_GetSchema") if p.name.startswith("0004"))
    rec = next(r for r in read_cap(get_schema) if r.direction == "S")
    assert read_schema_message(_first_bytes_field(rec.payload)).equals(
        _golden_schema("flight_doget", "FlightService_DoGet"), check_metadata=True)


def test_schema_message_forms():
    schema = to_deephaven_schema(STATIC_MIXED, {"BlinkTable": True})
    raw = schema_message(schema)
    enc = ipc_encapsulated_schema(schema)
    assert raw[:4] != b"\xff\xff\xff\xff"
    assert enc[8:8 + len(raw)] == raw and set(enc[8 + len(raw):]) <= {0}
    for form in (raw, enc, memoryview(enc), bytearray(raw)):
        assert read_schema_message(form).equals(schema, check_metadata=True)
    from tickwire.protocol.batches import HEADER_SCHEMA, read_message_header
    info = read_message_header(raw)
    assert info.header_type == HEADER_SCHEMA and info.body_length == 0 and info.version == 4


@pytest.mark.parametrize("bad", [b"", b"\x00" * 4, b"\xff\xff\xff\xff\x40\x00\x00\x00" + b"\x00" * 16,
                                 b"\xff\xff\xff\xff\x08\x00\x00\x00" + b"\x01" * 8, b"\x04\x00\x00\x00" * 10])
def test_malformed_schema_messages(bad):
    with pytest.raises(ProtocolError):
        read_schema_message(bad)


def test_record_batch_header_is_not_a_schema():
    from tickwire.protocol.batches import encode_record_batch
    with pytest.raises(ProtocolError):
        read_schema_message(encode_record_batch([pa.array([1], pa.int32())]).header)


# ----------------------------------------------------------------------------------------------
# BigDecimal / BigInteger
# ----------------------------------------------------------------------------------------------

_CTX = decimal.Context(prec=200)


def _java_big_decimal(v: decimal.Decimal) -> bytes:
    """Reference: scale after stripTrailingZeros, then BigInteger.toByteArray of the unscaled value."""
    if v == 0:
        unscaled, scale = 0, 0
    else:
        sign, digits, exp = _CTX.normalize(v).as_tuple()
        unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
        scale = -exp
    n = (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
    return struct.pack("<i", scale) + unscaled.to_bytes(n, "big", signed=True)


def test_big_decimal_known_encodings():
    arr = pa.array([decimal.Decimal(x) for x in ["1.50", "-1.50", "0.000", "100.00", "-128.00", "127", "-0.01"]]
                   + [None], pa.decimal128(20, 3))
    out = decimal_to_deephaven_binary(arr).to_pylist()
    assert out == [b"\x01\x00\x00\x00\x0f", b"\x01\x00\x00\x00\xf1", b"\x00\x00\x00\x00\x00",
                   b"\xfe\xff\xff\xff\x01", b"\x00\x00\x00\x00\x80", b"\x00\x00\x00\x00\x7f",
                   b"\x02\x00\x00\x00\xff", None]
    wire = decimal_to_deephaven_binary(arr)
    offs = np.frombuffer(wire.buffers()[1], np.int32, count=len(arr) + 1)
    assert offs[-1] == offs[-2]  # a null holds no bytes


_decimals = st.decimals(min_value=-10**25, max_value=10**25, places=6, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.none() | _decimals, max_size=40), st.integers(0, 5))
def test_big_decimal_matches_reference_and_round_trips(values, start):
    arr = pa.array(values, pa.decimal128(38, 6))
    sl = arr.slice(min(start, len(arr)))
    for a in (arr, sl):
        wire = decimal_to_deephaven_binary(a)
        assert wire.to_pylist() == [None if v is None else _java_big_decimal(v) for v in a.to_pylist()]
        back = deephaven_binary_to_decimal(wire)
        assert pa.types.is_decimal128(back.type)
        assert back.to_pylist() == a.to_pylist()  # Decimal equality is numeric
        exact = deephaven_binary_to_decimal(wire, pa.decimal128(38, 6))
        assert exact.equals(a)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | st.decimals(min_value=-10**60, max_value=10**60, places=10, allow_nan=False,
                                        allow_infinity=False), max_size=20))
def test_big_decimal_256(values):
    arr = pa.array(values, pa.decimal256(72, 10))
    wire = to_wire_array(arr)
    assert wire.to_pylist() == [None if v is None else _java_big_decimal(v) for v in values]
    assert from_wire_array(wire, "java.math.BigDecimal", target_type=pa.decimal256(72, 10)).equals(arr)


def test_small_decimal_types():
    for t in (pa.decimal32(7, 2), pa.decimal64(15, 3)):
        vals = [decimal.Decimal("12.34"), decimal.Decimal("-0.50"), None, decimal.Decimal("0")]
        arr = pa.array(vals, pa.decimal128(7, 2)).cast(t)
        assert to_wire_array(arr).to_pylist() == [None if v is None else _java_big_decimal(v) for v in vals]


def test_big_decimal_decode_errors():
    with pytest.raises(ProtocolError, match="at least 5"):
        deephaven_binary_to_decimal(pa.array([b"\x00\x00\x00\x00"], pa.binary()))
    scale9 = pa.array([struct.pack("<i", 9) + b"\x01"], pa.binary())
    with pytest.raises(ProtocolError, match="scale"):
        deephaven_binary_to_decimal(scale9, pa.decimal128(20, 2))
    huge = pa.array([struct.pack("<i", 0) + b"\x7f" + b"\xff" * 40], pa.binary())
    with pytest.raises(ProtocolError):
        deephaven_binary_to_decimal(huge)
    # negative scales (1E+3) become scale 0
    negative_scale = pa.array([struct.pack("<i", -3) + b"\x01"])
    assert deephaven_binary_to_decimal(negative_scale).to_pylist() == [decimal.Decimal(1000)]


def test_big_integer_from_uint64():
    vals = [0, 1, 127, 128, 255, 2**63, 2**64 - 1, None]
    wire = to_wire_array(pa.array(vals, pa.uint64()))
    assert wire.to_pylist() == [None if v is None else v.to_bytes((v.bit_length() // 8) + 1, "big") for v in vals]
    assert from_wire_array(wire, "java.math.BigInteger", target_type=pa.uint64()).to_pylist() == vals
    natural = from_wire_array(wire, "java.math.BigInteger")
    assert natural.type.scale == 0 and [None if v is None else int(v) for v in natural.to_pylist()] == vals
    neg = pa.array([(-5).to_bytes(1, "big", signed=True), (-300).to_bytes(2, "big", signed=True)], pa.binary())
    assert from_wire_array(neg, "java.math.BigInteger", target_type=pa.int64()).to_pylist() == [-5, -300]


# ----------------------------------------------------------------------------------------------
# value conversion
# ----------------------------------------------------------------------------------------------

def test_to_wire_array_conversions():
    ts = pa.array([1_000_000, None, -5], pa.timestamp("us", "America/New_York"))
    w = to_wire_array(ts)
    assert w.type == TS_UTC and w.cast(pa.int64()).to_pylist() == [1_000_000_000, None, -5000]
    d = to_wire_array(pa.array([datetime.date(1970, 1, 2), None], pa.date32()))
    assert d.type == pa.date64() and d.view(pa.int64()).to_pylist() == [86_400_000, None]
    t = to_wire_array(pa.array([1, None], pa.time32("s")))
    assert t.type == pa.time64("ns") and t.view(pa.int64()).to_pylist() == [1_000_000_000, None]
    du = to_wire_array(pa.array([3, None], pa.duration("ms")))
    assert du.type == pa.duration("ns") and du.view(pa.int64()).to_pylist() == [3_000_000, None]
    assert to_wire_array(pa.array(["a", None], pa.large_string())).type == pa.string()
    assert to_wire_array(pa.array([b"ab", b"cd"], pa.binary(2))).to_pylist() == [b"ab", b"cd"]
    assert to_wire_array(pa.array([1, 255], pa.uint8())).type == pa.int16()
    assert to_wire_array(pa.array([2**32 - 1], pa.uint32())).to_pylist() == [2**32 - 1]
    dic = pa.array(["x", "y", None, "x"]).dictionary_encode()
    assert to_wire_array(dic).to_pylist() == ["x", "y", None, "x"]
    nested = pa.array([["a", None], None, []], pa.large_list(pa.large_string()))
    wn = to_wire_array(nested)
    assert wn.type == pa.list_(pa.field("", pa.string())) and wn.to_pylist() == [["a", None], None, []]
    ld = pa.array([[datetime.date(2000, 1, 1)], None], pa.list_(pa.date32())).slice(0)
    wl = to_wire_array(ld)
    assert wl.type == pa.list_(pa.field("", pa.date64())) and wl.to_pylist() == ld.to_pylist()
    chunked = pa.chunked_array([pa.array([1], pa.uint8()), pa.array([2], pa.uint8())])
    assert to_wire_array(chunked).to_pylist() == [1, 2]


def test_wire_arrays_are_returned_without_copy():
    for arr in (pa.array([1, 2], pa.int32()), pa.array(["a"]), pa.array([1], TS_UTC),
                pa.array([[1]], pa.list_(pa.field("", pa.int32())))):
        assert to_wire_array(arr) is arr


def test_to_and_from_wire_arrays_restore_a_user_table():
    user = pa.table({
        "ts": pa.array([1, None, 3], pa.timestamp("ms", "Europe/London")),
        "d": pa.array([datetime.date(2024, 2, 29), None, datetime.date(1969, 12, 31)], pa.date32()),
        "dec": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-7.00")], pa.decimal128(9, 2)),
        "u8": pa.array([1, 2, None], pa.uint8()),
        "big": pa.array([2**64 - 1, 0, None], pa.uint64()),
        "ls": pa.array([["x"], None, ["y", None]], pa.large_list(pa.large_string())),
        "t": pa.array([1, 2, None], pa.time32("ms")),
    })
    wire_schema = to_deephaven_schema(user.schema)
    wire = to_wire_arrays(user)
    assert [a.type for a in wire] == [f.type for f in wire_schema]
    back = from_wire_arrays(wire, wire_schema, user.schema)
    assert pa.Table.from_arrays(back, schema=user.schema).equals(user)
    natural = from_wire_arrays(wire, list_wrapped_schema(wire_schema))
    assert natural[1].type == pa.date32() and natural[1].to_pylist() == user["d"].to_pylist()
    assert natural[2].to_pylist() == [decimal.Decimal("1.25"), None, decimal.Decimal("-7")]
    with pytest.raises(ValueError):
        from_wire_arrays(wire[:2], wire_schema)


# ----------------------------------------------------------------------------------------------
# null sentinels
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("t, sentinel, raw", [
    (pa.int8(), -128, b"\x80"), (pa.int16(), -32768, b"\x00\x80"), (pa.int32(), -2**31, b"\x00\x00\x00\x80"),
    (pa.int64(), -2**63, b"\x00" * 7 + b"\x80"), (pa.uint16(), 0xFFFF, b"\xff\xff"),
    (pa.float32(), -3.4028234663852886e+38, b"\xff\xff\x7f\xff"),
    (pa.float64(), -1.7976931348623157e+308, b"\xff\xff\xff\xff\xff\xff\xef\xff"),
    (TS_UTC, -2**63, b"\x00" * 7 + b"\x80"), (pa.date64(), -2**63, b"\x00" * 7 + b"\x80"),
    (pa.time64("ns"), -2**63, b"\x00" * 7 + b"\x80"), (pa.duration("ns"), -2**63, b"\x00" * 7 + b"\x80"),
])
def test_sentinels(t, sentinel, raw):
    assert sentinel_for(t) == sentinel
    storage = {1: pa.int8(), 2: pa.int16(), 4: pa.int32(), 8: pa.int64()}[len(raw)]
    if pa.types.is_floating(t) or pa.types.is_unsigned_integer(t):
        storage = t
    arr = pa.array([None, 1, None, 2], storage).view(t) if storage != t else pa.array([None, 1, None, 2], t)
    filled = fill_sentinels(arr.slice(0))
    assert filled.null_count == 2 and filled.type == t
    data = filled.buffers()[1].to_pybytes()[filled.offset * len(raw):]
    assert data[:len(raw)] == raw and data[2 * len(raw):3 * len(raw)] == raw
    assert filled.equals(arr)  # nulls kept
    unmarked = pa.Array.from_buffers(t, 4, [None, filled.buffers()[1]], offset=filled.offset)
    back = sentinels_to_nulls(unmarked)
    assert back.equals(arr)
    assert sentinels_to_nulls(unmarked, deephaven_type_for(t) if t != pa.int64() else "java.lang.Long").equals(arr)


def test_sentinel_helpers_on_slices_and_other_types():
    arr = pa.array([5, None, 7, None, 9], pa.int32()).slice(1, 3)
    filled = fill_sentinels(arr)
    assert np.frombuffer(filled.buffers()[1], np.int32, count=3).tolist() == [-2**31, 7, -2**31]
    assert filled.to_pylist() == [None, 7, None]
    strings = pa.array(["a", None])
    assert fill_sentinels(strings) is strings
    assert sentinels_to_nulls(strings, "java.lang.String") is strings
    plain = pa.array([1, 2], pa.int32())
    assert fill_sentinels(plain) is plain and sentinels_to_nulls(plain) is plain
    # a column whose Deephaven type has no sentinel keeps its values
    assert sentinels_to_nulls(pa.array([-2**63], pa.int64()), "com.example.Id").to_pylist() == [-2**63]
    lists = pa.array([[1, -2**31], None, [-2**31]], pa.list_(pa.int32()))
    assert sentinels_to_nulls(lists, "int[]").to_pylist() == [[1, None], None, [None]]
    assert sentinels_to_nulls(lists, "io.deephaven.vector.IntVector").to_pylist() == [[1, None], None, [None]]
    chars = pa.array([65, 0xFFFF], pa.uint16())
    assert sentinels_to_nulls(chars, "char").to_pylist() == [65, None]
    nan = pa.array([float("nan"), -3.4028234663852886e+38], pa.float32())
    out = sentinels_to_nulls(nan, "float")
    assert out.null_count == 1 and np.isnan(out[0].as_py())
