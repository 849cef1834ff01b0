"""Deephaven filter and column-spec strings, evaluated on Arrow data."""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from tickwire.server.services.dh_expr import (
    ExpressionError,
    java_regex,
    parse_column_spec,
    parse_column_specs,
    parse_filter,
    parse_filters,
)

T = pa.table({"Sym": ["AAPL", "MSFT", None, "GOOG"], "Price": [101.0, 99.5, 200.0, None], "Size": [1, 2, 3, 4]})


def rows(text: str) -> list[int]:
    return T.filter(parse_filter(text, T.schema)).column("Size").to_pylist()


@pytest.mark.parametrize("text, expected", [
    ("Sym = `AAPL`", [1]),
    ("Sym == 'AAPL'", [1]),
    ("Sym != `MSFT`", [1, 3, 4]),            # null-safe: a null Sym is not MSFT
    ("Sym = null", [3]),
    ("Sym != null", [1, 2, 4]),
    ("Price > 100", [1, 3]),                  # a null Price matches no comparison
    ("Price <= 100 || isNull(Price)", [2, 4]),
    ("(100 < Price) && (Price <= 200)", [1, 3]),
    ("Price > 100 && Size < 3", [1]),
    ("!isNull(Sym)", [1, 2, 4]),
    ("Sym in `AAPL`, `GOOG`", [1, 4]),
    ("Sym not in `AAPL`", [2, 3, 4]),
    ("Size in 2, 4", [2, 4]),
    ("Size % 2 = 0", [2, 4]),
    ("-Size < -2", [3, 4]),
    ("Size * 2 + 1 = 7", [3]),
    ("Size > 1 && (Sym = `MSFT` || Sym = `GOOG`)", [2, 4]),
])
def test_filters(text, expected):
    assert rows(text) == expected


@pytest.mark.parametrize("text, message", [
    ("Foo > 1", "unknown column 'Foo'"),
    ("Price >", "cannot parse"),
    ("Sym.nope()", "method nope\\(\\) is not supported"),
    ("Sym = `AAPL", "unterminated string"),
    ("Foo in 1, 2", "unknown column 'Foo'"),
    ("Size in Price", "must be literals"),
    # Deephaven refuses these (Java has no chained comparisons and no `and` keyword)
    ("100 < Price <= 200", "at position 12: expected an operator other than a second comparison"),
    ("Price > 100 and Size < 3", "at position 12: expected an operator or the end"),
])
def test_bad_filters_say_what_is_wrong(text, message):
    with pytest.raises(ExpressionError, match=message):
        parse_filter(text, T.schema)


def test_column_specs():
    assert parse_column_spec("Sym", T.schema) == ("Sym", None, "Sym")
    assert parse_column_spec("Ticker = Sym", T.schema) == ("Ticker", None, "Sym")
    name, expr, source = parse_column_spec("Notional = Price * Size", T.schema)
    assert name == "Notional" and source is None
    got = ds.dataset(T).to_table(columns={"Notional": expr}).column(0).to_pylist()
    assert got == [101.0, 199.0, 600.0, None]
    for bad, message in (("Nope", "unknown column"), ("X = Nope", "unknown column"), ("1X = Sym", "cannot parse")):
        with pytest.raises(ExpressionError, match=message):
            parse_column_spec(bad, T.schema)


# -- Deephaven's semantics, checked against a real server in tests/test_expr_conformance.py --------

NAN, INF = float("nan"), float("inf")
D = pa.table({
    "Id": pa.array(range(8), pa.int32()),
    "I8": pa.array([None, -127, 127, 0, 5, -5, 7, 2], pa.int8()),
    "I32": pa.array([None, -2 ** 31 + 1, 2 ** 31 - 1, 0, 5, -5, 7, 2], pa.int32()),
    "I64": pa.array([None, -2 ** 63 + 1, 2 ** 63 - 1, 0, 5, -5, 7, 2], pa.int64()),
    "F32": pa.array([None, NAN, INF, -INF, 0.0, -0.0, 20.0, 1.5], pa.float32()),
    "F64": pa.array([None, NAN, INF, -INF, 0.0, -0.0, 20.0, 19.5], pa.float64()),
    "B": pa.array([None, True, False, True, False, True, False, True]),
    "S": pa.array([None, "AAPL", "", "MSFT", "aapl", "B", "AAPL", "z"]),
    "Ts": pa.array([None, 0, 1_700_000_400 * 10 ** 9, 1_700_000_400 * 10 ** 9 + 1, 1_700_000_000 * 10 ** 9, -1,
                    1_700_000_400 * 10 ** 9, 5], pa.timestamp("ns", "UTC")),
})


def ids(text: str) -> list[int]:
    return D.filter(parse_filter(text, D.schema)).column("Id").to_pylist()


def formula(spec: str) -> pa.ChunkedArray:
    name, expr, source = parse_column_spec(spec, D.schema)
    assert expr is not None
    return ds.dataset(D).to_table(columns={name: expr}).column(0)


@pytest.mark.parametrize("text, expected", [
    # null is below every value: kept by < and <=, dropped by > and >=; NaN matches no ordering
    ("F64 < 20", [0, 3, 4, 5, 7]),
    ("F64 <= 20", [0, 3, 4, 5, 6, 7]),
    ("F64 > 0", [2, 6, 7]),
    ("F64 >= 0", [2, 4, 5, 6, 7]),          # a lone `column op literal`: -0.0 equals 0.0
    ("F32 < 20", [0, 3, 4, 5, 7]),
    ("I32 < 5", [0, 1, 3, 5, 7]),
    ("20 > F64", [0, 3, 4, 5, 7]),
    ("F64 < 20 && Id > 0", [3, 4, 5, 7]),
    ("F64 * 1 < 20", [0, 3, 4, 5, 7]),
    ("F64 == F64", [0, 2, 3, 4, 5, 6, 7]),  # null == null; NaN != NaN
    ("F64 != F64", [1]),
    ("F64 <= F64", [0, 2, 3, 4, 5, 6, 7]),
    ("F64 = 0", [4, 5]),
    ("F64 != 0", [0, 1, 2, 3, 6, 7]),
    ("-I32 < -2", [0, 2, 4, 6]),
    ("I32 + 1 < 0", [0, 1, 2, 5]),          # MAX + 1 wraps to Deephaven's null int
    ("I32 < 2.5", [0, 1, 3, 5, 7]),
    ("I8 < 300", list(range(8))),
    ("I32 = 2.5", []),
    # -0.0 orders below 0.0 outside a lone range filter
    ("F64 >= 0 && Id >= 0", [2, 4, 6, 7]),
    ("(F64 >= 0)", [2, 4, 6, 7]),
    ("!(F64 < 0)", [1, 2, 4, 6, 7]),
    ("-F64 < 0", [0, 2, 4, 6, 7]),
    ("F64 <= 0 && F64 >= 0", [4]),
    # Java's truncated remainder
    ("I32 % 2 = 0", [3, 7]),
    ("I32 % 2 == -1", [1, 5]),
    # strings and booleans: equality only, null-safe
    ("S != `AAPL`", [0, 2, 3, 4, 5, 7]),
    ("S == 'AAPL'", [1, 6]),
    ("S != 'AAPL'", [0, 2, 3, 4, 5, 7]),
    ("B == false", [2, 4, 6]),
    ("B != true", [0, 2, 4, 6]),
    # instants
    ("Ts > '2023-11-14T22:20:00Z'", [3]),
    ("Ts > '2023-11-14T22:20:00 UTC'", [3]),
    ("Ts > '2023-11-14T23:20:00+01:00'", [3]),
    ("Ts < '2023-11-14T22:20:00.000000001Z'", [0, 1, 2, 4, 5, 6, 7]),
    ("Ts <= '2023-11-14T22:20Z'", [0, 1, 2, 4, 5, 6, 7]),
    ("Ts = '2023-11-14T22:20:00Z'", [2, 6]),
    ("Ts == null", [0]),
    # in / not in, with nulls
    ("S in `AAPL`, null", [0, 1, 6]),
    ("S not in `AAPL`, null", [2, 3, 4, 5, 7]),
    ("S in 'AAPL', 'B'", [1, 5, 6]),
    ("I32 in 5, null", [0, 4]),
    ("I8 in -127", [1]),
    ("F64 in 20, 0", [4, 5, 6]),             # 0 matches -0.0
    ("F64 not in 20", [0, 1, 2, 3, 4, 5, 7]),
    ("B in true, null", [0, 1, 3, 5, 7]),
    ("Ts in '2023-11-14T22:20:00Z'", [2, 6]),
    # isNull
    ("isNull(I32 + 1)", [0, 2]),
    ("!isNull(F64)", [1, 2, 3, 4, 5, 6, 7]),
])
def test_deephaven_filter_semantics(text, expected):
    assert ids(text) == expected


def _same(got: pa.ChunkedArray, typ: pa.DataType, values: list) -> None:
    assert got.type == typ
    out = got.to_pylist()
    assert len(out) == len(values)
    for a, b in zip(out, values):
        if isinstance(b, float) and b != b:
            assert a != a
        else:
            assert a == b and (not isinstance(b, float) or str(a) == str(b)), (out, values)


@pytest.mark.parametrize("spec, typ, values", [
    ("X = I32 / 2", pa.float64(), [None, -1073741823.5, 1073741823.5, 0.0, 2.5, -2.5, 3.5, 1.0]),
    ("X = I32 % 7", pa.int32(), [None, -1, 1, 0, 5, -5, 0, 2]),
    ("X = I8 % 7", pa.int32(), [None, -1, 1, 0, 5, -5, 0, 2]),
    ("X = I64 % 7", pa.int64(), [None, 0, 0, 0, 5, -5, 0, 2]),
    ("X = I32 / 0", pa.float64(), [None, -INF, INF, NAN, INF, -INF, INF, INF]),
    ("X = I8 + I8", pa.int32(), [None, -254, 254, 0, 10, -10, 14, 4]),
    ("X = I32 + 1", pa.int32(), [None, -2147483646, None, 1, 6, -4, 8, 3]),
    ("X = I64 - 1", pa.int64(), [None, None, 9223372036854775806, -1, 4, -6, 6, 1]),
    ("X = I32 * 2", pa.int32(), [None, 2, -2, 0, 10, -10, 14, 4]),
    ("X = I32 + 1L", pa.int64(), [None, -2147483646, 2147483648, 1, 6, -4, 8, 3]),
    ("X = I32 + 1.5f", pa.float32(), [None, -2147483648.0, 2147483648.0, 1.5, 6.5, -3.5, 8.5, 3.5]),
    ("X = F32 + 1", pa.float32(), [None, NAN, INF, -INF, 1.0, 1.0, 21.0, 2.5]),
    ("X = F32 / 2", pa.float64(), [None, NAN, INF, -INF, 0.0, -0.0, 10.0, 0.75]),
    ("X = F32 / 2.0f", pa.float32(), [None, NAN, INF, -INF, 0.0, -0.0, 10.0, 0.75]),
    ("X = I32 / 2.0f", pa.float32(), [None, -1073741824.0, 1073741824.0, 0.0, 2.5, -2.5, 3.5, 1.0]),
    ("X = F32 % 2", pa.float32(), [None, NAN, NAN, NAN, 0.0, -0.0, 0.0, 1.5]),
    ("X = F64 % 0", pa.float64(), [None] + [NAN] * 7),
    ("X = -I32", pa.int32(), [None, 2147483647, -2147483647, 0, -5, 5, -7, -2]),
    ("X = 3000000000", pa.int64(), [3000000000] * 8),
    ("X = -2147483648", pa.int64(), [-2147483648] * 8),
    ("X = 1.5f", pa.float32(), [1.5] * 8),
    ("X = I32 < 5", pa.bool_(), [True, True, False, True, False, True, False, True]),
    ("X = F64 < 20", pa.bool_(), [True, False, False, True, True, True, False, True]),
    ("X = F64 >= 0", pa.bool_(), [False, False, True, False, True, False, True, True]),
    ("X = F64 == -0.0", pa.bool_(), [False, False, False, False, True, True, False, False]),
    ("X = I32 == null", pa.bool_(), [True] + [False] * 7),
    ("X = S == `AAPL`", pa.bool_(), [False, True, False, False, False, False, True, False]),
    ("X = Ts > '2023-11-14T22:20:00Z'", pa.bool_(), [False, False, False, True, False, False, False, False]),
    ("X = !isNull(F64)", pa.bool_(), [False] + [True] * 7),
    ("X = I32 = 5", pa.bool_(), [False, False, False, False, True, False, False, False]),
])
def test_deephaven_formula_semantics(spec, typ, values):
    _same(formula(spec), typ, values)


@pytest.mark.parametrize("text, message", [
    ("I32 in `abc`", "type mismatch at position 7"),
    ("S in 1, 2", "type mismatch at position 5"),
    ("I32 in 2.5, 5", "type mismatch at position 7"),
    ("I8 in 300", "out of range"),
    ("I32 == 123456789012345678901234567890", "too large"),
    ("F64 > 1e400", "out of range"),
    ("(" * 200 + "I32 > 0" + ")" * 200, "nested too deeply"),
    (" + ".join(["I32"] * 3000) + " > 0", "too long"),
    (" + ".join(["I32"] * 1100) + " > 0", "too large"),
    ("B", "a filter must be a comparison"),
    ("!B", "'!' needs a comparison"),
    ("S < `B`", "ordering comparison"),
    ("Ts > '2023-11-14'", "is not an instant"),
    ("I32 + null > 0", "needs numbers on both sides"),
    ("S = 'AAPL' && Id > 0", "is not an instant"),
    ("I32 % I8 == 0", "needs a literal divisor"),
    ("I32 % 0 == 0", "remainder by zero"),
    ("-I8 < 0", "unary minus is not supported on int8"),
    ("F32 < 0.1", "cannot hold exactly"),
    ("I64 == F64", "not exact"),
    ("not (I32 > 1)", "expected a value"),
    ("Id > 0 && S in `A`", "at position"),
    ("S in ", "expected a value"),
    ("I32 @ 3", "unexpected character '@' at position 4"),
    ("isNull(I32, I8)", "isNull takes one argument"),
    ("nope(I32) > 0", "function 'nope'"),
    ("I32 > 0 ||", "at position 10: expected a value"),
    ("", "expected a value"),
])
def test_refused_filters_say_where_and_what(text, message):
    with pytest.raises(ExpressionError, match=re.escape(message)):
        parse_filter(text, D.schema)


@pytest.mark.parametrize("spec, message", [
    ("X = I32 % 0", "remainder by zero"),
    ("X = -I8", "unary minus"),
    ("X = 1e-400", "out of range"),
    ("X = I32 + null", "needs numbers"),
    ("X = S + I32", "'+' of a string with int32"),
    ("X = I64 + Ts", "'+' of int64"),
    ("X = B && true", "needs comparisons"),
    ("X = I32 < I8 < I16", "second comparison"),
    ("X = null", "only null"),
    ("X = ", "expected a formula"),
    ("X = " + " * ".join(["I32"] * 3000), "too long"),
])
def test_refused_formulas_say_what(spec, message):
    with pytest.raises(ExpressionError, match=re.escape(message)):
        parse_column_spec(spec, D.schema)


def test_nothing_but_expression_errors_escape():
    """Inputs that once raised RecursionError, SystemError or pyarrow errors."""
    for text in ["-" * 5000 + "I32 > 0", "!" * 100 + "(I32 > 0)", "(" * 10000, "I32 in " + ", ".join(["1"] * 20000),
                 "I32 > 99999999999999999999999999", "Ts > 5", "S == 1", "I32 in `a`, 2", "'abc", "I32 in -`a`"]:
        with pytest.raises(ExpressionError):
            parse_filter(text, D.schema)


def test_structured_conditions_follow_the_same_rules():
    from tickwire.protocol.proto import table_pb2
    from tickwire.server.services.conditions import condition_expression
    from tickwire.server.services.rpc import CallError

    def compare(op, column, **literal):
        cond = table_pb2.Condition()
        cond.compare.operation = op
        cond.compare.lhs.reference.column_name = column
        for k, v in literal.items():
            setattr(cond.compare.rhs.literal, k, v)
        return D.filter(condition_expression(cond, D.schema)).column("Id").to_pylist()

    C = table_pb2.CompareCondition
    assert compare(C.LESS_THAN, "F64", double_value=20.0) == [0, 3, 4, 5, 7]  # null kept, NaN dropped
    assert compare(C.GREATER_THAN_OR_EQUAL, "F64", long_value=0) == [2, 4, 5, 6, 7]
    assert compare(C.NOT_EQUALS, "S", string_value="AAPL") == [0, 2, 3, 4, 5, 7]
    assert compare(C.GREATER_THAN, "Ts", nano_time_value=1_700_000_400 * 10 ** 9) == [3]
    assert compare(C.LESS_THAN, "I32", long_value=5) == [0, 1, 3, 5, 7]
    assert compare(C.LESS_THAN, "I32", double_value=5.0) == [0, 1, 3, 5, 7]
    cond = table_pb2.Condition()
    getattr(cond, "in").target.reference.column_name = "F64"
    getattr(cond, "in").candidates.add().literal.double_value = 0.0
    getattr(cond, "in").candidates.add().literal.long_value = 20
    assert D.filter(condition_expression(cond, D.schema)).column("Id").to_pylist() == [4, 5, 6]
    for op, column, lit in [(C.LESS_THAN, "S", {"string_value": "B"}), (C.EQUALS, "I32", {"string_value": "x"}),
                            (C.LESS_THAN, "F32", {"double_value": 0.1}), (C.LESS_THAN, "I32", {"double_value": 2.5})]:
        with pytest.raises(CallError) as e:
            compare(op, column, **lit)
        assert e.value.code == "INVALID_ARGUMENT"


def test_random_token_soup_is_answered_or_refused_with_expression_error():
    """Any string either evaluates or raises ExpressionError (the server's INVALID_ARGUMENT), never
    another exception (which would be INTERNAL)."""
    import random

    atoms = ["I8", "I32", "I64", "F32", "F64", "B", "S", "Ts", "1", "0", "-1", "2.5", "1e39f", "3e-45f",
             "9223372036854775807", "9223372036854775808", "2147483648", "5L", "`a`", "'x'",
             "'2023-11-14T22:20:00Z'", "'9999-12-31T23:59:59Z'", "'2023-02-30T00:00:00Z'", "true", "null",
             "isNull(I32)", "(", ")", ",", "in", "not", ".5", "-0.0", "1e308", "1e309"]
    ops = ["+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "=", "!=", "&&", "||", "!", " in ", ","]
    rng = random.Random(12)
    answered = 0
    for _ in range(3000):
        k = rng.randint(1, 6)
        text = " ".join(rng.choice(atoms) + (" " + rng.choice(ops) if i < k - 1 else "") for i in range(k))
        try:
            D.filter(parse_filter(text, D.schema))
            answered += 1
        except ExpressionError:
            pass
        try:
            name, expr, _src = parse_column_spec("X = " + text, D.schema)
            if expr is not None:
                ds.dataset(D).to_table(columns={name: expr})
            answered += 1
        except ExpressionError:
            pass
    assert answered > 100


# -- formulas of one call, the conditional operator, casts, functions, String methods, now() -------

def specs_table(specs: list, schema: pa.Schema = D.schema, clock=None, data: pa.Table = D) -> pa.Table:
    cols = {}
    for name, expr, source in parse_column_specs(specs, schema, clock=clock):
        cols[name] = expr if expr is not None else pc.field(source)
    return ds.dataset(data).to_table(columns=cols)


def test_later_formulas_use_earlier_columns_with_their_types():
    t = specs_table(["X = I8 * 2", "Y = X + 1", "Z = Y / 2"])
    assert t.schema.types == [pa.int32(), pa.int32(), pa.float64()]
    assert t["Y"].to_pylist() == [None, -253, 255, 1, 11, -9, 15, 5]
    # a column made again replaces it for the specs after it; it is given once, where first made
    t = specs_table(["I32", "X = I32", "I32 = I32 + 1", "Y = I32", "X = X * 2"])
    assert t.column_names == ["I32", "X", "Y"]
    assert t["I32"].to_pylist() == t["Y"].to_pylist() == [None, -2147483646, None, 1, 6, -4, 8, 3]
    assert t["X"].to_pylist() == [None, 2, -2, 0, 10, -10, 14, 4]
    # a rename of a made column is that column; a rename of a source column stays a rename
    assert specs_table(["A = S", "B = A"])["B"].to_pylist() == D["S"].to_pylist()
    assert parse_column_specs(["A = S"], D.schema) == [("A", None, "S")]
    with pytest.raises(ExpressionError, match="unknown column 'X'"):
        parse_column_specs(["Y = X + 1", "X = I32"], D.schema)


@pytest.mark.parametrize("spec, typ, values", [
    ("X = I32 % 10 > 5 ? null : I32", pa.int32(), [None, -2147483647, None, 0, 5, -5, None, 2]),
    ("X = Id > 5 ? 1 : 2.5", pa.float64(), [2.5] * 6 + [1.0] * 2),
    ("X = Id < 5 ? I8 : 3", pa.int32(), [-128, -127, 127, 0, 5, 3, 3, 3]),  # a null byte is -128 as an int
    ("X = Id < 5 ? F32 : F64", pa.float64(), [-3.4028234663852886e+38, NAN, INF, -INF, 0.0, -0.0, 20.0, 19.5]),
    ("X = Id > 5 ? `a` : null", pa.string(), [None] * 6 + ["a"] * 2),
    ("X = Id > 6 ? 1 : Id > 3 ? 2L : 3", pa.int64(), [3, 3, 3, 3, 2, 2, 2, 1]),
    ("X = (int)F64", pa.int32(), [None, 0, 2147483647, None, 0, 0, 20, 19]),
    ("X = (long)F32", pa.int64(), [None, 0, 9223372036854775807, None, 0, 0, 20, 1]),
    ("X = (byte)I32", pa.int8(), [None, 1, -1, 0, 5, -5, 7, 2]),
    ("X = (float)I32", pa.float32(), [None, -2147483648.0, 2147483648.0, 0.0, 5.0, -5.0, 7.0, 2.0]),
    ("X = (byte)F64", pa.int8(), [None, 0, -1, 0, 0, 0, 20, 19]),  # -inf: the int minimum's low bits
    ("X = abs(I8)", pa.int8(), [None, 127, 127, 0, 5, 5, 7, 2]),
    ("X = sqrt(F64)", pa.float64(), [None, NAN, INF, NAN, 0.0, -0.0, 20 ** 0.5, 19.5 ** 0.5]),
    ("X = floor(F32)", pa.float64(), [None, NAN, INF, -INF, 0.0, -0.0, 20.0, 1.0]),
    ("X = min(I32, 3)", pa.int32(), [3, -2147483647, 3, 0, 3, -5, 3, 2]),   # nulls are skipped
    ("X = min(F64, -F64)", pa.float64(), [None, NAN, -INF, -INF, 0.0, -0.0, -20.0, -19.5]),  # the first wins a tie
    ("X = max(I8, F32)", pa.float32(), [None, NAN, INF, 0.0, 5.0, -0.0, 20.0, 2.0]),
    ("X = isNaN(F64)", pa.bool_(), [False, True, False, False, False, False, False, False]),
    ("X = isFinite(I32)", pa.bool_(), [False] + [True] * 7),
    ("X = isNull(S) ? -1 : S.length()", pa.int32(), [-1, 4, 0, 4, 4, 1, 4, 1]),
    ("X = isNull(S) ? null : S.toUpperCase().trim()", pa.string(),
     [None, "AAPL", "", "MSFT", "AAPL", "B", "AAPL", "Z"]),
    ("X = !isNull(S) && S.length() >= 2 ? S.substring(1, 2) : `-`", pa.string(),
     ["-", "A", "-", "S", "a", "-", "A", "-"]),
    ("X = !isNull(S) && S.matches(`(?i)a.*`)", pa.bool_(), [False, True, False, False, True, False, True, False]),
    ("X = S + `x`", pa.string(), ["nullx", "AAPLx", "x", "MSFTx", "aaplx", "Bx", "AAPLx", "zx"]),
])
def test_conditional_casts_functions_and_methods(spec, typ, values):
    _same(formula(spec), typ, values)


@pytest.mark.parametrize("spec, words", [
    ("X = S.length()", "NullPointerException: length() of a null string"),
    ("X = isNull(S) ? null : S.substring(1)", "StringIndexOutOfBoundsException"),
    ("X = isNull(S) || S.startsWith(`A`) ? 1 : 0", None),  # reached only on non-null strings
    ("X = isNull(S) && S.startsWith(`A`)", "NullPointerException"),
    ("X = !isNull(S) && S.startsWith(`A`)", None),
])
def test_a_failing_method_fails_where_it_is_reached(spec, words):
    name, expr, _source = parse_column_spec(spec, D.schema)
    if words is None:
        ds.dataset(D).to_table(columns={name: expr})
        return
    with pytest.raises(pa.ArrowInvalid, match=re.escape(words)):
        ds.dataset(D).to_table(columns={name: expr})


def test_case_mappings_java_does_differently_fail():
    data = pa.table({"S": ["straße", "abc"]})
    name, expr, _s = parse_column_spec("X = S.toUpperCase()", data.schema)
    with pytest.raises(pa.ArrowInvalid, match="case mapping"):
        ds.dataset(data).to_table(columns={name: expr})
    assert ds.dataset(data.slice(1)).to_table(columns={name: expr})["X"].to_pylist() == ["ABC"]
    name, expr, _s = parse_column_spec("X = S.length()", pa.schema([("S", pa.string())]))
    astral = pa.table({"S": ["a\U0001F600"]})
    assert ds.dataset(astral).to_table(columns={name: expr})["X"].to_pylist() == [3]  # UTF-16 units, as Java


def test_now_and_today_read_the_clock_when_evaluated():
    from tickwire.clock import ManualClock

    clock = ManualClock(wall=1_700_000_400.0)
    specs = ["N = now()", "D = today()", "E = Ts < now()"]
    t = specs_table(specs, clock=clock)
    assert t.schema.types == [pa.timestamp("ns", "UTC"), pa.string(), pa.bool_()]
    first = t["N"].cast(pa.int64()).to_pylist()
    assert first == [clock.now_ns()] * len(D)
    import datetime as dt
    assert t["D"].to_pylist() == [dt.datetime.fromtimestamp(clock.now()).date().isoformat()] * len(D)
    assert t["E"].to_pylist() == [True, True, False, False, True, True, False, True]
    clock.advance(86400.0)
    again = specs_table(specs, clock=clock)  # the same expressions read the clock again
    assert again["N"].cast(pa.int64()).to_pylist() == [first[0] + 86400 * 10 ** 9] * len(D)
    assert D.filter(parse_filter("Ts < now()", D.schema, clock=clock))["Id"].to_pylist() == list(range(8))


@pytest.mark.parametrize("pattern, flags, expected", [
    ("(?s)(?i).*\\Qab\\E.*", {}, "^(?:(?s:.)*[aA][bB](?s:.)*)$"),
    ("(?i)^\\Qa.\\E$", {}, "^(?:[aA]\\x{2e})$"),
    ("a.c", {"dotall": False}, "^(?:a[^\\n\\r\\x{85}\\x{2028}\\x{2029}]c)$"),
    ("é.", {"ignore_case": True, "dotall": True}, "^(?:é(?s:.))$"),  # Java's (?i) folds ASCII only
    ("\\Qa\\E\\\\E", {}, "^(?:a\\x{5c}E)$"),
    ("x+y?", {}, "^(?:x+y?)$"),
])
def test_java_regular_expressions_in_re2(pattern, flags, expected):
    args = {"dotall": False, "ignore_case": False, **flags}
    assert java_regex(pattern, **args) == expected


@pytest.mark.parametrize("pattern", ["a|b", "[ab]", "(ab)", "\\d", "a{2}", "a**", "*a", "(?m)a", "a$b", "b^"])
def test_java_regular_expressions_not_translated_are_refused(pattern):
    with pytest.raises(ExpressionError, match="regular expression"):
        java_regex(pattern, dotall=False, ignore_case=False)


def test_random_formula_soup_is_answered_or_refused():
    """The new syntax either evaluates, raises ExpressionError, or fails the evaluation with one of
    the failures Deephaven has (a null receiver, an index out of range): never another error."""
    import random

    atoms = ["I8", "I32", "I64", "F32", "F64", "B", "S", "Ts", "1", "-1", "2.5", "5L", "`a`", "`ß`", "true", "null",
             "(int)", "(byte)", "(double)", "(String)", "(char)", "abs(", "sqrt(", "min(", "max(", "isNaN(", "floor(",
             "now()", "today()", "S.length()", "S.substring(1)", "S.trim()", ".toUpperCase()", ".contains(`a`)",
             "isNull(S)", "(", ")", ",", "?", ":", "."]
    ops = ["+", "-", "*", "/", "<", "==", "&&", "||", "!", "?", ":", ","]
    rng = random.Random(7)
    answered = 0
    for _ in range(3000):
        k = rng.randint(1, 7)
        text = " ".join(rng.choice(atoms) + (" " + rng.choice(ops) if i < k - 1 else "") for i in range(k))
        for as_filter in (True, False):
            try:
                if as_filter:
                    D.filter(parse_filter(text, D.schema))
                else:
                    specs_table(["X = " + text, "Y = X"])
                answered += 1
            except ExpressionError:
                pass
            except pa.ArrowInvalid as exc:
                assert "Exception" in str(exc) or "not supported" in str(exc), (text, exc)
    assert answered > 100


def test_the_filters_of_one_call_see_only_the_rows_kept_before():
    """As Deephaven applies a where's filters one after another, a method of a later filter is not
    evaluated on the rows an earlier one dropped; alone, or first, it fails on a null string."""
    assert D.filter(parse_filters(["!isNull(S)", "S.length() > 3"], D.schema))["Id"].to_pylist() == [1, 3, 4, 6]
    with pytest.raises(pa.ArrowInvalid, match="NullPointerException"):
        D.filter(parse_filters(["S.length() > 3", "!isNull(S)"], D.schema))
    assert D.filter(parse_filters([], D.schema)).num_rows == len(D)
