"""Deephaven filter and column-spec strings, evaluated on Arrow data."""
from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tickwire.server.services.dh_expr import ExpressionError, parse_column_spec, parse_filter

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
    ("X = Ts + 1", "needs numbers"),
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
    from tickwire.server.services.rpc import CallError
    from tickwire.server.services.table_ops import condition_expression

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
