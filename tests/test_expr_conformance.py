"""Filter and formula strings answer exactly what a real Deephaven server answers.

The same Arrow table (every numeric width, float and double with null, NaN, ±infinity and -0.0,
integer edge values, booleans, strings and instants, each with nulls) is put into a real
Deephaven server (PyPI `deephaven-server`, tests/interop/dh_server.py) with pydeephaven's
`import_table` and into a tickwire server as a static table. Every filter form tickwire accepts
goes through `where([...])` and every formula form through `update([...])` on both, with
pydeephaven, and the results must be equal: the same rows, the same values with nulls and NaN
in the same places, and the same Arrow result type. Forms tickwire refuses must be refused with
INVALID_ARGUMENT, and every form Deephaven refuses must be refused by tickwire too.

One Deephaven server serves the whole module (starting one takes most of the runtime).
"""
from __future__ import annotations

import math
import time

import pyarrow as pa
import pytest

from .interop.dh_server import deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")

NAN, INF = math.nan, math.inf
NS = 1_000_000_000
T0 = 1_700_000_400 * NS  # 2023-11-14T22:20:00Z

#: Deephaven reserves each integer type's minimum for null, so the valid minimum is MIN + 1.
DATA = pa.table({
    "Id": pa.array(range(12), pa.int32()),
    "I8": pa.array([None, -127, 127, 0, 5, -5, 7, 2, 100, -100, 1, 3], pa.int8()),
    "I16": pa.array([None, -32767, 32767, 0, 5, -5, 7, 2, 1000, -1000, 1, 3], pa.int16()),
    "I32": pa.array([None, -2 ** 31 + 1, 2 ** 31 - 1, 0, 5, -5, 7, 2, 16777217, -16777217, 1, 3], pa.int32()),
    "I64": pa.array([None, -2 ** 63 + 1, 2 ** 63 - 1, 0, 5, -5, 7, 2, 2 ** 53 + 1, -(2 ** 53) - 1, 1, 3],
                    pa.int64()),
    "F32": pa.array([None, NAN, INF, -INF, 0.0, -0.0, 20.0, 1.5, 16777216.0, -0.1, 1e30, 3.0], pa.float32()),
    "F64": pa.array([None, NAN, INF, -INF, 0.0, -0.0, 20.0, 19.5, 9007199254740992.0, -0.1, 1e300, 3.0],
                    pa.float64()),
    "B": pa.array([None, True, False, True, False, True, False, True, None, False, True, False]),
    "S": pa.array([None, "AAPL", "", "MSFT", "aapl", "B", "AAPL", "z", "GOOG", None, "b", "AAPL"]),
    "Ts": pa.array([None, 0, T0, T0 + 1, T0 - 400 * NS, -1, T0, 5, None, T0 + 3600 * NS, T0 - 1, 1],
                   pa.timestamp("ns", "UTC")),
})

#: Filters tickwire accepts; each must give Deephaven's rows.
FILTERS = [
    # ordering comparisons: null is below everything, NaN matches none
    "F64 < 20", "F64 <= 20", "F64 > 0", "F64 >= 0", "F64 > -1e308", "F32 < 20", "F32 >= 1.5", "F32 > 1",
    "I8 < 5", "I8 >= -5", "I16 > 0", "I32 < 5", "I32 <= 16777217", "I64 > 0", "I64 < 9007199254740993",
    "I32 < 2.5", "I8 < 300", "20 > F64", "0 <= I32", "-5 < I8",
    "F64 < F64", "F64 <= F64", "F64 >= F32", "I32 < F64", "I8 > I16", "I16 <= I32", "I32 < I64",
    "I8 < F32", "I16 >= F64",
    # -0.0: equal to 0.0 in a lone `column op literal` (a range filter), below it anywhere else
    "0 <= F64", "F64 >= 0.0", "F64 > -0.0", "F64 <= -0.0", "F64 >= -0.0", "0 > F64", "(F64 >= 0)",
    "F64 >= 0 && Id >= 0", "F64 * 1 >= 0", "F32 * 1 >= 0", "F64 <= 0 && F64 >= 0", "!(F64 < 0)", "F64 == -0.0",
    "F64 > F32", "F64 < F32 * 1", "F64 <= -F64", "-F64 >= F64", "F32 >= 0.0f", "F32 > -0.0f",
    # equality: null equals null, NaN equals nothing
    "F64 = 0", "F64 == 20", "F64 != 0", "F32 = 1.5", "F32 != 20", "I32 = 2.5", "I8 = 300", "I32 == 7",
    "I64 != 5", "F64 == F64", "F64 != F64", "I32 == I32", "I8 == I16", "F64 == F32",
    "F64 = null", "F64 == null", "F64 != null", "I32 = null", "S = null", "S != null", "B == null",
    "Ts == null", "Ts != null", "null == I8",
    # strings, booleans
    "S = `AAPL`", "S == \"AAPL\"", "S != `AAPL`", "S == 'AAPL'", "S != 'AAPL'", "S = 'B'", "S == S",
    "B = true", "B == false", "B != true", "B != false", "B == B",
    # instants
    "Ts > '2023-11-14T22:20:00Z'", "Ts >= '2023-11-14T22:20:00Z'", "Ts < '2023-11-14T22:20:00.000000001Z'",
    "Ts <= '2023-11-14T22:20Z'", "Ts == '2023-11-14T22:20:00Z'", "Ts != '2023-11-14T22:20:00Z'",
    "Ts = '2023-11-14T22:20:00Z'", "Ts > '2023-11-14T22:20:00 UTC'", "Ts > '2023-11-14T23:20:00+01:00'",
    "Ts < '2023-11-14T17:20:00-05:00'", "Ts > Ts", "Ts >= Ts", "Ts == Ts",
    # arithmetic inside filters
    "I32 % 2 = 0", "I32 % 2 == 1", "I64 % 7 != 0", "-I32 < -2", "-I64 >= 0", "-F64 < 0",
    "I32 + 1 < 0", "I64 - 1 > 0", "I32 * 2 < 0", "I32 / 2 > 1", "I8 + I8 > 200", "F64 * 1 > 1e300",
    "F64 * 1 < -1e300", "F32 + 1 > 2", "I16 * I16 > 1000000", "I64 / 0 > 0", "I32 / 0 < 0", "(I32 + 1) * 2 < 5",
    "I32 % -3 == -2", "F64 % 7 == 5.5", "F32 % 2 == 1.5",
    # logic
    "F64 < 20 && Id > 0", "F64 < 20 || I32 > 5", "!(I32 > 1)", "!(F64 < 20) && !isNull(F64)",
    "I32 > 1 && (S = `AAPL` || S = `GOOG`)", "(I8 > 0 || I16 < 0) && !(B == true)",
    "isNull(I32)", "!isNull(F64)", "isNull(I32 + 1)", "isNull(S) || isNull(B)", "isNull(Ts)", "!isNull(F32 * 2)",
    "true", "false",
    # in / not in
    "S in `AAPL`, `B`", "S not in `AAPL`", "S in `AAPL`, null", "S not in `AAPL`, null", "S in 'AAPL', 'B'",
    "S in \"z\"", "I32 in 2, 5", "I32 in 5, null", "I32 not in 5, null", "I8 in -127, 127", "I16 not in 0",
    "I64 in 9223372036854775807, -5", "F64 in 20, 0", "F64 not in 20", "F32 in 1.5, 20", "B in true",
    "B in true, null", "B not in false", "Ts in '2023-11-14T22:20:00Z'", "Ts not in '2023-11-14T22:20:00Z', null",
    # functions, casts, the conditional operator, String methods reached only on non-null strings
    "abs(I32) > 5", "abs(F64) < 1", "sqrt(F64) > 2", "isNaN(F64)", "!isNaN(F32)", "isInf(F64)", "isFinite(F32)",
    "isFinite(I64)", "min(I32, I8) < 0", "max(F64, F32) >= 1", "(int)F64 > 5", "(long)F32 < 0", "(byte)I32 == -1",
    "(Id > 5 ? I32 : I64) > 0", "(I8 > 0 ? F64 : 0.0) > 1", "!isNull(S) && S.startsWith(`A`)",
    "isNull(S) || S.contains(`A`)", "!isNull(S) && S.length() > 3", "!isNull(S) && S.matches(`(?i)a.*`)",
    "!isNull(S) && S.equalsIgnoreCase(`aapl`)",
    "!isNull(S) && S.toLowerCase() == `aapl`", "isNull(S) ? false : S.isEmpty()",
    "!isNull(S) && S.trim().endsWith(`L`)", "S + `x` == `nullx`", "Ts < now()", "Ts > now()",
]

#: Formulas tickwire accepts (Update, with the column X); each must give Deephaven's values and type.
FORMULAS = [
    "X = i", "X = ii", "X = k", "X = i * 2 + Id", "X = ii + I64", "X = k % 3 == 0 ? S : null",
    "X = I32 / 2", "X = I8 / 2", "X = I16 / 2", "X = I64 / 2", "X = I32 / 0", "X = I16 / 0", "X = I8 / I8",
    "X = F32 / 2", "X = F32 / F32", "X = F32 / 2.0f", "X = I32 / 2.0f", "X = I64 / F32", "X = F32 / I64",
    "X = F64 / F32", "X = I8 / 2L", "X = F64 / 0",
    "X = I32 % 7", "X = I8 % 7", "X = I16 % -3", "X = I64 % 7", "X = F64 % 7", "X = F32 % 2", "X = F64 % 0",
    "X = I32 % 0.0", "X = F64 % F64", "X = F64 % F32", "X = F64 % 1e300",
    "X = I8 + I8", "X = I8 * 2", "X = I16 - 1", "X = I32 + 1", "X = I64 + 1", "X = I32 * 2", "X = I64 * 2",
    "X = I32 + 1L", "X = I32 + 1.5", "X = I32 + 1.5f", "X = F32 + 1", "X = F32 * 2.0", "X = I64 - 1",
    "X = I32 + 2147483647", "X = I64 * I64", "X = I32 * I32", "X = I16 * I16", "X = I8 - I16",
    "X = F64 * 1", "X = F64 - F64", "X = F32 * F32", "X = I64 + F32", "X = I64 + F64", "X = I32 * F64",
    "X = -I32", "X = -I64", "X = -F32", "X = -F64", "X = -(I32 + 1)", "X = (I8 + 1) * (I16 - 1)",
    "X = I32 * 2 + I64 % 5 - I8 / 4", "X = 1 - F64 / 3",
    "X = 5", "X = -5", "X = 2147483647", "X = 3000000000", "X = -2147483648", "X = 5L", "X = 1.5",
    "X = 1.5f", "X = .5", "X = 5.", "X = 1E3", "X = 1.5d", "X = 9223372036854775807", "X = true", "X = `abc`",
    "X = \"abc\"",
    "X = I32 < 5", "X = F64 < 20", "X = F64 >= 0", "X = I32 == null", "X = I32 > F64", "X = F64 <= -0.0",
    "X = F64 >= -0.0",
    "X = F64 < 0", "X = F64 == -0.0", "X = -F64 < F64", "X = F32 <= -F32", "X = -F32 > 0",
    "X = S == `AAPL`", "X = S != `AAPL`", "X = B == true", "X = Ts > '2023-11-14T22:20:00Z'",
    "X = Ts == null", "X = isNull(I32)", "X = !isNull(F64)", "X = I32 > 0 && F64 > 0", "X = I32 = 5",
    "X = !(F32 < 1) || isNull(S)",
    "X = I8", "X = S", "X = Ts", "X = B", "X = (F64)",
    # the conditional operator
    "X = I32 % 10 > 5 ? null : I32", "X = Id > 5 ? 1 : 2.5", "X = Id > 5 ? I32 : I64", "X = Id > 5 ? `a` : null",
    "X = Id > 5 ? null : `x`", "X = Id < 5 ? I8 : 3", "X = Id < 5 ? I16 : I32", "X = Id < 5 ? I32 : F64",
    "X = Id < 5 ? I64 : F64", "X = Id < 5 ? F32 : F64", "X = Id > 5 ? F32 : I64", "X = Id < 5 ? I8 : I8 + 1",
    "X = Id < 5 ? null : I8", "X = Id < 5 ? 3 : null", "X = Id > 5 ? B : null", "X = Id > 5 ? B : false",
    "X = Id > 5 ? Ts : null", "X = Id > 5 ? I8 : I8", "X = I32 > 0 ? 1 : 0", "X = Id > 9 ? 1 : Id > 4 ? 2L : 3",
    "X = isNull(F64) ? -1.0 : F64 * 2",
    # casts
    "X = (int)F64", "X = (long)F64", "X = (int)F32", "X = (long)F32", "X = (byte)I32", "X = (short)I64",
    "X = (int)I64", "X = (double)I64", "X = (float)F64", "X = (float)I64", "X = (long)I8", "X = (double)I32",
    "X = (float)I32", "X = (double)F32", "X = (int)(F64 * 2)", "X = (byte)F64", "X = (short)F32", "X = (String)S",
    "X = (int)5.7", "X = (int)-5.7", "X = (byte)200", "X = -(int)F64",
    # functions
    "X = abs(I8)", "X = abs(I16)", "X = abs(I32)", "X = abs(I64)", "X = abs(F32)", "X = abs(F64)", "X = abs(-0.0)",
    "X = abs(5)", "X = sqrt(F64)", "X = sqrt(I32)", "X = sqrt(F32)", "X = sqrt(I8)", "X = sqrt(5)",
    "X = floor(F64)", "X = ceil(F64)", "X = floor(F32)", "X = ceil(F32)",
    "X = min(I32, 3)", "X = max(F64, 1)", "X = max(I8, I16)", "X = min(I32, F64)", "X = max(I64, I32)",
    "X = min(F64, F32)", "X = max(I8, 3)", "X = min(F64, 1.5)", "X = min(F64, -F64)", "X = max(F64, -F64)",
    "X = min(I32, I32)", "X = max(F32, F32)", "X = min(I64, 5L)",
    "X = isNaN(F64)", "X = isInf(F64)", "X = isFinite(F64)", "X = isNaN(F32)", "X = isInf(F32)", "X = isFinite(F32)",
    "X = isNaN(I32)", "X = isInf(I8)", "X = isFinite(I32)", "X = isFinite(I64)",
    # String methods (a null receiver is a failure in Deephaven: reached only on non-null strings here)
    "X = isNull(S) ? -1 : S.length()", "X = isNull(S) ? null : S.toUpperCase()",
    "X = isNull(S) ? null : S.toLowerCase()",
    "X = isNull(S) ? null : S.trim()", "X = isNull(S) ? false : S.contains(`A`)",
    "X = isNull(S) ? false : S.startsWith(`A`)",
    "X = isNull(S) ? false : S.endsWith(`L`)", "X = isNull(S) ? null : S.toUpperCase().length()",
    "X = !isNull(S) && S.isEmpty()", "X = isNull(S) || S.equals(`AAPL`)",
    "X = !isNull(S) && S.equalsIgnoreCase(`aapl`)",
    "X = !isNull(S) && S.matches(`A.*L`)", "X = !isNull(S) && S.matches(`(?i)a.*`)",
    "X = !isNull(S) && S.length() > 1 ? S.substring(1) : null",
    "X = !isNull(S) && S.length() >= 2 ? S.substring(0, 2) : `-`",
    "X = `  a b ` + `c`", "X = `abc`.substring(1)", "X = `abc`.length()", "X = ` x `.trim()",
    "X = S + `x`", "X = `x` + S", "X = S + S", "X = S + `-` + S",
]

#: Filters tickwire refuses (INVALID_ARGUMENT); Deephaven refuses many of them too.
REFUSED_FILTERS = [
    "Price > 1", "I32 >", "S.startsWith(`A`)", "S = `AAPL", "I32 in `abc`", "S in 1, 2", "F64 in 1, `a`",
    "I32 in 2.5, 5", "I8 in 300", "I32 in F64", "100 < I32 <= 200", "I32 > 1 and Id < 3", "not (I32 > 1)",
    "B", "!B", "I32", "S < `B`", "S > `B`", "B < true", "Ts > '2023-11-14'", "Ts > 5", "I32 + null > 0",
    "S = 'AAPL' && Id > 0", "I32 == `a`", "I32 % I8 == 0", "I32 % 0 == 0", "-I8 < 0",
    "I32 == 123456789012345678901234567890", "F64 > 1e400", "F32 < 0.1", "I32 < F32", "I64 == F64",
    "(" * 200 + "I32 > 0" + ")" * 200, " + ".join(["I32"] * 3000) + " > 0", "Id > 0 && S in `A`",
    "S in ", "I32 @ 3", "isNull(I32, I8)", "Math.abs(I32) > 0", "I32 > 0 ||", "", "S.length() > 2",
    "isNull(S) && S.contains(`A`)", "B ? true : false", "!isNull(S) && S.substring(1) == `A`",
]

#: Formulas tickwire refuses.
REFUSED_FORMULAS = [
    "X = I32 % 0", "X = -I8", "X = -I16", "X = 123456789012345678901234567890", "X = 1e400", "X = 1e-400",
    "X = I32 + null", "X = I32 % null", "X = S + I32", "X = I32 % I8", "X = B && true",
    "X = S == 'AAPL'", "X = Nope", "X = I64 < F32 + 0.0", "X = I32 +", "X = Math.sqrt(F64)", "X = I32 < I16 < I8",
    "X = null", "X = S.length()", "X = S.toUpperCase()", "X = isNull(S) ? null : S.substring(1)", "X = B ? 1 : 2",
    "X = Id > 5 ? I8 : I16", "X = (int)B", "X = (int)S", "X = Math.abs(I32)",
    "X = `a` + F64", "X = S.nope()", "X = S.length", "X = Id > 5 ? null : null", "X = Id > 5 ? S : I32",
    "X = isNull(S) ? 0 : S.substring(3, 1).length()", "X = sqrt(S)", "X = min(I32)", "X = now(1)",
    "X = !isNull(S) && S.matches(`(?i)\\Qa\\E.*`)", "X = `a\\tb`",
    "X = " + " * ".join(["I32"] * 3000),
]


@pytest.fixture(scope="module")
def servers(deephaven_server):
    from .interop import Beside

    with Beside(deephaven_server.port, {"data": DATA}) as both:
        yield both.pair("data")


def _run(table, op: str, form: str):
    """("ok", arrow table) or ("refused", message)."""
    from pydeephaven import DHError

    try:
        out = (table.where([form]) if op == "where" else table.update([form])).to_arrow()
    except DHError as exc:
        return "refused", _status(exc)
    return "ok", out


def _status(exc: BaseException) -> str:
    """The gRPC status code and details behind a pydeephaven error (or its text)."""
    seen = exc
    while seen is not None:
        code = getattr(seen, "code", None)
        if callable(code):
            try:
                return f"{code().name}: {seen.details()}"
            except (AttributeError, TypeError, ValueError):  # not a grpc error after all
                pass
        seen = seen.__cause__ or seen.__context__
    return str(exc)


def _normal(t: pa.Table) -> pa.Table:
    """Deephaven's instants arrive as timestamp[ns, tz=...]: compare them as nanoseconds since the
    epoch (the time zone is presentation only); every other type must be equal as it is."""
    cols = []
    for c in t.columns:
        if pa.types.is_timestamp(c.type):
            c = c.cast(pa.timestamp("ns")).cast(pa.int64())
        cols.append(c.combine_chunks())
    return pa.Table.from_arrays(cols, names=t.column_names)


def _same_values(a: pa.Array, b: pa.Array) -> bool:
    """Equal values with nulls and NaN in the same places (NaN equals NaN here; -0.0 is not 0.0)."""
    if a.type != b.type or len(a) != len(b):
        return False
    if pa.types.is_floating(a.type):
        xa, xb = a.to_pylist(), b.to_pylist()
        for u, v in zip(xa, xb):
            if u is None or v is None:
                if u is not v:
                    return False
            elif math.isnan(u) or math.isnan(v):
                if not (math.isnan(u) and math.isnan(v)):
                    return False
            elif u != v or math.copysign(1.0, u) != math.copysign(1.0, v):
                return False
        return True
    return a.equals(b)


def _compare(dh_table, tw_table, op: str, form: str) -> str:
    """'same', 'both refused' or a description of the difference (tickwire refusing what
    Deephaven answers is 'tickwire refused')."""
    dh_kind, dh_out = _run(dh_table, op, form)
    tw_kind, tw_out = _run(tw_table, op, form)
    if tw_kind == "refused":
        if "INVALID_ARGUMENT" not in tw_out:
            return f"tickwire refused without INVALID_ARGUMENT: {tw_out[:300]}"
        return "both refused" if dh_kind == "refused" else "tickwire refused"
    if dh_kind == "refused":
        return f"Deephaven refused but tickwire answered {tw_out.num_rows} rows"
    a, b = _normal(dh_out), _normal(tw_out)
    if a.column_names != b.column_names:
        return f"columns differ: {a.column_names} vs {b.column_names}"
    if a.num_rows != b.num_rows:
        return f"rows differ: Deephaven Ids {a['Id'].to_pylist()} vs tickwire {b['Id'].to_pylist()}"
    for name in a.column_names:
        if not _same_values(a[name].chunk(0) if a.num_rows else a[name].combine_chunks(),
                            b[name].chunk(0) if b.num_rows else b[name].combine_chunks()):
            return (f"column {name} differs: Deephaven {a[name].type} {a[name].to_pylist()} vs "
                    f"tickwire {b[name].type} {b[name].to_pylist()}")
    return "same"


#: Structured Filter conditions (TableService.Filter, what Deephaven's web clients send):
#: (operation, column, rhs) with rhs a column name or a (literal field, value) pair; and `in`
#: conditions as ("in" / "not in", column, [(literal field, value), ...]).
STRUCTURED = [
    ("<", "F64", ("double_value", 20.0)), ("<=", "F64", ("long_value", 20)), (">", "F64", ("double_value", 0.0)),
    (">=", "F64", ("long_value", 0)), (">", "F64", ("double_value", -0.0)), ("<=", "F64", ("double_value", -0.0)),
    ("==", "F64", ("double_value", 0.0)), ("!=", "F64", ("double_value", 20.0)), ("<", "F32", ("double_value", 20.0)),
    (">=", "F32", ("double_value", 1.5)), ("<", "I32", ("long_value", 5)), (">=", "I8", ("long_value", -5)),
    ("!=", "I64", ("long_value", 5)), ("<", "I16", ("double_value", 2.5)), ("==", "I32", ("double_value", 5.0)),
    ("<", "I64", ("double_value", 5.0)), (">", "I8", ("double_value", 1e10)), ("==", "S", ("string_value", "AAPL")),
    ("!=", "S", ("string_value", "AAPL")), ("==", "B", ("bool_value", True)), ("!=", "B", ("bool_value", False)),
    (">", "Ts", ("nano_time_value", T0)), ("<=", "Ts", ("nano_time_value", T0)), ("!=", "Ts", ("nano_time_value", T0)),
    ("<=", "F64", "F32"), ("<", "F64", "F64"), ("==", "F64", "F64"), ("!=", "I32", "I64"), (">", "I8", "I16"),
    ("in", "F64", [("double_value", 0.0), ("long_value", 20)]), ("in", "S", [("string_value", "AAPL")]),
    ("not in", "S", [("string_value", "AAPL"), ("string_value", "B")]), ("not in", "I32", [("long_value", 5)]),
    ("in", "Ts", [("nano_time_value", T0)]),
]


class _StructuredFilter:
    """A TableService.Filter call for pydeephaven's `grpc_table_op` (pydeephaven only sends
    filter strings)."""

    _OPS = {"<": 0, "<=": 1, ">": 2, ">=": 3, "==": 4, "!=": 5}

    def __init__(self, form):
        self.form = form

    @classmethod
    def get_stub_func(cls, stub):
        return stub.Filter

    def make_grpc_request(self, result_id, source_id):
        from deephaven_core.proto import table_pb2

        op, column, rhs = self.form
        cond = table_pb2.Condition()
        if op in ("in", "not in"):
            c = getattr(cond, "in")
            c.target.reference.column_name = column
            c.match_type = 0 if op == "in" else 1
            for field, value in rhs:
                setattr(c.candidates.add().literal, field, value)
        else:
            c = cond.compare
            c.operation = self._OPS[op]
            c.lhs.reference.column_name = column
            if isinstance(rhs, str):
                c.rhs.reference.column_name = rhs
            else:
                setattr(c.rhs.literal, rhs[0], rhs[1])
        return table_pb2.FilterTableRequest(result_id=result_id, source_id=source_id, filters=[cond])


def _run_structured(table, form):
    from pydeephaven import DHError

    try:
        return "ok", table.session.table_service.grpc_table_op(table, _StructuredFilter(form)).to_arrow()
    except DHError as exc:
        return "refused", _status(exc)


def test_structured_filters_answer_as_deephaven(servers):
    dh, tw = servers
    bad, answered = {}, 0
    for form in STRUCTURED:
        (dk, dout), (tk, tout) = _run_structured(dh, form), _run_structured(tw, form)
        if tk == "refused":
            if "INVALID_ARGUMENT" not in tout:
                bad[str(form)] = f"tickwire refused without INVALID_ARGUMENT: {tout[:200]}"
            continue
        if dk == "refused":
            bad[str(form)] = f"Deephaven refused ({dout[:200]}) but tickwire answered"
            continue
        answered += 1
        got, want = _normal(tout)["Id"].to_pylist(), _normal(dout)["Id"].to_pylist()
        if got != want:
            bad[str(form)] = f"Deephaven Ids {want} vs tickwire {got}"
    assert not bad, bad
    assert answered >= len(STRUCTURED) - 2  # a fractional or out-of-range double against an integer column


def test_forms_lists_are_distinct():
    for forms in (FILTERS, FORMULAS, REFUSED_FILTERS, REFUSED_FORMULAS):
        assert len(set(forms)) == len(forms)


def test_accepted_filters_answer_as_deephaven(servers):
    dh, tw = servers
    bad = {f: r for f in FILTERS if (r := _compare(dh, tw, "where", f)) != "same"}
    assert not bad, bad


def test_accepted_formulas_answer_as_deephaven(servers):
    dh, tw = servers
    bad = {f: r for f in FORMULAS if (r := _compare(dh, tw, "update", f)) != "same"}
    assert not bad, bad


def test_refused_filters_are_invalid_argument(servers):
    dh, tw = servers
    bad = {}
    for f in REFUSED_FILTERS:
        r = _compare(dh, tw, "where", f)
        if r not in ("both refused", "tickwire refused"):
            bad[f] = r
    assert not bad, bad


def test_refused_formulas_are_invalid_argument(servers):
    dh, tw = servers
    bad = {}
    for f in REFUSED_FORMULAS:
        r = _compare(dh, tw, "update", f)
        if r not in ("both refused", "tickwire refused"):
            bad[f] = r
    assert not bad, bad


def test_deephaven_refusals_are_refused(servers):
    """Forms Deephaven itself refuses (checked here, so the list cannot drift) are refused by
    tickwire too."""
    dh, tw = servers
    for op, form in [("where", "I32 > 1 and Id < 3"), ("where", "100 < I32 <= 200"), ("where", "B"),
                     ("where", "I32 in `abc`"), ("where", "S in 1, 2"), ("where", "I8 in 300"),
                     ("update", "X = I32 % 0"), ("update", "X = -I8"), ("update", "X = I32 + null"),
                     ("update", "X = 123456789012345678901234567890"), ("update", "X = 1e400")]:
        assert _compare(dh, tw, op, form) == "both refused", (op, form)


#: Calls with several specs: later formulas use the columns of earlier ones (with their types),
#: and a column made again replaces it for the specs after it.
CHAINED = [
    ("update", ["X = I32 * 2", "Y = X + 1"]), ("update", ["I32 = I32 + 1", "Y = I32"]),
    ("update", ["X = F64 / 2", "Y = X > 1 ? X : -X", "Z = (int)Y"]), ("update", ["X = I8", "Y = X * X"]),
    ("update", ["X = I32 % 10 > 5 ? null : I32", "Y = isNull(X)", "Z = X + 1"]),
    ("update", ["X = I32 < 5", "Y = X && I8 > 0", "Z = !X"]), ("update", ["X = S", "Y = isNull(X) ? -1 : X.length()"]),
    ("update", ["X = 5", "Y = I32 % X"]), ("update", ["X = `a`",
    "Y = X + S"]), ("update", ["F64 = (long)F64", "G = F64 / 2"]),
    ("update", ["Id = Id + 100", "X = Id"]), ("update", ["X = I32", "X = X + 1", "Y = X"]),
    ("update_view", ["X = I64 - 1", "Y = X * 2"]), ("view", ["X = I32", "X = X + 1"]),
    ("view", ["Id", "X = I32", "Id = Id + 100"]), ("view", ["A = S", "B = A", "C = B + A"]),
    ("select", ["X = I16 * 3", "Y = min(X, I8)", "I16 = X"]), ("lazy_update", ["X = I32 * 2", "Y = X + 1"]),
]

#: Calls Deephaven refuses: a column used before the spec that makes it.
CHAINED_REFUSED = [("update", ["Y = X + 1", "X = I32"]), ("view", ["X = I32", "Y = I32 + Z"])]


def _run_specs(table, op: str, specs: list):
    from pydeephaven import DHError

    try:
        return "ok", getattr(table, op)(specs).to_arrow()
    except DHError as exc:
        return "refused", _status(exc)


def _same_tables(a: pa.Table, b: pa.Table) -> str:
    a, b = _normal(a), _normal(b)
    if a.column_names != b.column_names:
        return f"columns differ: {a.column_names} vs {b.column_names}"
    for name in a.column_names:
        if not _same_values(a[name].combine_chunks(), b[name].combine_chunks()):
            return (f"column {name} differs: Deephaven {a[name].type} {a[name].to_pylist()} vs "
                    f"tickwire {b[name].type} {b[name].to_pylist()}")
    return "same"


def test_formulas_use_the_columns_of_earlier_formulas(servers):
    dh, tw = servers
    bad = {}
    for op, specs in CHAINED:
        (dk, dout), (tk, tout) = _run_specs(dh, op, specs), _run_specs(tw, op, specs)
        if dk != "ok" or tk != "ok":
            bad[f"{op} {specs}"] = f"Deephaven {dk} {'' if dk == 'ok' else dout[:200]}, tickwire {tk} " \
                                   f"{'' if tk == 'ok' else tout[:200]}"
            continue
        # tickwire appends the columns an update replaces (their order is the operation's, not the
        # formulas'): compare the columns by name
        if op in ("update", "update_view", "lazy_update"):
            tout = tout.select(dout.column_names) if set(tout.column_names) == set(dout.column_names) else tout
        r = _same_tables(dout, tout)
        if r != "same":
            bad[f"{op} {specs}"] = r
    for op, specs in CHAINED_REFUSED:
        (dk, _d), (tk, tout) = _run_specs(dh, op, specs), _run_specs(tw, op, specs)
        if dk != "refused" or tk != "refused" or "INVALID_ARGUMENT" not in tout:
            bad[f"{op} {specs}"] = f"Deephaven {dk}, tickwire {tk}"
    assert not bad, bad


def test_now_and_today_have_deephavens_types(servers):
    """now() is an instant of the evaluation (within the interval of the call, by the clock of
    each server; both run on this machine), today() the date as text."""
    import time

    dh, tw = servers
    before = time.time_ns()
    outs = [t.update(["N = now()", "D = today()", "E = Ts < now()"]).to_arrow() for t in (dh, tw)]
    after = time.time_ns()
    dh_out, tw_out = outs
    for name in ("N", "D", "E"):
        assert dh_out[name].type == tw_out[name].type, name
    for out in outs:
        nanos = _normal(out)["N"].to_pylist()
        assert all(before - 10 * NS <= n <= after + 10 * NS for n in nanos), nanos
        assert set(out["D"].to_pylist()) <= {time.strftime("%Y-%m-%d", time.localtime(x / NS)) for x in (before, after)}
    assert dh_out["E"].to_pylist() == tw_out["E"].to_pylist()


# -- instants, Deephaven's time constants, chars ----------------------------------------------------

#: A table with a char column (uint16, Deephaven's char; 0xFFFF is its null) beside instants and numbers.
TIME_DATA = pa.table({
    "Id": pa.array(range(8), pa.int32()),
    "I8": pa.array([None, -127, 127, 0, 5, -5, 65, 1], pa.int8()),
    "I16": pa.array([None, -32767, 32767, 0, 65, -5, 97, 2], pa.int16()),
    "I32": pa.array([None, -2 ** 31 + 1, 2 ** 31 - 1, 0, 65, 65535, 65536, 97], pa.int32()),
    "I64": pa.array([None, -2 ** 63 + 1, 2 ** 63 - 1, 0, 65, 65536, -65, 3], pa.int64()),
    "F64": pa.array([None, 1.5, -0.0, 65.7, 1e300, NAN, -1.5, 70000.0], pa.float64()),
    "S": pa.array([None, "a", "b", "c", "d", "e", "f", "g"]),
    "Ts": pa.array([None, 0, T0, T0 + 1, -1, 5, T0 - 3600 * NS, None], pa.timestamp("ns", "UTC")),
    "C": pa.array([None, 65, 0, 97, 65534, None, 48, 1], pa.uint16()),
})

#: Formulas on TIME_DATA; each must give Deephaven's values and type.
TIME_FORMULAS = [
    # the time constants (io.deephaven.time.DateTimeUtils)
    "X = MICRO", "X = MILLI", "X = SECOND", "X = MINUTE", "X = HOUR", "X = DAY", "X = WEEK", "X = YEAR_365",
    "X = YEAR_AVG", "X = SECONDS_PER_NANO", "X = MINUTES_PER_NANO", "X = HOURS_PER_NANO", "X = DAYS_PER_NANO",
    "X = YEARS_PER_NANO_365", "X = YEARS_PER_NANO_AVG", "X = Id * SECOND", "X = HOUR / MINUTE", "X = I32 * MILLI",
    "X = I64 % SECOND", "X = DAY - HOUR * 24",
    # (Instant) and instant arithmetic
    "X = (Instant)'2024-06-15T10:00:00Z'", "X = (java.time.Instant)'2024-06-15T10:00:00Z'", "X = (Instant)Ts",
    "X = (java.time.Instant)Ts", "X = (Instant)null", "X = (Instant)(Ts + 1)", "X = ( Instant ) Ts",
    "X = (Instant)'2024-06-15T10:00:00Z' + Id * SECOND", "X = '2024-06-15T10:00:00Z' + Id * SECOND",
    "X = Ts + I32", "X = Ts + I8", "X = Ts + I16", "X = Ts - I32", "X = Ts - I8", "X = Ts + 1", "X = Ts - 1",
    "X = Ts + SECOND", "X = Ts - HOUR", "X = Ts - Ts", "X = Ts - '2024-06-15T10:00:00Z'",
    "X = '2024-06-15T10:00:00Z' - Ts", "X = '2024-06-15T10:00:00Z' - '2024-06-15T10:00:01Z'",
    "X = '2024-06-15T10:00:00Z' + I32", "X = Ts + (long)null", "X = Ts + (char)I32", "X = Ts + C",
    "X = Ts - 9223372036854775806L", "X = Ts - 9223372036854775807L",
    "X = Id > 2 ? Ts + SECOND : null", "X = Id > 2 ? Ts + SECOND : Ts", "X = Id > 2 ? '2024-06-15T10:00:00Z' : Ts",
    "X = Ts < Ts + 1", "X = Ts + MINUTE > '2023-11-14T22:20:00Z'", "X = (Ts - Ts) / SECOND",
    # instant literals as Deephaven's parseInstant reads them: zones, aliases, daylight-saving changes
    "X = '2023-01-01T11:00 ET'", "X = '2023-02-01T11:00:34.001 PT'", "X = '2023-01-01T11:00 CT'",
    "X = '2023-01-01T11:00 MT'", "X = '2023-01-01T11:00 HK'", "X = '2023-01-01T11:00 JP'",
    "X = '2023-01-01T11:00 LON'", "X = '2023-01-01T11:00 America/New_York'", "X = '2023-01-01T11:00 UTC'",
    "X = '2023-01-01T11:00 GMT+1'", "X = '2023-01-01T11:00 +05:30'", "X = '2023-01-01T11:00 -3'",
    "X = '2023-01-01T11:00 Etc/GMT+5'", "X = '2023-1-1T1:2 ET'", "X = '2023-01-01T11:00:5.5 ET'",
    "X = '2023-03-12T02:30 ET'", "X = '2023-11-05T01:30 ET'", "X = '2023-03-26T01:30 LON'",
    "X = '2023-10-29T01:30 Europe/London'", "X = '2023-03-12 ET'", "X = '2023-01-01T ET'",
    "X = '2023-02-30T11:00 ET'", "X = '2024-02-30T11:00 ET'", "X = '2023-01-01T24:00 ET'",
    "X = '2023-01-01T11:00:00+01'", "X = '2023-01-01T11:00:00+01:30:15'", "X = '2023-01-01t11:00:00z'",
    "X = '2023-01-01T11:00:00.Z'", "X = '2023-01-01T11:00:00+05:00[America/New_York]'",
    "X = '2023-01-01T11:00:00.123456789 ET'", "X = '12345'", "X = '1700000000000'", "X = '1700000000000000'",
    "X = '-5'", "X = '9300000000000000'", "X = '2262-04-11T23:47:15.999999999Z'",
    "X = '1677-09-21T00:12:43.145224193Z'", "X = Ts < '2262-04-11T23:47:16Z'",
    # (char), char literals and char columns (numbers promoted to int; 0xFFFF is null)
    "X = (char)I32", "X = (char)I64", "X = (char)I16", "X = (char)I8", "X = (char)Id", "X = (char)F64",
    "X = (char)65", "X = (char)65535", "X = (char)-1", "X = (char)null", "X = (char)1.5f", "X = (char)(Id + 64)",
    "X = (char)I32 + 1", "X = (int)(char)I32", "X = (long)(char)I8", "X = (double)(char)I32",
    "X = (float)(char)I32", "X = (short)(char)I8", "X = (byte)(char)I32", "X = (char)(char)I32",
    "X = (char)I32 == 65", "X = (char)I32 < 100", "X = (char)I32 * 2", "X = isNull((char)I32)",
    "X = (char)I32 + (char)I32", "X = abs((char)I32)", "X = sqrt((char)I32)", "X = isNaN((char)I32)",
    "X = isFinite((char)I32)", "X = max((char)I32, 3)", "X = min((char)I32, (char)I8)", "X = (char)I32 / 2",
    "X = (char)I32 % 7", "X = (char)I32 > I8", "X = (char)I32 > 1.5", "X = (char)I32 + 1L", "X = (char)I32 + 1.5",
    "X = Id > 2 ? (char)I32 : null", "X = Id > 2 ? (char)I32 : 5", "X = Id > 2 ? (char)I32 : 5L",
    "X = Id > 2 ? (char)I32 : (char)I8", "X = Id > 2 ? 'A' : (char)I32",
    "X = 'A'", "X = 'A' + 1", "X = 'A' + 'B'", "X = (int)'A'", "X = (char)'A'", "X = (char)I32 == 'A'",
    "X = C", "X = C + 1", "X = C == 'A'", "X = C < 'B'", "X = (int)C", "X = (byte)C", "X = isNull(C)",
    "X = C == null", "X = Id > 3 ? C : 'z'", "X = max(C, C)", "X = C * C", "X = (char)(C + 1)",
    # casts of null
    "X = (int)null", "X = (long)null", "X = (short)null", "X = (byte)null", "X = (float)null", "X = (double)null",
    "X = (String)null", "X = (java.lang.String)S", "X = (java.time.Instant)null",
]

#: Formulas on TIME_DATA that Deephaven refuses (or fails evaluating); tickwire refuses each.
TIME_REFUSED = [
    "X = Ts + I64", "X = Ts - I64", "X = Ts + 9223372036854775807L", "X = Ts + 9223372035999999999L",
    "X = Ts + 9223372035999999999L - Ts", "X = '2262-04-11T23:47:16Z'",
    "X = Ts - '2262-04-11T23:47:16Z'", "X = I64 + Ts", "X = I32 + Ts", "X = Ts + Ts", "X = Ts * 2", "X = -Ts",
    "X = Ts + null", "X = Ts - null", "X = Ts + 1.5", "X = Ts + F64", "X = (Instant)I64", "X = (Instant)S",
    "X = (Instant)'A'", "X = (long)Ts", "X = NANO", "X = (boolean)null",
    "X = '2023-01-01T11:00 EST'", "X = '2023-01-01T11:00 et'", "X = '2023-01-01T11:00 america/new_york'",
    "X = '2023-01-01T11:00:00+0130'", "X = '2023-02-30T11:00:00Z'", "X = '2023-01-01T11:00'",
    "X = '2023-01-01 11:00 ET'", "X = '2023-01-01T11:00  ET'", "X = '2023-01-01T11:00 Z'", "X = '2023-01-01T11Z'",
    "X = '2023-01-01T24:00:01 ET'", "X = '2023-01-01T11:00:00[Europe/Paris]'", "X = '9223372036854775808'",
    "X = -(char)I32", "X = -C", "X = Id > 2 ? (char)I32 : I16", "X = Id > 2 ? (char)I32 : I8", "X = 'AB'",
    "X = (String)(char)I32", "X = (char)S",
]

#: Filters on TIME_DATA; each must keep Deephaven's rows.
TIME_FILTERS = [
    "Ts < '2023-11-14T17:20 ET'", "Ts >= '2023-11-14T17:20 ET'", "Ts == '2023-11-14T23:20 Europe/Paris'",
    "Ts > '2023-11-14T17:20:00-05'", "Ts in '2023-11-14T17:20 ET', '1970-01-01T00:00 UTC'",
    "Ts not in '2023-11-14 UTC'", "Ts > '1700000000'", "Ts - Ts == 0", "Ts + SECOND > '2023-11-14T22:20:00Z'",
    "Ts - HOUR < '2023-11-14T20:20:00Z'", "Ts > '2023-11-14T22:20:00Z' - DAY",
    "C == 'A'", "C > 'A'", "C < 'a'", "C != 'A'", "C in 'A', 'a'", "C not in 'A'", "isNull(C)", "C == null",
    "C + 1 > 66", "(char)I32 == 'A'", "(char)I32 > 64",
]


@pytest.fixture(scope="module")
def time_servers(deephaven_server):
    from .interop import Beside

    with Beside(deephaven_server.port, {"time_data": TIME_DATA}) as both:
        yield both.pair("time_data")


def test_instant_char_and_constant_formulas_answer_as_deephaven(time_servers):
    dh, tw = time_servers
    bad = {f: r for f in TIME_FORMULAS if (r := _compare(dh, tw, "update", f)) != "same"}
    assert not bad, bad


def test_instant_char_and_constant_refusals_are_refused(time_servers):
    """Each of these is refused by Deephaven (checked here, so the list cannot drift) and by tickwire
    with INVALID_ARGUMENT."""
    dh, tw = time_servers
    bad = {f: r for f in TIME_REFUSED if (r := _compare(dh, tw, "update", f)) != "both refused"}
    assert not bad, bad


def test_instant_and_char_filters_answer_as_deephaven(time_servers):
    dh, tw = time_servers
    bad = {f: r for f in TIME_FILTERS if (r := _compare(dh, tw, "where", f)) != "same"}
    assert not bad, bad


def test_a_column_hides_a_time_constant(time_servers):
    dh, tw = time_servers
    outs = [_run_specs(t, "update", ["SECOND = Id + 1", "X = SECOND * 2", "Y = MINUTE"]) for t in (dh, tw)]
    assert outs[0][0] == outs[1][0] == "ok", outs
    assert _same_tables(outs[0][1], outs[1][1].select(outs[0][1].column_names)) == "same"


#: TimeTable start times (a period of ten years, so that the table has exactly its first row):
#: each must start where Deephaven's starts, or be refused with INVALID_ARGUMENT naming the text as
#: Deephaven refuses it.
TIME_TABLE_STARTS = [
    "2023-01-01T11:00 ET", "2023-02-01T11:00:34.001 PT", "2023-03-12T02:30 ET", "2023-11-05T01:30 ET",
    "2023-10-29T01:30 Europe/London", "2023-01-01 ET", "2023-01-01T11:00:00+01", "2023-01-01T11:00:00Z",
    "2023-01-01T11:00 +05:30", "1700000000", "1700000000000", "2023-02-30T11:00 ET", "2023-01-01T24:00 LON",
]
TIME_TABLE_REFUSED = [
    "2023-01-01T11:00 EST", "2023-01-01T11:00", " 2023-01-01T11:00 ET", "2023-01-01T11:00 et", "tomorrow",
    "2023-01-01T11:00:00+0130", "2023-02-30T11:00:00Z",
]


def _first_rows(table, attempts=300):
    """The timestamps of a new time table once its first row is in.

    Deephaven adds a time table's first row on the update-graph cycle after
    the table is made, so a read straight after making it can race that
    cycle; read again (a bounded number of times) until a row is there.
    """
    for _ in range(attempts):
        rows = _normal(table.to_arrow())["Timestamp"].to_pylist()
        if rows:
            return rows
        time.sleep(0.1)
    return rows


def test_time_table_start_times_as_deephaven(time_servers):
    from pydeephaven import DHError

    dh, tw = time_servers
    period = 10 * 365 * 86_400 * NS
    bad = {}
    for start in TIME_TABLE_STARTS:
        firsts = [_first_rows(t.session.time_table(period, start_time=start)) for t in (dh, tw)]
        if firsts[0] != firsts[1] or len(firsts[0]) != 1:
            bad[start] = f"Deephaven {firsts[0]} vs tickwire {firsts[1]}"
    for start in TIME_TABLE_REFUSED:
        for name, t in (("Deephaven", dh), ("tickwire", tw)):
            try:
                t.session.time_table(period, start_time=start).to_arrow()
                bad[start] = f"{name} accepted it"
            except DHError as exc:
                status = _status(exc)
                if "INVALID_ARGUMENT" not in status or (name == "tickwire" and repr(start) not in status):
                    bad[start] = f"{name}: {status[:200]}"
    assert not bad, bad
