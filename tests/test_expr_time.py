"""Instants, Deephaven's time constants and chars in formulas, and instant texts as Deephaven's
DateTimeUtils.parseInstant reads them (TimeTable start times, instant literals), in process. The
expected values are the ones a real Deephaven 42.7 gave (tests/test_expr_conformance.py compares
the same forms with a running one)."""
from __future__ import annotations

import re

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from tests.harness import Services
from tickwire.protocol.proto import table_pb2
from tickwire.protocol.proto.methods import TABLE_SERVICE
from tickwire.protocol.tickets import export_ticket
from tickwire.server.services.dh_expr import (
    INSTANT_LIMIT,
    ExpressionError,
    java_zone,
    parse_column_specs,
    parse_filter,
    parse_instant,
)

NS = 10 ** 9
T0 = 1_700_000_400 * NS  # 2023-11-14T22:20:00Z
MIN = -(2 ** 63)

D = pa.table({
    "Id": pa.array(range(6), pa.int32()),
    "I8": pa.array([None, -127, 127, 0, 5, -5], pa.int8()),
    "I32": pa.array([None, -2 ** 31 + 1, 2 ** 31 - 1, 0, 65, 65535], pa.int32()),
    "I64": pa.array([None, -2 ** 63 + 1, 2 ** 63 - 1, 0, 65, 65536], pa.int64()),
    "F64": pa.array([None, 1.5, -0.0, 65.7, 1e300, float("nan")], pa.float64()),
    "Ts": pa.array([None, 0, T0, T0 + 1, -1, 5], pa.timestamp("ns", "UTC")),
    "C": pa.array([None, 65, 0, 97, 65534, 48], pa.uint16()),
})


def column(spec: str, data: pa.Table = D) -> pa.ChunkedArray:
    """The column X of `spec` (specs separated by ';'), evaluated on `data`; instants as nanoseconds."""
    cols = {name: expr if expr is not None else pc.field(source)
            for name, expr, source in parse_column_specs(spec.split(";"), data.schema)}
    out = ds.dataset(data).to_table(columns=cols).column("X")
    return out.cast(pa.int64()) if pa.types.is_timestamp(out.type) else out


def typed(spec: str):
    x = column(spec)
    return x.type, x.to_pylist()


# -- instant texts ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, nanos", [
    # ISO forms (java.time's ISO zoned date-time: two-digit fields, offsets +hh[:mm[:ss]], a zone in brackets)
    ("2023-01-01T11:00:00Z", 1_672_570_800 * NS), ("2023-01-01T11:00Z", 1_672_570_800 * NS),
    ("2023-01-01t11:00:00z", 1_672_570_800 * NS), ("2023-01-01T11:00:00.Z", 1_672_570_800 * NS),
    ("2023-01-01T11:00:00+01", 1_672_567_200 * NS), ("2023-01-01T11:00:00+01:30:15", 1_672_565_385 * NS),
    ("2023-01-01T11:00:00-00:00", 1_672_570_800 * NS), ("2023-01-01T11:00:00+18:00", 1_672_506_000 * NS),
    ("2023-01-01T11:00:00.123456789Z", 1_672_570_800_123_456_789),
    ("2023-01-01T11:00:00-05:00[America/New_York]", 1_672_588_800 * NS),
    ("2023-01-01T11:00:00+05:00[America/New_York]", 1_672_552_800 * NS),  # the offset decides
    ("2023-01-01T11:00:00Z[+01:00]", 1_672_570_800 * NS),
    # a local date-time and a zone: Deephaven's aliases, Java's zone ids and offsets
    ("2023-01-01T11:00 ET", 1_672_588_800 * NS), ("2023-02-01T11:00:34.001 PT", 1_675_278_034_001_000_000),
    ("2023-01-01T11:00 CT", 1_672_592_400 * NS), ("2023-01-01T11:00 MT", 1_672_596_000 * NS),
    ("2023-01-01T11:00 HK", 1_672_542_000 * NS), ("2023-01-01T11:00 JP", 1_672_538_400 * NS),
    ("2023-01-01T11:00 LON", 1_672_570_800 * NS), ("2023-01-01T11:00 America/New_York", 1_672_588_800 * NS),
    ("2023-01-01T11:00 US/Eastern", 1_672_588_800 * NS), ("2023-01-01T11:00 EST5EDT", 1_672_588_800 * NS),
    ("2023-01-01T11:00 CET", 1_672_567_200 * NS), ("2023-01-01T11:00 Etc/GMT+5", 1_672_588_800 * NS),
    ("2023-01-01T11:00 UTC", 1_672_570_800 * NS), ("2023-01-01T11:00 GMT", 1_672_570_800 * NS),
    ("2023-01-01T11:00 UT", 1_672_570_800 * NS), ("2023-01-01T11:00 GMT0", 1_672_570_800 * NS),
    ("2023-01-01T11:00 UTC+01:00", 1_672_567_200 * NS), ("2023-01-01T11:00 GMT+1", 1_672_567_200 * NS),
    ("2023-01-01T11:00 +05:30", 1_672_551_000 * NS), ("2023-01-01T11:00 +0130", 1_672_565_400 * NS),
    ("2023-01-01T11:00 +013015", 1_672_565_385 * NS), ("2023-01-01T11:00 +1", 1_672_567_200 * NS),
    ("2023-01-01T11:00 -3", 1_672_581_600 * NS), ("2023-01-01T11:00 -18:00", 1_672_635_600 * NS),
    # one-digit fields, seconds without a fraction digit, a lower-case t
    ("2023-1-1T1:2 ET", 1_672_552_920 * NS), ("2023-01-01T11:00:5.5 ET", 1_672_588_805_500_000_000),
    ("2023-01-01T11:00:00. ET", 1_672_588_800 * NS), ("2023-01-01t11:00 ET", 1_672_588_800 * NS),
    # a date and a zone: its midnight there
    ("2023-01-01 ET", 1_672_549_200 * NS), ("2023-01-01T ET", 1_672_549_200 * NS),
    ("2023-01-01 UTC", 1_672_531_200 * NS),
    # a day past the month's end is its last day, 24:00 the next midnight (not in the ISO form)
    ("2023-02-30T11:00 ET", 1_677_600_000 * NS), ("2024-02-30T11:00 ET", 1_709_222_400 * NS),
    ("2023-04-31 ET", 1_682_827_200 * NS), ("2023-02-29 ET", 1_677_560_400 * NS),
    ("2023-01-01T24:00 ET", 1_672_635_600 * NS), ("2023-01-01T24:00:00.000 ET", 1_672_635_600 * NS),
    # daylight-saving changes: a skipped local time moves later by the gap, a repeated one takes the
    # earlier offset
    ("2023-03-12T02:30 ET", 1_678_606_200 * NS), ("2023-11-05T01:30 ET", 1_699_162_200 * NS),
    ("2023-03-26T01:30 LON", 1_679_794_200 * NS), ("2023-10-29T01:30 Europe/London", 1_698_539_400 * NS),
    # epoch numbers: the unit by the size; Deephaven multiplies in long arithmetic (wrapping around)
    ("12345", 12_345 * NS), ("09", 9 * NS), ("-5", -5 * NS), ("1", NS), ("1700000000", 1_700_000_000 * NS),
    ("1700000000000", 1_700_000_000 * NS), ("1700000000000000", 1_700_000_000 * NS),
    ("1700000000000000000", 1_700_000_000 * NS), ("9300000000000000", -9_146_744_073_709_551_616),
    # the edges of the long range; its minimum is Deephaven's null
    ("1677-09-21T00:12:43.145224193Z", MIN + 1), ("1677-09-21T00:12:43.145224192Z", None),
    ("-9223372036854775808", None), ("2262-04-11T23:47:15.999999999Z", INSTANT_LIMIT - 1),
])
def test_instant_texts_as_deephaven_reads_them(text, nanos):
    assert parse_instant(text) == nanos


@pytest.mark.parametrize("text", [
    "2023-01-01T11Z", "2023-01-01T11:00:00+0130", "2023-01-01T11:00:00+1", "2023-01-01T11:00:00+01:3",
    "2023-01-01T11:00:00+19:00", "2023-01-01T11:00:00[Europe/Paris]", "2023-01-01T11:00:00Z[ET]",
    "2023-02-30T11:00:00Z", "2023-01-01T24:00:00Z", "2023-01-01T1:00:00Z", "+2023-01-01T11:00:00Z",
    "2023-01-01T11:00 Z", "2023-01-01T11:00 america/new_york", "2023-01-01T11:00 et", "2023-01-01T11:00 EST",
    "2023-01-01T11:00 MST", "2023-01-01T11:00 PST", "2023-01-01T11:00 ROC", "2023-01-01T11:00 UTC0",
    "2023-01-01T11:00 UTC+", "2023-01-01T11:00 +18:01", "2023-01-01T11:00 utc", "2023-01-01T11:00 UTC ET",
    "2023-01-01 11:00 ET", "2023-01-01T11:00.5 ET", "2023-01-01T11:00:00.1234567891 ET", "2023-01-01",
    "2023-01-01T11:00", "2023-01-01T11:00  ET", " 2023-01-01T11:00 ET", "2023-01-01T11:00 ET ",
    "2023-01-01T24:00:01 ET", "2023-01-01T24:00:00.1 ET", "2023-01-01T23:59:60 ET", "2023-01-32T11:00 ET",
    "2023-13-01T11:00 ET", "2023-01-01 Etc/GMT+5", "2023-01-01 +05:00", "9223372036854775808", "",
    "2023-01-01T11:00 posix/America/New_York", "2023-01-01T11:00 ../zoneinfo/UTC", "٢٠٢٣-01-01T11:00 ET",
])
def test_texts_deephaven_does_not_read_as_instants_are_refused_by_name(text):
    with pytest.raises(ExpressionError, match=re.escape(repr(text))):
        parse_instant(text)


def test_instants_beyond_the_long_range_are_refused():
    for text in ("2262-04-11T23:47:16.854775808Z", "1600-01-01T00:00Z", "3000-01-01T00:00 ET"):
        with pytest.raises(ExpressionError, match="out of range"):
            parse_instant(text)


def test_time_zones_as_deephaven_names_them():
    assert java_zone("ET") == java_zone("America/New_York") is not None
    assert java_zone("LON") == java_zone("Europe/London") is not None
    for name in ("et", "EST", "Z", "", "+", "GMT+", "UTC0", "+19", "+1:00", "America/new_york", "localtime"):
        assert java_zone(name) is None, name
    assert java_zone("Z", aliases=False) is not None  # in brackets, as java.time reads a zone id
    assert java_zone("ET", aliases=False) is None


# -- the time constants ----------------------------------------------------------------------------

def test_time_constants_are_long_nanoseconds_and_double_reciprocals():
    assert typed("X = SECOND") == (pa.int64(), [NS] * 6)
    assert typed("X = YEAR_AVG")[1][0] == 31_556_952_000_000_000
    assert typed("X = WEEK / DAY") == (pa.float64(), [7.0] * 6)
    assert typed("X = MICRO + MILLI") == (pa.int64(), [1_001_000] * 6)
    assert typed("X = YEARS_PER_NANO_365") == (pa.float64(), [3.170979198376459e-17] * 6)
    assert typed("X = MINUTES_PER_NANO")[1][0] == 1.6666666666666667e-11
    assert typed("X = I32 * SECOND")[1] == [None, (-2 ** 31 + 1) * NS, (2 ** 31 - 1) * NS, 0, 65 * NS, 65535 * NS]
    # a column of the same name (of the table or made before) hides the constant
    data = D.append_column("HOUR", pa.array([1] * 6, pa.int32()))
    assert column("X = HOUR", data).to_pylist() == [1] * 6
    assert typed("SECOND = 5;X = SECOND") == (pa.int32(), [5] * 6)
    with pytest.raises(ExpressionError, match="unknown column 'NANO'"):
        column("X = NANO")


# -- instants in formulas --------------------------------------------------------------------------

def test_instant_casts_and_literals():
    assert typed("X = (Instant)'2024-06-15T10:00:00Z' + Id * SECOND") == (
        pa.int64(), [1_718_445_600 * NS + i * NS for i in range(6)])
    assert column("X = '2024-06-15T10:00:00Z' + Id * SECOND").to_pylist() == \
        column("X = (java.time.Instant)'2024-06-15T10:00:00Z' + Id * SECOND").to_pylist()
    assert column("X = (Instant)Ts").to_pylist() == [None, 0, T0, T0 + 1, -1, 5]
    x = column("X = (Instant)null").to_pylist()
    assert x == [None] * 6
    assert column("X = '2023-11-14T17:20 ET'").to_pylist() == [T0] * 6
    assert column("X = '2023-03-12T02:30 ET' - '2023-03-12T01:30 ET'").to_pylist() == [3600 * NS] * 6
    for spec, words in [("X = (Instant)I64", "(Instant) of int64"), ("X = (Instant)'A'", "(Instant) of uint16"),
                        ("X = (long)Ts", "(long) of timestamp"), ("X = '2023-11-14T17:20 EST'", "not an instant"),
                        ("X = '2262-04-11T23:47:16Z'", "beyond what a column holds")]:
        with pytest.raises(ExpressionError, match=re.escape(words)):
            column(spec)


def test_instant_plus_and_minus_integer_nanoseconds():
    # nulls on either side give null, negative offsets move back, smaller integers widen
    assert column("X = Ts + I32").to_pylist() == [None, -2 ** 31 + 1, T0 + 2 ** 31 - 1, T0 + 1, 64, 65540]
    assert column("X = Ts - I8").to_pylist() == [None, 127, T0 - 127, T0 + 1, -6, 10]
    assert column("X = '2024-06-15T10:00:00Z' + I32").to_pylist()[0] is None
    assert column("X = Ts + (long)null").to_pylist() == [None] * 6
    assert column("X = Ts + C").to_pylist() == [None, 65, T0, T0 + 98, 65533, 53]
    assert column("X = Ts - HOUR").to_pylist()[2] == T0 - 3600 * NS
    # below the long range Deephaven's conversion wraps around; the minimum long is null
    assert column("X = Ts - 9223372036854775807L").to_pylist() == [None, MIN + 1, T0 + MIN + 1, T0 + MIN + 2, None,
                                                                    MIN + 6]
    data = pa.table({"Ts": pa.array([-6 * 1], pa.timestamp("ns", "UTC"))})
    assert column("X = Ts - 9223372036854775807L", data).to_pylist() == [2 ** 63 - 5]
    # an instant from 2262-04-11T23:47:16Z on fails the evaluation, as in Deephaven
    assert column("X = Ts + 9223372035999999999L", D.slice(1, 1)).to_pylist() == [INSTANT_LIMIT - 1]
    for spec, rows in [("X = Ts + 9223372036000000000L", slice(1, 2)), ("X = Ts + I64", slice(2, 3)),
                       ("X = Ts - I64", slice(1, 2)), ("X = Ts + 9223372036854775807L", slice(4, 5))]:
        with pytest.raises(pa.ArrowInvalid, match="DateTimeOverflowException"):
            column(spec, D[rows])
    # reached only where the conditional operator evaluates it
    assert column("X = Id == 2 ? null : Ts + I64", D.slice(0, 4)).to_pylist() == [None, MIN + 1, None, T0 + 1]


def test_instant_differences_are_long_nanoseconds():
    assert typed("X = Ts - Ts") == (pa.int64(), [None, 0, 0, 0, 0, 0])
    assert column("X = Ts - '2024-06-15T10:00:00Z'").to_pylist()[1:3] == [-1_718_445_600 * NS,
                                                                           T0 - 1_718_445_600 * NS]
    assert column("X = (Ts - '2023-11-14T22:19:59Z') / SECOND").to_pylist()[2:4] == [1.0, 1.000000001]
    # the minimum long is null; a difference beyond the long range, or an instant beyond a column's,
    # fails
    data = pa.table({"A": pa.array([-1, 0], pa.timestamp("ns", "UTC")),
                     "B": pa.array([2 ** 63 - 1, 2 ** 63 - 1], pa.timestamp("ns", "UTC"))})
    with pytest.raises(pa.ArrowInvalid, match="DateTimeOverflowException"):
        column("X = A - B", data)
    data = pa.table({"A": pa.array([-1], pa.timestamp("ns", "UTC")),
                     "B": pa.array([INSTANT_LIMIT - 1], pa.timestamp("ns", "UTC"))})
    assert column("X = A - B", data).to_pylist() == [-1 - INSTANT_LIMIT + 1]
    with pytest.raises(pa.ArrowInvalid, match="DateTimeOverflowException"):
        column("X = Ts - '2262-04-11T23:47:16Z'")


@pytest.mark.parametrize("spec, words", [
    ("X = I64 + Ts", "'+' of int64 and timestamp"), ("X = Ts + Ts", "'+' of two instants"),
    ("X = Ts * 2", "'*' of timestamp"), ("X = Ts + null", "an instant and null"), ("X = Ts + 1.5", "and double"),
    ("X = Ts + F64", "and double"), ("X = -Ts", "unary minus"),
])
def test_instant_arithmetic_deephaven_refuses_is_refused(spec, words):
    with pytest.raises(ExpressionError, match=re.escape(words)):
        column(spec)


def test_instant_filters_read_zones_and_arithmetic():
    def ids(text):
        return D.filter(parse_filter(text, D.schema)).column("Id").to_pylist()

    assert ids("Ts == '2023-11-14T17:20 ET'") == [2]
    assert ids("Ts in '2023-11-14T17:20 ET', '1970-01-01 UTC'") == [1, 2]
    assert ids("Ts + SECOND > '2023-11-14T22:20:00Z'") == [2, 3]
    assert ids("Ts - Ts == 0") == [1, 2, 3, 4, 5]


# -- chars -----------------------------------------------------------------------------------------

def test_char_casts_keep_the_low_bits_and_0xffff_is_null():
    assert typed("X = (char)I32") == (pa.uint16(), [None, 1, None, 0, 65, None])
    assert typed("X = (char)I64") == (pa.uint16(), [None, 1, None, 0, 65, 0])
    assert typed("X = (char)I8") == (pa.uint16(), [None, 65409, 127, 0, 5, 65531])
    assert typed("X = (char)F64") == (pa.uint16(), [None, 1, 0, 65, None, 0])  # through int, NaN is 0
    assert typed("X = (char)65535") == (pa.uint16(), [None] * 6)
    assert typed("X = (char)null") == (pa.uint16(), [None] * 6)
    assert typed("X = (short)(char)I8") == (pa.int16(), [None, -127, 127, 0, 5, -5])
    assert typed("X = (int)C") == (pa.int32(), [None, 65, 0, 97, 65534, 48])


def test_chars_are_numbers_promoted_to_int():
    assert typed("X = 'A'") == (pa.uint16(), [65] * 6)
    assert typed("X = 'A' + 'B'") == (pa.int32(), [131] * 6)
    assert typed("X = C + 1") == (pa.int32(), [None, 66, 1, 98, 65535, 49])
    assert typed("X = (char)I32 / 2") == (pa.float64(), [None, 0.5, None, 0.0, 32.5, None])
    assert typed("X = C == 'A'") == (pa.bool_(), [False, True, False, False, False, False])
    assert typed("X = C < 'B'")[1] == [True, True, True, False, False, True]  # null is below everything
    assert typed("X = min((char)I32, C)") == (pa.uint16(), [None, 1, 0, 0, 65, 48])
    assert typed("X = max(C, 3)") == (pa.int32(), [3, 65, 3, 97, 65534, 48])
    assert typed("X = abs(C)") == (pa.uint16(), [None, 65, 0, 97, 65534, 48])
    assert typed("X = isFinite(C)")[1] == [False, True, True, True, True, True]
    # the conditional operator: a null char of the narrower branch is its raw 0xFFFF, as in Deephaven
    assert typed("X = Id > 2 ? (char)I32 : 5") == (pa.int32(), [5, 5, 5, 0, 65, 65535])
    assert typed("X = Id > 2 ? 'A' : C") == (pa.uint16(), [None, 65, 0, 65, 65, 65])
    ids = D.filter(parse_filter("C in 'A', 'a'", D.schema)).column("Id").to_pylist()
    assert ids == [1, 3]


@pytest.mark.parametrize("spec, words", [
    ("X = -C", "unary minus"), ("X = Id > 2 ? C : I8", "'?:' of uint16 and int8"),
    ("X = Id > 2 ? (char)I32 : (short)I32", "'?:' of uint16 and int16"), ("X = (String)C", "(String) of uint16"),
    ("X = 'AB'", "not an instant"), ("X = ''", "not a char literal"), ("X = '\\'", "not a char literal"),
    ("X = '\uffff'", "not a char literal"), ("X = '\U0001F600'", "not a char literal"),
])
def test_char_forms_deephaven_refuses_are_refused(spec, words):
    with pytest.raises(ExpressionError, match=re.escape(words)):
        column(spec)


def test_casts_of_null_are_nulls_of_the_type():
    for cast, t in [("int", pa.int32()), ("long", pa.int64()), ("short", pa.int16()), ("byte", pa.int8()),
                    ("float", pa.float32()), ("double", pa.float64()), ("String", pa.string()),
                    ("java.lang.String", pa.string())]:
        assert typed(f"X = ({cast})null") == (t, [None] * 6), cast
    with pytest.raises(ExpressionError, match="the cast \\(boolean\\) is not supported"):
        column("X = (boolean)null")


# -- TimeTable start times -------------------------------------------------------------------------

def _time_table(s: Services, n: int, **kw):
    req = table_pb2.TimeTableRequest(**kw)
    req.result_id.ticket = export_ticket(n)
    return req


def test_time_table_starts_where_deephaven_reads_its_start_time():
    with Services() as s:  # the clock reads 2024-01-01T00:00:00Z
        token = s.new_session()
        r = s.call(TABLE_SERVICE, "TimeTable", _time_table(s, 1, start_time_string="2023-12-31T18:00 ET",
                                                          period_string="PT1H"), token=token)
        assert r.success and r.size == 2
        got = s.doget(export_ticket(1), token=token)["Timestamp"].cast(pa.int64()).to_pylist()
        assert got == [1_704_063_600 * NS, 1_704_067_200 * NS]
        # Deephaven reads the minimum long as a null start: now
        r = s.call(TABLE_SERVICE, "TimeTable", _time_table(s, 2, start_time_string="-9223372036854775808",
                                                          period_nanos=NS), token=token)
        assert r.success and r.size == 0
        s.cycle()
        assert s.doget(export_ticket(2), token=token).num_rows == 1
        for n, text in enumerate(["2023-12-31T18:00 EST", "2023-12-31T18:00", " 2023-12-31T18:00 ET", "soon"], 3):
            req = _time_table(s, n, start_time_string=text, period_nanos=NS)
            code, msg = s.status(lambda: s.call(TABLE_SERVICE, "TimeTable", req, token=token))  # noqa: B023
            assert code == grpc.StatusCode.INVALID_ARGUMENT and f"cannot parse instant {text!r}" in msg, msg
