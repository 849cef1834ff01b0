"""update_by answers exactly what a real Deephaven 42.7 answers.

The same Arrow tables are uploaded (pydeephaven `import_table`, one upload per data set) into a real
Deephaven server (the suite's shared `deephaven_server`) and into a tickwire server in this process,
and every update_by operation pydeephaven 42.7 offers runs on both: cum_sum, cum_prod, cum_min,
cum_max, cum_count_where, forward_fill, delta (each DeltaControl); ema, ems, emmin, emmax and emstd
by ticks and by time (nanoseconds, ISO-8601 durations and Deephaven's clock form), without and with
an OperationControl (on_null and on_nan each SKIP, RESET, POISON and THROW, and mixed); every
rolling operation (sum, avg, min, max, prod, count, std, wavg, group, formula, count_where) by ticks
and by time, with reverse and forward windows positive, zero and negative. Each runs without and
with a `by` bucket column that has a null key, on int8, int16, int32, int64, float and double
inputs holding nulls, NaN and ±infinity, a timestamp column with repeated and null stamps, and (for
the operations that take any type) the timestamp and a string column themselves. Operations of one
family are sent together in one update_by request (one output column per operation and input).

Answers must be equal: the same column names in the same order, the same Arrow types (instants
compared as nanoseconds: the time zone is presentation only) and `deephaven:type` where both set
it, the same rows in the same order, values equal (integers exactly; floating point within 1e-9
relative, NaN equal to NaN, the sign of zero kept, nulls in the same places; lists element by
element). Deephaven answers a refused request with INVALID_ARGUMENT whose details only point into
its log, so refusals are compared by status code. Each request is one test of its shape (refusal,
columns, rows, the input columns read through) and one test per output column.

Ticking inputs: input tables (a keyed one and an append-only one) on both servers take the same
adds and deletes in steps (appends, upserts in the middle of buckets, a row moving to another
bucket, deletions); after every step each server is waited for until its update_by tables answer
as the same update_by made afresh on the current input, and then the two servers' answers are
compared.

Differences found and not (yet) matched are listed in KNOWN (with what differs) and run as strict
xfails, so that a fix shows up as an unexpected pass.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pyarrow as pa
import pytest

from .interop import close_dh_session
from .interop.dh_server import deephaven_server_available
from .waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")

from pydeephaven import updateby as ub  # noqa: E402  (after the skip)
from pydeephaven.updateby import BadDataBehavior, DeltaControl, OperationControl  # noqa: E402

NAN, INF = math.nan, math.inf
NS = 1_000_000_000
T0 = 1_700_000_000 * NS

# ------------------------------------------------------------------------------------------------
# the data: stamps never go backwards in row order (so neither in any bucket), some repeat, some
# are null; G has a null bucket
_NAMES = ["Id", "G", "I8", "I16", "I32", "I64", "F32", "F64", "Ts", "W", "S", "D"]
_TYPES = [pa.int32(), pa.string(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(),
          pa.timestamp("ns", "UTC"), pa.float64(), pa.string(), pa.float64()]
_ROWS = [
    # Id, G,   I8,   I16,   I32,  I64,  F32,   F64,   Ts (s), W,    S,    D (no NaN)
    (0, "a", 1, 10, 3, 2, 1.5, 1.5, 0, 1.0, "m", 2.0),
    (1, "b", 2, None, 2, -3, None, 2.5, 1, 2.0, None, None),
    (2, "a", None, 3, None, 4, NAN, NAN, 1, 0.5, "c", -1.0),
    (3, None, 4, -4, 4, None, 4.0, 4.0, 2, 1.0, "q", 4.0),
    (4, "b", -5, 5, 5, 5, INF, INF, None, 3.0, "b", INF),
    (5, "a", 6, -6, -6, 6, -2.0, -0.0, 3, None, "z", -0.0),
    (6, "c", 7, 7, 7, -7, 7.0, 7.0, 3, 1.0, "a", 7.0),
    (7, "b", None, None, None, None, None, None, 4, 2.0, None, None),
    (8, "a", 8, 8, 8, 8, -INF, -INF, 6, 1.0, "m", -INF),
    (9, None, -9, 9, 9, 9, 9.0, NAN, 6, 2.0, "y", 9.0),
    (10, "b", 10, 10, -10, 10, 10.0, 10.0, 7, 0.0, "n", 0.0),
    (11, "a", -11, 11, 11, 11, 11.0, 11.0, None, 1.0, "d", 11.0),
    (12, "c", 12, 12, 12, 12, NAN, 12.0, 9, 1.0, "e", 12.0),
    (13, "a", 127, 32767, 13, -13, 0.25, 0.125, 10, 2.0, "f", 0.5),
    (14, "b", -127, -32767, 14, 14, 14.0, -INF, 10, 1.0, "g", INF),
    (15, None, None, 15, 15, 15, 15.0, 15.0, 12, 1.0, "h", 15.0),
    (16, "a", 3, 2, -1, 1, -0.0, 3.0, 12, 1.0, "i", -3.0),
    (17, "c", 2, 1, 0, 0, 1e30, 1e300, 15, 2.0, "j", 1e+300),
]


def _table(rows, names=_NAMES, types=_TYPES) -> pa.Table:
    cols = {}
    for i, (n, t) in enumerate(zip(names, types)):
        vals = [r[i] for r in rows]
        if pa.types.is_timestamp(t):
            vals = [None if v is None else T0 + int(v * NS) for v in vals]
        cols[n] = pa.array(vals, t)
    return pa.table(cols)


DATA = _table(_ROWS)
#: stamps going backwards (in bucket "a" and overall): time-based operations are refused
BACK = _table([(0, "a", 1, 1, 1, 1, 1.0, 1.0, 5, 1.0, "x", 1.0), (1, "a", 2, 2, 2, 2, 2.0, 2.0, 3, 1.0, "y", 2.0),
               (2, "b", 3, 3, 3, 3, 3.0, 3.0, 4, 1.0, "z", 3.0)])
INTS = ["I8", "I16", "I32", "I64"]
FLOATS = ["F32", "F64", "D"]  # D: no NaN
NUMERIC = INTS + FLOATS
BYS = {"no_by": [], "by_G": ["G"]}


# ------------------------------------------------------------------------------------------------
# the requests
@dataclass
class Case:
    name: str
    ops: list
    by: list
    outputs: list  # the output columns, each compared on its own
    source: str = "data"


CASES: dict[str, Case] = {}


def _add(name: str, ops: list, outputs: list, source: str = "data", bys: Optional[dict] = None) -> None:
    for by_name, by in (BYS if bys is None else bys).items():
        full = f"{name}-{by_name}"
        assert full not in CASES, full
        CASES[full] = Case(full, ops, by, list(outputs), source)


def _each(fn: Callable[[list], Any], prefix: str, cols: list) -> tuple[list, list]:
    """One operation per input column, outputs named PREFIX_COLUMN."""
    outs = [f"{prefix}_{c}" for c in cols]
    return [fn([f"{o}={c}"]) for o, c in zip(outs, cols)], outs


def _family(name: str, parts: list[tuple[Callable[[list], Any], str]], cols: list, **kw) -> None:
    ops, outs = [], []
    for fn, prefix in parts:
        o, n = _each(fn, prefix, cols)
        ops += o
        outs += n
    _add(name, ops, outs, **kw)


# cumulative operations, every numeric column in one request
_CUM = [(ub.cum_sum, "cum_sum"), (ub.cum_prod, "cum_prod"), (ub.cum_min, "cum_min"), (ub.cum_max, "cum_max"),
        (ub.forward_fill, "fill"),
        (lambda c: ub.delta(c), "delta"),
        (lambda c: ub.delta(c, DeltaControl.NULL_DOMINATES), "delta_null"),
        (lambda c: ub.delta(c, DeltaControl.VALUE_DOMINATES), "delta_value"),
        (lambda c: ub.delta(c, DeltaControl.ZERO_DOMINATES), "delta_zero")]
_family("cumulative", _CUM, NUMERIC)
_add("cum_count_where", [ub.cum_count_where("CW1", "I32 > 3"), ub.cum_count_where("CW2", ["F64 > 0", "I8 < 10"]),
                         ub.cum_count_where("CW3", "isNull(I16)"), ub.cum_count_where("CW4", "G = `a`")],
     ["CW1", "CW2", "CW3", "CW4"])
# the operations that take other types, one request per operation and type
for _fn, _prefix in _CUM[:5] + [(lambda c: ub.delta(c), "delta")]:
    for _col in ("Ts", "S"):
        _family(f"{_prefix}-{_col}", [(_fn, _prefix)], [_col])
# every column when none is named (strings refused by the arithmetic ones)
_add("cum_sum-every_column", [ub.cum_sum([])], [c for c in _NAMES if c not in ("G", "S")], source="numeric")
_add("ema-every_column", [ub.ema_tick(2, [])], [c for c in _NAMES if c not in ("G", "S")], source="numeric")
_add("rolling_group-every_column", [ub.rolling_group_tick([], 2)], [c for c in _NAMES if c != "G"])
_add("fill-every_column", [ub.forward_fill([])], [c for c in _NAMES if c != "G"])
_add("cum_sum-every_column-with_strings", [ub.cum_sum([])], [c for c in _NAMES if c != "G"])

# exponential operations
_EM_TICK = {"ema": ub.ema_tick, "ems": ub.ems_tick, "emmin": ub.emmin_tick, "emmax": ub.emmax_tick,
            "emstd": ub.emstd_tick}
_EM_TIME = {"ema": ub.ema_time, "ems": ub.ems_time, "emmin": ub.emmin_time, "emmax": ub.emmax_time,
            "emstd": ub.emstd_time}
B = BadDataBehavior
_CONTROLS: dict[str, Optional[OperationControl]] = {
    "default": None,
    "control_default": OperationControl(),
    **{f"null_{b.name}": OperationControl(on_null=b) for b in B},
    **{f"nan_{b.name}": OperationControl(on_nan=b) for b in B},
    "null_RESET-nan_POISON": OperationControl(on_null=B.RESET, on_nan=B.POISON),
    "null_POISON-nan_RESET": OperationControl(on_null=B.POISON, on_nan=B.RESET),
}
#: decay: ("tick", ticks) or ("time", nanoseconds or a duration string)
_DECAYS: dict[str, tuple[str, Any]] = {
    "tick2": ("tick", 2.0), "tick0.5": ("tick", 0.5), "tick10": ("tick", 10),
    "time_PT2s": ("time", "PT2s"), "time_nanos": ("time", 3 * NS), "time_clock": ("time", "PT00:00:01.5"),
}
_EVERY_CONTROL = ("tick2", "time_PT2s")


def _em(kind: str, decay: tuple[str, Any], control: Optional[OperationControl], ts: str = "Ts"):
    how, amount = decay
    if how == "tick":
        return lambda c: _EM_TICK[kind](amount, c, control)
    return lambda c: _EM_TIME[kind](ts, amount, c, control)


for _dname, _decay in _DECAYS.items():
    for _cname, _control in _CONTROLS.items():
        if _cname != "default" and _dname not in _EVERY_CONTROL:
            continue
        for _gname, _cols in (("ints", INTS), ("floats", FLOATS)):
            _family(f"em-{_dname}-{_cname}-{_gname}", [(_em(k, _decay, _control), k) for k in _EM_TICK], _cols)
for _k in _EM_TICK:  # refused: not numbers
    for _col in ("Ts", "S"):
        _family(f"{_k}-tick2-{_col}", [(_em(_k, ("tick", 2.0), None), _k)], [_col])
    _family(f"{_k}-time_PT2s-stamps_back", [(_em(_k, ("time", "PT2s"), None), _k)], ["F64"], source="back")
    _family(f"{_k}-time-not_a_stamp", [(_em(_k, ("time", "PT2s"), None, ts="I32"), _k)], ["F64"])
    _family(f"{_k}-tick_zero", [(_em(_k, ("tick", 0.0), None), _k)], ["F64"])
    _family(f"{_k}-time_zero", [(_em(_k, ("time", 0), None), _k)], ["F64"])


# rolling operations: every kind on every numeric column in one request per window
def _rolling(kind: str, window: tuple[str, Any, Any], ts: str = "Ts") -> Callable[[list], Any]:
    how, rev, fwd = window
    tick = {"sum": ub.rolling_sum_tick, "avg": ub.rolling_avg_tick, "min": ub.rolling_min_tick,
            "max": ub.rolling_max_tick, "prod": ub.rolling_prod_tick, "count": ub.rolling_count_tick,
            "std": ub.rolling_std_tick, "group": ub.rolling_group_tick}
    time = {"sum": ub.rolling_sum_time, "avg": ub.rolling_avg_time, "min": ub.rolling_min_time,
            "max": ub.rolling_max_time, "prod": ub.rolling_prod_time, "count": ub.rolling_count_time,
            "std": ub.rolling_std_time, "group": ub.rolling_group_time}
    if kind == "wavg":
        if how == "tick":
            return lambda c: ub.rolling_wavg_tick("W", c, rev, fwd)
        return lambda c: ub.rolling_wavg_time(ts, "W", c, rev, fwd)
    if kind.startswith("formula:"):
        _f, param, formula = kind.split(":", 2)
        if how == "tick":
            return lambda c: ub.rolling_formula_tick(formula, param, c, rev, fwd)
        return lambda c: ub.rolling_formula_time(ts, formula, param, c, rev, fwd)
    if how == "tick":
        return lambda c: tick[kind](c, rev, fwd)
    return lambda c: time[kind](ts, c, rev, fwd)


def _count_where(window: tuple[str, Any, Any], col: str, filters) -> Any:
    how, rev, fwd = window
    if how == "tick":
        return ub.rolling_count_where_tick(col, filters, rev, fwd)
    return ub.rolling_count_where_time("Ts", col, filters, rev, fwd)


_ROLLING_KINDS = ["sum", "avg", "min", "max", "prod", "count", "std", "wavg", "group"]
#: windows Deephaven answers (by the name of the window)
_WINDOWS: dict[str, tuple[str, Any, Any]] = {
    "tick_3_0": ("tick", 3, 0), "tick_1_0": ("tick", 1, 0), "tick_0_2": ("tick", 0, 2), "tick_3_2": ("tick", 3, 2),
    "tick_5_-2": ("tick", 5, -2), "tick_-1_3": ("tick", -1, 3), "tick_1_1": ("tick", 1, 1),
    "time_PT2s_0": ("time", "PT2s", 0), "time_nanos_2s_2s": ("time", 2 * NS, 2 * NS),
    "time_PT3s_PT1s": ("time", "PT3s", "PT1s"), "time_PT5s_-PT2s": ("time", "PT5s", "-PT2s"),
    "time_-PT1s_PT3s": ("time", "-PT1s", "PT3s"), "time_0_0": ("time", 0, 0),
    "time_clock": ("time", "PT00:00:02", "PT00:00:01"), "time_0_PT0.5s": ("time", 0, "PT0.5s"),
}
#: windows refused (empty or backwards)
_BAD_WINDOWS: dict[str, tuple[str, Any, Any]] = {
    "tick_0_0": ("tick", 0, 0), "tick_-2_1": ("tick", -2, 1), "tick_2_-2": ("tick", 2, -2),
    "time_-PT1s_-PT1s": ("time", "-PT1s", "-PT1s"), "time_PT1s_-PT2s": ("time", "PT1s", "-PT2s"),
}
for _wname, _window in _WINDOWS.items():
    _ops, _outs = [], []
    for _k in _ROLLING_KINDS:
        if _k == "group" and _window[0] == "time":  # Deephaven refuses it on null stamps: below
            continue
        _o, _n = _each(_rolling(_k, _window), f"r{_k}", NUMERIC)
        _ops += _o
        _outs += _n
    _ops += [_count_where(_window, "RCW1", "I32 > 3"), _count_where(_window, "RCW2", ["F64 >= 0", "I8 < 10"])]
    _add(f"rolling-{_wname}", _ops, _outs + ["RCW1", "RCW2"])
for _wname, _window in _WINDOWS.items():  # time windows of groups: on rows with a stamp too
    if _window[0] == "time":
        _family(f"rolling_group-{_wname}", [(_rolling("group", _window), "rgroup")], NUMERIC)
        _family(f"rolling_group-{_wname}-stamped", [(_rolling("group", _window), "rgroup")], NUMERIC + ["S"],
                source="stamped")
for _wname, _window in _BAD_WINDOWS.items():
    for _k in _ROLLING_KINDS + ["formula:y:sum(y)"]:
        _k_name = "formula" if _k.startswith("formula") else _k
        _family(f"rolling_{_k_name}-{_wname}", [(_rolling(_k, _window), f"r{_k_name}")], ["I32"])
    _add(f"rolling_count_where-{_wname}", [_count_where(_window, "RCW", "I32 > 3")], ["RCW"])
for _k in _ROLLING_KINDS:  # other types, one request per kind and type
    for _col in ("Ts", "S"):
        _family(f"rolling_{_k}-tick_3_0-{_col}", [(_rolling(_k, _WINDOWS["tick_3_0"]), f"r{_k}")], [_col])
    _family(f"rolling_{_k}-time-stamps_back", [(_rolling(_k, _WINDOWS["time_PT2s_0"]), f"r{_k}")], ["I32"],
            source="back")
#: name -> "parameter:formula" (Deephaven 42.7's service refuses max(x) with the parameter x: it replaces
#: every x, the one in `max` too; not max(y))
_FORMULAS = {"sum": "y:sum(y)", "avg": "y:avg(y)", "min": "y:min(y)", "max": "y:max(y)", "count": "y:count(y)",
             "std": "y:std(y)", "range": "y:max(y) - min(y)", "sum_plus": "y:sum(y) + 1", "max_x": "x:max(x)",
             "median": "each:median(each)"}
for _fname, _formula in _FORMULAS.items():
    for _wname in ("tick_3_0", "tick_-1_3", "time_PT2s_0", "time_PT5s_-PT2s"):
        for _gname, _cols in (("ints", INTS), ("floats", FLOATS)):
            _family(f"rolling_formula-{_fname}-{_wname}-{_gname}",
                    [(_rolling(f"formula:{_formula}", _WINDOWS[_wname]), f"rf_{_fname}")], _cols)
# requests refused whatever the data
_add("error-unknown_column", [ub.cum_sum(["X=Nope"])], ["X"])
_add("error-output_twice", [ub.cum_sum(["X=I32"]), ub.cum_max(["X=I64"])], ["X"])
_add("error-output_is_by_column", [ub.cum_sum(["G=I32"])], ["G"], bys={"by_G": ["G"]})
_add("error-unknown_by_column", [ub.cum_sum(["X=I32"])], ["X"], bys={"by_Nope": ["Nope"]})
_add("error-wavg_string_weight", [ub.rolling_wavg_tick("S", ["X=I32"], 3)], ["X"])
_add("error-wavg_unknown_weight", [ub.rolling_wavg_tick("Nope", ["X=I32"], 3)], ["X"])
_add("error-count_where_unknown_column", [ub.cum_count_where("X", "Nope > 1")], ["X"])
_add("error-time_unknown_column", [ub.rolling_sum_time("Nope", ["X=I32"], "PT1s")], ["X"])
_add("error-bad_duration", [ub.rolling_sum_time("Ts", ["X=I32"], "PT1x")], ["X"])
_add("error-no_operations", [], [])

#: differences from Deephaven 42.7 known and not (yet) matched: what differs -> the test ids
#: ("case" or "case::column", regular expressions matched in full)
KNOWN: dict[str, tuple[str, ...]] = {
}


def _known(item: str) -> Optional[str]:
    for why, patterns in KNOWN.items():
        if any(re.fullmatch(pattern, item) for pattern in patterns):
            return why
    return None


# ------------------------------------------------------------------------------------------------
# asking and comparing
def _code(exc: BaseException) -> str:
    """The gRPC status code behind a pydeephaven error (the details of Deephaven's point into its
    log), or the kind of error pyarrow's Flight errors carry."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        code = getattr(seen, "code", None)
        if callable(code):
            try:
                return str(code().name)
            except (AttributeError, TypeError, ValueError):  # not a grpc error after all
                pass
        m = re.search(r"gRPC returned ([a-z ]+) error", str(seen))
        if m:
            return m.group(1).upper().replace(" ", "_")
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__}: {exc}"


def _answer(make: Callable[[], Any]) -> tuple:
    """("ok", arrow table) or ("refused", status code); a table made but unreadable is refused."""
    from pydeephaven import DHError

    try:
        return "ok", make().to_arrow()
    except (DHError, pa.ArrowException) as exc:
        return "refused", _code(exc)


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.timestamp("ns")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_plain_type(t.value_type))
    return t


def _values(col: pa.ChunkedArray) -> list:
    t = col.type
    if pa.types.is_timestamp(t):
        return col.cast(pa.timestamp("ns")).cast(pa.int64()).to_pylist()
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_timestamp(t.value_type):
        return col.cast(pa.list_(pa.timestamp("ns"))).cast(pa.list_(pa.int64())).to_pylist()
    return col.to_pylist()


def _same(u, v) -> bool:
    if u is None or v is None:
        return u is None and v is None
    if isinstance(u, list) or isinstance(v, list):
        return isinstance(u, list) and isinstance(v, list) and len(u) == len(v) and all(map(_same, u, v))
    if isinstance(u, float) and isinstance(v, float):
        if math.isnan(u) or math.isnan(v):
            return math.isnan(u) and math.isnan(v)
        if u == v == 0.0:
            return math.copysign(1.0, u) == math.copysign(1.0, v)
        if math.isinf(u) or math.isinf(v):
            return u == v
        return abs(u - v) <= 1e-9 * max(abs(u), abs(v))
    return type(u) is type(v) and u == v


def _dh_type(f: pa.Field) -> Optional[bytes]:
    return (f.metadata or {}).get(b"deephaven:type")


def _column_difference(a: pa.Table, b: pa.Table, name: str, dh_type: bool = True) -> Optional[str]:
    """None when column `name` is the same in both answers (`dh_type`: its deephaven:type too),
    else what differs."""
    if name not in a.column_names or name not in b.column_names:
        return f"column {name}: Deephaven has it: {name in a.column_names}, tickwire: {name in b.column_names}"
    f, g = a.schema.field(name), b.schema.field(name)
    if _plain_type(f.type) != _plain_type(g.type):
        return f"{name} type: Deephaven {f.type}, tickwire {g.type}"
    if dh_type and _dh_type(f) is not None and _dh_type(g) is not None and _dh_type(f) != _dh_type(g):
        return f"{name} deephaven:type: Deephaven {_dh_type(f)!r}, tickwire {_dh_type(g)!r}"
    x, y = _values(a.column(name)), _values(b.column(name))
    if len(x) != len(y):
        return f"{name}: Deephaven has {len(x)} rows, tickwire {len(y)}"
    bad = [i for i, (u, v) in enumerate(zip(x, y)) if not _same(u, v)]
    if bad:
        return f"{name} differs at rows {bad}:\n  Deephaven {x}\n  tickwire  {y}"[:2500]
    return None


def _difference(dh: tuple, tw: tuple, columns: Optional[list] = None, no_dh_type: tuple = ()) -> Optional[str]:
    """None when tickwire answered as Deephaven did (the shape, and `columns`: every column when
    None; the deephaven:type of those in `no_dh_type` aside), else what differs."""
    if dh[0] != tw[0]:
        def show(answer: tuple) -> str:
            state, what = answer
            return f"{state} ({what.num_rows} rows {str(what.to_pylist())[:600]})" if state == "ok" else \
                f"{state} ({what})"
        return f"Deephaven {show(dh)}, tickwire {show(tw)}"
    if dh[0] == "refused":
        return None if dh[1] == tw[1] else f"refused with {dh[1]} by Deephaven, {tw[1]} by tickwire"
    a, b = dh[1], tw[1]
    if a.column_names != b.column_names:
        return f"columns: Deephaven {a.column_names}, tickwire {b.column_names}"
    if a.num_rows != b.num_rows:
        return f"rows: Deephaven {a.num_rows}, tickwire {b.num_rows}"
    problems = [d for n in (a.column_names if columns is None else columns)
                if (d := _column_difference(a, b, n, n not in no_dh_type)) is not None]
    return "\n".join(problems) or None


# ------------------------------------------------------------------------------------------------
# the servers
@pytest.fixture(scope="module")
def sessions(deephaven_server):
    """pydeephaven sessions to the shared Deephaven and to a tickwire server of this module."""
    from pydeephaven import Session
    from pydeephaven.table import Table as DhTable

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    # pydeephaven releases a Table's export when the object is collected, with a blocking call that
    # can deadlock when the collection happens on a thread of the in-process tickwire server; here
    # every export lives until its session closes instead.
    patch = pytest.MonkeyPatch()
    patch.setattr(DhTable, "__del__", lambda self: None)
    engine = Engine(interval_ms=50)
    tw = TickwireServer(engine, port=0).start()
    dh_session = Session(host="127.0.0.1", port=deephaven_server.port)
    tw_session = Session(host="127.0.0.1", port=tw.port)
    try:
        yield {"dh": dh_session, "tw": tw_session}
    finally:
        for s in (dh_session, tw_session):
            close_dh_session(s)  # each, whatever the other's close did
        tw.stop()
        engine.stop()
        patch.undo()


def _sources(session) -> dict:
    data = session.import_table(DATA)
    return {"data": data, "numeric": data.drop_columns(["S"]), "back": session.import_table(BACK),
            "stamped": data.where(["!isNull(Ts)"])}


def static_answers_of(sessions: dict, cases: Optional[dict] = None) -> dict:
    """{case: (Deephaven's answer, tickwire's answer)}."""
    sources = {side: _sources(s) for side, s in sessions.items()}
    out = {}
    for name, case in (CASES if cases is None else cases).items():
        out[name] = tuple(_answer(lambda side=side, case=case: sources[side][case.source].update_by(case.ops,
                                                                                                   by=case.by))
                          for side in ("dh", "tw"))
    return out


@pytest.fixture(scope="module")
def static_answers(sessions):
    return static_answers_of(sessions)


def _param(*values: str):
    item = "::".join(v for v in values if v)
    why = _known(item)
    return pytest.param(*values, id=item, marks=[pytest.mark.xfail(strict=True, reason=why)] if why else [])


@pytest.mark.parametrize("case,column", [_param(c, "") for c in CASES] +
                         [_param(c, o) for c, case in CASES.items() for o in case.outputs])
def test_update_by_answers_as_deephaven(static_answers, case, column):
    """The request's shape (refused with the same code, or the same columns, rows and input
    columns), or one output column's type and values."""
    dh, tw = static_answers[case]
    if column:
        if dh[0] == "refused":
            pytest.skip(f"Deephaven refused {case} ({dh[1]}): compared by the request's own test")
        assert tw[0] == "ok", f"{case}: Deephaven answered, tickwire refused with {tw[1]}"
        difference = _column_difference(dh[1], tw[1], column)
    else:
        inputs = None if dh[0] != "ok" else [n for n in dh[1].column_names if n not in CASES[case].outputs]
        difference = _difference(dh, tw, columns=inputs)
    assert difference is None, f"{case}: {difference}"


def test_deephaven_answers_as_recorded(static_answers):
    """Some of Deephaven's rules the cases rest on, so that another Deephaven build shows up here
    rather than as tickwire differences (and the comparisons are of answers, not only refusals)."""
    dh = {name: answers[0] for name, answers in static_answers.items()}
    assert sum(state == "ok" for state, _ in dh.values()) > 0.5 * len(dh)
    cum = dh["cumulative-by_G"][1]
    assert cum.schema.field("cum_sum_I8").type == pa.int64()
    assert cum.column("cum_sum_I32").to_pylist()[:6] == [3, 2, 3, 4, 7, -3]
    for refused in ("rolling_sum-tick_0_0-no_by", "ema-time_PT2s-stamps_back-no_by", "error-unknown_column-no_by",
                    "rolling_formula-max_x-tick_3_0-ints-no_by"):
        assert dh[refused] == ("refused", "INVALID_ARGUMENT"), refused
    assert dh["em-tick2-nan_THROW-ints-no_by"][0] == "ok"  # no NaN in integers
    assert dh["em-tick2-null_THROW-floats-no_by"][0] == "refused"


# ------------------------------------------------------------------------------------------------
# ticking inputs: input tables on both servers, changed the same way in steps
TICK_SCHEMA = pa.schema([("Id", pa.int32()), ("G", pa.string()), ("I32", pa.int32()), ("F64", pa.float64()),
                         ("Ts", pa.timestamp("ns", "UTC"))])
#: name -> key columns (None: append-only)
INPUTS: dict[str, Optional[list[str]]] = {"keyed": ["Id"], "append": None}


def _tick_rows(rows) -> pa.Table:
    return _table(rows, TICK_SCHEMA.names, TICK_SCHEMA.types)


#: (step, {input: [("add" or "delete", rows)]}); a key deleted from the keyed table is never added
#: again (Deephaven puts it back at its old place, tickwire at the end: see tests/test_input_tables.py)
STEPS: list[tuple[str, dict[str, list[tuple[str, pa.Table]]]]] = [
    ("initial", {
        "keyed": [("add", _tick_rows([(0, "a", 1, 1.0, 0), (1, "b", 2, 2.0, 1), (2, "a", None, NAN, 1),
                                      (3, None, 4, 4.0, 2), (4, "b", 5, None, None), (5, "a", 6, 6.0, 3),
                                      (6, "a", 7, -1.0, 4), (7, "b", -8, 8.0, 5)]))],
        "append": [("add", _tick_rows([(0, "a", 1, 1.0, 0), (1, "b", 2, 2.0, 1), (2, "a", None, NAN, 1),
                                       (3, None, 4, 4.0, 2), (4, "b", 5, None, None)]))],
    }),
    ("appends", {
        "keyed": [("add", _tick_rows([(8, "a", 9, 9.0, 6), (9, None, 10, INF, 6), (10, "b", 11, 11.0, 8)]))],
        "append": [("add", _tick_rows([(5, "a", 6, 6.0, 3), (6, "a", 7, -1.0, 4)])),
                   ("add", _tick_rows([(7, "b", -8, 8.0, 5)]))],
    }),
    ("upserts_in_the_middle", {  # values change (stamps kept); row 5 moves from bucket a to b
        "keyed": [("add", _tick_rows([(2, "a", 3, 3.5, 1), (5, "b", 60, -6.0, 3), (1, "b", None, NAN, 1)]))],
        "append": [("add", _tick_rows([(8, "a", 9, 9.0, 6), (9, None, 10, INF, 6)]))],
    }),
    ("deletions", {
        "keyed": [("delete", pa.table({"Id": pa.array([1, 6], pa.int32())}))],
        "append": [("add", _tick_rows([(10, "b", 11, 11.0, 8), (11, "c", None, -INF, None)]))],
    }),
    ("mixed", {
        "keyed": [("add", _tick_rows([(0, "c", 100, 0.5, 0), (11, "a", 12, 12.0, 9), (12, "c", 13, NAN, 9)])),
                  ("delete", pa.table({"Id": pa.array([9, 3], pa.int32())}))],
        "append": [("add", _tick_rows([(12, "a", 13, 13.0, 9), (13, "a", 14, 14.0, 12), (14, "b", 15, 1.0, 12)]))],
    }),
]
STEP_NAMES = [name for name, _ in STEPS]

#: the update_by operations every ticking table has (one request)
TICK_OPS = [
    ub.cum_sum(["CS_I=I32", "CS_F=F64"]), ub.cum_prod(["CP=I32"]), ub.cum_min(["CMin=F64"]), ub.cum_max(["CMax=I32"]),
    ub.forward_fill(["Fill=F64"]), ub.delta(["D=I32"]), ub.delta(["DV=F64"], DeltaControl.VALUE_DOMINATES),
    ub.cum_count_where("CW", "I32 > 3"),
    ub.ema_tick(2.0, ["EmaT=F64", "EmaTI=I32"]), ub.ems_tick(3.0, ["EmsT=F64"]), ub.emmin_tick(2.0, ["EmMinT=I32"]),
    ub.emmax_tick(2.0, ["EmMaxT=F64"]), ub.emstd_tick(2.0, ["EmStdT=F64"]),
    ub.ema_tick(2.0, ["EmaReset=F64"], OperationControl(on_null=B.RESET, on_nan=B.RESET)),
    ub.ema_tick(2.0, ["EmaPoison=F64"], OperationControl(on_nan=B.POISON)),
    ub.ema_time("Ts", "PT2s", ["EmaTime=F64"]), ub.emstd_time("Ts", 2 * NS, ["EmStdTime=I32"]),
    ub.emmax_time("Ts", "PT1s", ["EmMaxTime=F64"]),
    ub.rolling_sum_tick(["RS=I32", "RSF=F64"], 3), ub.rolling_avg_tick(["RA=F64"], 2, 1),
    ub.rolling_min_tick(["RMin=I32"], 3, 2), ub.rolling_max_tick(["RMax=I32"], -1, 2),
    ub.rolling_prod_tick(["RP=I32"], 2), ub.rolling_count_tick(["RC=F64"], 3, -1), ub.rolling_std_tick(["RStd=F64"], 3),
    ub.rolling_wavg_tick("F64", ["RW=I32"], 3), ub.rolling_group_tick(["RG=I32"], 2, 1),
    ub.rolling_count_where_tick("RCW", "I32 > 3", 3, 1), ub.rolling_formula_tick("sum(x)", "x", ["RF=I32"], 2),
    ub.rolling_sum_time("Ts", ["RSTime=I32"], "PT2s"), ub.rolling_avg_time("Ts", ["RATime=F64"], "PT1s", "PT1s"),
    ub.rolling_min_time("Ts", ["RMinTime=I32"], 0, "PT2s"),
    ub.rolling_count_time("Ts", ["RCTime=I32"], "PT3s", "-PT1s"),
    ub.rolling_count_where_time("Ts", "RCWTime", "F64 > 0", "PT2s", "PT1s"),
]
#: rolling_group's deephaven:type differs (Deephaven: io.deephaven.vector.IntVector, tickwire: int[]):
#: an xfail of the static cases; the ticking ones compare its values
NO_DH_TYPE = ("RG",)
TICKING = {f"{inp}-{by_name}": (inp, by) for inp in INPUTS for by_name, by in BYS.items()}
#: ticking differences from Deephaven 42.7 that are known and not (yet) matched: (step, table) -> what differs
KNOWN_TICKING: dict[tuple[str, str], str] = {}
SETTLE_SECONDS = 30.0


class _Model:
    """What an input table holds after the story's changes: rows in any order."""

    def __init__(self, keys: Optional[list[str]]):
        self.keys = keys or []  # none: append-only
        self.rows: list[dict] = []

    def apply(self, action: str, data: pa.Table) -> None:
        rows = data.to_pylist()
        if action == "delete":
            gone = {tuple(r[k] for k in self.keys) for r in rows}
            self.rows = [r for r in self.rows if tuple(r[k] for k in self.keys) not in gone]
        elif not self.keys:
            self.rows += rows
        else:
            for r in rows:
                at = [i for i, old in enumerate(self.rows) if all(old[k] == r[k] for k in self.keys)]
                if at:
                    self.rows[at[0]] = r
                else:
                    self.rows.append(r)

    def holds(self, table) -> bool:
        try:
            got = table.to_arrow().to_pylist()
        except Exception:  # noqa: BLE001 - not readable yet: not settled
            return False
        return sorted(map(repr, got)) == sorted(map(repr, self.rows))


class _Side:
    """One server's part of the story: its input tables, the update_by tables that follow them."""

    def __init__(self, session):
        self.session = session
        self.inputs = {name: session.input_table(schema=TICK_SCHEMA, key_cols=keys) for name, keys in INPUTS.items()}
        self.models = {name: _Model(keys) for name, keys in INPUTS.items()}
        self.derived: dict[str, Any] = {}

    def apply(self, actions: dict) -> None:
        for name, changes in actions.items():
            for action, data in changes:
                target = self.inputs[name]
                (target.add if action == "add" else target.delete)(self.session.import_table(data))
                self.models[name].apply(action, data)

    def make(self, name: str):
        inp, by = TICKING[name]
        return self.inputs[inp].update_by(TICK_OPS, by=by)

    def settle(self, step: str) -> dict:
        """Waits until the inputs hold what the story put in and each update_by table answers as
        the same update_by made afresh on them; returns {name: answer}."""
        assert wait_until(lambda: all(self.models[n].holds(self.inputs[n]) for n in INPUTS), SETTLE_SECONDS, 0.05), (
            f"the input tables never held the story's rows after step {step}")
        if not self.derived:
            self.derived = {name: self.make(name) for name in TICKING}
        out = {}
        for name in TICKING:
            last: dict = {}

            def caught_up(name=name, last=last) -> bool:
                last["answer"] = _answer(lambda: self.derived[name])
                fresh = _answer(lambda: self.make(name))
                return last["answer"][0] == "ok" and _difference(fresh, last["answer"]) is None
            if not wait_until(caught_up, SETTLE_SECONDS, 0.05):
                last["answer"] = ("not settled", last["answer"])
            out[name] = last["answer"]
        return out


@pytest.fixture(scope="module")
def ticking_answers(sessions):
    """{(step, table): (Deephaven's answer, tickwire's answer)}."""
    sides = {side: _Side(s) for side, s in sessions.items()}
    answers: dict = {}
    for step, actions in STEPS:
        for side in sides.values():
            side.apply(actions)
        got = {label: side.settle(step) for label, side in sides.items()}
        for name in TICKING:
            answers[(step, name)] = (got["dh"][name], got["tw"][name])
    return answers


def _ticking_param(step: str, name: str):
    known = KNOWN_TICKING.get((step, name))
    return pytest.param(step, name, marks=[pytest.mark.xfail(strict=True, reason=known)] if known else [])


@pytest.mark.parametrize("step,name", [_ticking_param(s, n) for s in STEP_NAMES for n in TICKING])
def test_ticking_update_by_answers_as_deephaven(ticking_answers, step, name):
    dh, tw = ticking_answers[(step, name)]
    assert dh[0] == "ok", f"Deephaven's {name} did not answer as the same update_by made afresh: {dh[1]}"
    assert tw[0] == "ok", (f"tickwire's {name} did not answer as the same update_by made afresh: {tw[1]}; "
                           f"Deephaven answered {dh[1].to_pylist()}")
    difference = _difference(dh, tw, no_dh_type=NO_DH_TYPE)
    assert difference is None, f"{name} after {step}: {difference}"


def test_deephaven_ticking_answers_as_recorded(ticking_answers):
    """The story's changes reached Deephaven's answers as the steps say (so that the comparisons
    above are of changed tables)."""
    def column(step: str, name: str, col: str) -> list:
        state, table = ticking_answers[(step, name)][0]
        assert state == "ok", (step, name, table)
        return table.column(col).to_pylist()

    assert column("initial", "keyed-no_by", "CS_I") == [1, 3, 3, 7, 12, 18, 25, 17]
    assert column("upserts_in_the_middle", "keyed-by_G", "G")[5] == "b"
    assert len(column("deletions", "keyed-no_by", "Id")) == 9
    assert column("mixed", "append-no_by", "Id")[-3:] == [12, 13, 14]
