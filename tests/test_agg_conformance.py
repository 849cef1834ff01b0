"""Aggregations answer exactly what a real Deephaven 42.7 answers.

One Arrow table (every integer width with its valid extremes, float and double with null, NaN,
±infinity and -0.0, booleans, strings and instants, nulls in every column; groups "a" and "b" with
several rows, "n" whose values are all null, "one" with a single row, "f" with the float specials,
and a null key group) is put into a real Deephaven server (pydeephaven `import_table`) and into a
tickwire server twice: as a static table, and as a keyed table that reaches the same rows through
several writes made after every aggregation was asked for, so that tickwire answers them
incrementally (appends, an upsert that moves a row from one group to another and back, a group that
empties and fills again, removals that empty a group). Both tickwire tables are compared with the
same Deephaven answer on the static table.

Every AggSpec kind runs alone on every column, grouped and without group-by columns, on the table
and on an empty table (with and without preserve_empty); then every kind Deephaven accepts runs
together in one request (by one key, two keys and none), and AggregateAll, the *_by shortcuts,
count_by, select_distinct, head_by, tail_by, ComboAggregate, initial_groups and a Batch. The answers
must be equal: the same column names in the same order, the same Arrow types (instants compared as
nanoseconds; Deephaven's time zone is presentation only) and `deephaven:type`, the same rows in the
same order, values equal (floating point within 1e-9 relative, NaN equal to NaN, the sign of zero
kept). What Deephaven refuses tickwire must refuse too.

All requests are made when the module's fixture starts (the ticking tickwire answers must exist
before the writes); the tests compare what was answered. One Deephaven server serves the module.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pyarrow as pa
import pytest

from tickwire.server.engine import Engine, TableSpec

from .interop import close_dh_session
from .interop.dh_server import deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")

from deephaven_core.proto import table_pb2  # noqa: E402  (after the skip: pydeephaven brings it)

NAN, INF = math.nan, math.inf
NS = 1_000_000_000
T0 = 1_700_000_400 * NS  # 2023-11-14T22:20:00Z
I64_MAX = 2 ** 63 - 1

#: Deephaven reserves each integer type's minimum for null, so the valid minimum is MIN + 1.
#: Columns: Id (unique, the keyed table's key), G (string group), H (int32 second key), the value
#: columns, W (positive weights with one null).
_ROWS = [
    # Id, G,    H,  I8,   I16,    I32,          I64,          F32,   F64,    B,     S,    Ts,         W
    (0, "a", 1, 3, 3, 3, 3, 1.5, 1.5, True, "x", T0 + 3, 1.0),
    (1, "b", 1, None, 5, None, 5, None, 2.0, None, "y", None, 2.0),
    (2, "a", 2, 1, 1, 1, 1, -0.0, -0.0, False, "b", T0 + 1, 3.0),
    (3, "n", 1, None, None, None, None, None, None, None, None, None, 1.0),
    (4, "f", 1, 1, 1, 1, 1, NAN, NAN, True, "a", T0, 1.0),
    (5, "one", 2, 7, 7, 7, 7, 7.0, 7.0, False, "z", T0 + 7, 2.0),
    (6, "a", 1, 2, 2, 2, 2, 0.0, 0.0, True, "c", T0 + 2, 1.0),
    (7, "b", 2, 4, None, 4, None, 4.0, None, True, None, T0 + 4, 1.0),
    (8, "f", 2, 2, 2, 2, 2, INF, INF, False, "b", T0 + 2, 2.0),
    (9, None, 1, 5, 5, 5, 5, 5.0, 5.0, None, "k", T0 + 5, 1.0),
    (10, "f", 1, 3, 3, 3, 3, -INF, -INF, True, "c", T0 + 3, 3.0),
    (11, "a", 2, -127, -32767, -2 ** 31 + 1, -I64_MAX, -1e30, -1e300, False, "", -1, 2.0),
    (12, "n", 2, None, None, None, None, None, None, None, None, None, 2.0),
    (13, "b", 1, 4, 4, 4, 4, 4.0, 4.0, False, "y", T0 + 4, None),
    (14, None, 2, None, None, None, None, None, None, None, None, None, 1.0),
    (15, "a", 1, 127, 32767, 2 ** 31 - 1, I64_MAX, 1e30, 1e300, True, "AAPL", T0 + 3600 * NS, 1.0),
    (16, "f", 1, -5, -5, -5, -5, INF, -0.0, None, "f", T0 - 1, 1.0),
]
_NAMES = ["Id", "G", "H", "I8", "I16", "I32", "I64", "F32", "F64", "B", "S", "Ts", "W"]
_TYPES = [pa.int32(), pa.string(), pa.int32(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(),
          pa.float64(), pa.bool_(), pa.string(), pa.timestamp("ns", "UTC"), pa.float64()]


def _table(rows) -> pa.Table:
    return pa.table({n: pa.array([r[i] for r in rows], t) for i, (n, t) in enumerate(zip(_NAMES, _TYPES))})


DATA = _table(_ROWS)
VALUE_COLUMNS = ["I8", "I16", "I32", "I64", "F32", "F64", "B", "S", "Ts"]
NUMERIC = ["I8", "I16", "I32", "I64", "F32", "F64"]

Spec = table_pb2.AggSpec
Agg = table_pb2.Aggregation
_NULL = Spec.AggSpecNonUniqueSentinel(null_value=table_pb2.NullValue.NULL_VALUE)


def _sorted(first: bool, column: str):
    s = Spec.AggSpecSorted(columns=[Spec.AggSpecSortedColumn(column_name=column)])
    return Spec(sorted_first=s) if first else Spec(sorted_last=s)


def _pct(p: float, avg: bool = False):
    return Spec(percentile=Spec.AggSpecPercentile(percentile=p, average_evenly_divided=avg))


#: every AggSpec kind, as a function of the aggregated column (the sorted kinds sort by it)
KINDS: dict[str, Callable[[str], Any]] = {
    "sum": lambda c: Spec(sum=Spec.AggSpecSum()),
    "abs_sum": lambda c: Spec(abs_sum=Spec.AggSpecAbsSum()),
    "avg": lambda c: Spec(avg=Spec.AggSpecAvg()),
    "min": lambda c: Spec(min=Spec.AggSpecMin()),
    "max": lambda c: Spec(max=Spec.AggSpecMax()),
    "first": lambda c: Spec(first=Spec.AggSpecFirst()),
    "last": lambda c: Spec(last=Spec.AggSpecLast()),
    "count_distinct": lambda c: Spec(count_distinct=Spec.AggSpecCountDistinct(count_nulls=False)),
    "count_distinct_nulls": lambda c: Spec(count_distinct=Spec.AggSpecCountDistinct(count_nulls=True)),
    "distinct": lambda c: Spec(distinct=Spec.AggSpecDistinct(include_nulls=False)),
    "distinct_nulls": lambda c: Spec(distinct=Spec.AggSpecDistinct(include_nulls=True)),
    "unique": lambda c: Spec(unique=Spec.AggSpecUnique(include_nulls=False, non_unique_sentinel=_NULL)),
    "unique_nulls": lambda c: Spec(unique=Spec.AggSpecUnique(include_nulls=True, non_unique_sentinel=_NULL)),
    "median": lambda c: Spec(median=Spec.AggSpecMedian(average_evenly_divided=True)),
    "median_lower": lambda c: Spec(median=Spec.AggSpecMedian(average_evenly_divided=False)),
    "pct_0": lambda c: _pct(0.0),
    "pct_25": lambda c: _pct(0.25),
    "pct_25_avg": lambda c: _pct(0.25, True),
    "pct_50_avg": lambda c: _pct(0.5, True),
    "pct_90": lambda c: _pct(0.9),
    "pct_100": lambda c: _pct(1.0),
    "approx_pct_50": lambda c: Spec(approximate_percentile=Spec.AggSpecApproximatePercentile(percentile=0.5)),
    "std": lambda c: Spec(std=Spec.AggSpecStd()),
    "var": lambda c: Spec(var=Spec.AggSpecVar()),
    "weighted_avg": lambda c: Spec(weighted_avg=Spec.AggSpecWeighted(weight_column="W")),
    "weighted_sum": lambda c: Spec(weighted_sum=Spec.AggSpecWeighted(weight_column="W")),
    "sorted_first": lambda c: _sorted(True, c),
    "sorted_last": lambda c: _sorted(False, c),
    "group": lambda c: Spec(group=Spec.AggSpecGroup()),
    "freeze": lambda c: Spec(freeze=Spec.AggSpecFreeze()),
    "formula_each": lambda c: Spec(formula=Spec.AggSpecFormula(formula="count(each)", param_token="each")),
}
#: kinds whose output is the Id of the chosen row (the column itself is the sort key)
SORTED_KINDS = ("sorted_first", "sorted_last")


def _column_agg(kind: str, column: str, out: Optional[str] = None):
    pairs = ([f"{out}={column}"] if out else [column]) if kind not in SORTED_KINDS else [f"{out or column}=Id"]
    return Agg(columns=Agg.AggregationColumns(spec=KINDS[kind](column), match_pairs=pairs))


#: aggregations that are not per column: name -> Aggregation
OTHER_AGGS = {
    "count": Agg(count=Agg.AggregationCount(column_name="N")),
    "first_row_key": Agg(first_row_key=Agg.AggregationRowKey(column_name="FirstKey")),
    "last_row_key": Agg(last_row_key=Agg.AggregationRowKey(column_name="LastKey")),
    "count_where": Agg(count_where=Agg.AggregationCountWhere(column_name="CW", filters=["I32 > 1"])),
    "formula": Agg(formula=Agg.AggregationFormula(selectable=table_pb2.Selectable(raw="X = sum(I32)"))),
    "partition": Agg(partition=Agg.AggregationPartition(column_name="P", include_group_by_columns=True)),
}


# ------------------------------------------------------------------------------------------------
# requests pydeephaven does not make itself
class _Aggregate:
    """A TableService.Aggregate call with everything AggregateRequest has (pydeephaven sends no
    preserve_empty, initial_groups or row-key aggregations)."""

    def __init__(self, aggs, by, preserve_empty=False, initial=None):
        self.aggs, self.by, self.preserve_empty, self.initial = aggs, by, preserve_empty, initial

    @classmethod
    def get_stub_func(cls, stub):
        return stub.Aggregate

    def make_grpc_request(self, result_id, source_id):
        extra = {}
        if self.initial is not None:
            extra["initial_groups_id"] = table_pb2.TableReference(ticket=self.initial.pb_ticket)
        return table_pb2.AggregateRequest(result_id=result_id, source_id=source_id, aggregations=self.aggs,
                                          group_by_columns=self.by, preserve_empty=self.preserve_empty, **extra)


class _AggregateAll:
    def __init__(self, spec, by):
        self.spec, self.by = spec, by

    @classmethod
    def get_stub_func(cls, stub):
        return stub.AggregateAll

    def make_grpc_request(self, result_id, source_id):
        return table_pb2.AggregateAllRequest(result_id=result_id, source_id=source_id, spec=self.spec,
                                             group_by_columns=self.by)


class _Combo:
    def __init__(self, aggregates, by):
        self.aggregates, self.by = aggregates, by

    @classmethod
    def get_stub_func(cls, stub):
        return stub.ComboAggregate

    def make_grpc_request(self, result_id, source_id):
        return table_pb2.ComboAggregateRequest(result_id=result_id, source_id=source_id,
                                               aggregates=self.aggregates, group_by_columns=self.by)


def _status(exc: BaseException) -> str:
    """The gRPC status code and details behind a pydeephaven error (or its text)."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        code = getattr(seen, "code", None)
        if callable(code):
            try:
                return f"{code().name}: {seen.details()}"  # type: ignore[attr-defined]
            except (AttributeError, TypeError, ValueError):  # not a grpc error after all
                pass
        seen = seen.__cause__ or seen.__context__
    return " ".join(str(exc).split())


# ------------------------------------------------------------------------------------------------
# cases: every request of the module, made on each server by the fixture
@dataclass
class Case:
    name: str
    #: (session, source tables by name, keep-alive list) -> pydeephaven Table (raises when refused)
    make: Callable[[Any, dict], Any]
    source: str = "data"
    marks: tuple = ()


CASES: dict[str, Case] = {}


def _case(name: str, make: Callable[[Any, dict], Any], source: str = "data", into: Optional[dict] = None) -> None:
    cases = CASES if into is None else into
    assert name not in cases, name
    cases[name] = Case(name, make, source)


def _agg_case(name, aggs, by, source="data", preserve_empty=False, initial=None, into=None):
    def make(session, tables):
        init = tables[initial] if initial else None
        return session.table_service.grpc_table_op(tables[source], _Aggregate(aggs, by, preserve_empty, init))
    _case(name, make, source, into)


_BYS = {"by_G": ["G"], "no_keys": []}
for _kind in KINDS:
    for _col in VALUE_COLUMNS:
        for _by_name, _by in _BYS.items():
            _agg_case(f"{_kind}-{_col}-{_by_name}", [_column_agg(_kind, _col)], _by)
        _agg_case(f"{_kind}-{_col}-empty-no_keys", [_column_agg(_kind, _col)], [], source="empty")
        _agg_case(f"{_kind}-{_col}-empty-preserve_empty", [_column_agg(_kind, _col)], [], source="empty",
                  preserve_empty=True)
for _name, _agg in OTHER_AGGS.items():
    for _by_name, _by in {**_BYS, "by_G_H": ["G", "H"]}.items():
        _agg_case(f"{_name}-{_by_name}", [_agg], _by)
    _agg_case(f"{_name}-empty-no_keys", [_agg], [], source="empty")
    _agg_case(f"{_name}-empty-preserve_empty", [_agg], [], source="empty", preserve_empty=True)
    _agg_case(f"{_name}-empty-by_G", [_agg], ["G"], source="empty")

# formula aggregations: each vector function Deephaven offers, on every numeric column in one
# request, and on a boolean and a text column (refused by Deephaven but for len); a group-by column
# read as one value; arithmetic over several functions; the vector itself; a constant
_FORMULA_FNS = ["sum", "min", "max", "avg", "count", "first", "last", "median", "std", "var", "countDistinct", "len"]


def _formula(*raws: str) -> list:
    return [Agg(formula=Agg.AggregationFormula(selectable=table_pb2.Selectable(raw=r))) for r in raws]


for _fn in _FORMULA_FNS:
    _fs = _formula(*(f"{_fn}_{c} = {_fn}({c})" for c in NUMERIC))
    for _by_name, _by in {**_BYS, "by_G_H": ["G", "H"]}.items():
        _agg_case(f"formula_fn-{_fn}-{_by_name}", _fs, _by)
    _agg_case(f"formula_fn-{_fn}-empty-preserve_empty", _fs, [], source="empty", preserve_empty=True)
    for _col in ("B", "S"):
        _agg_case(f"formula_fn-{_fn}-{_col}-by_G", _formula(f"X = {_fn}({_col})"), ["G"])
for _by_name, _by in {**_BYS, "by_G_H": ["G", "H"]}.items():
    _agg_case(f"formula_mix-{_by_name}", _formula(
        "A = sum(I32) * 2 + max(F64) / count(I8)", "Z = I16.size()", "V = F32", "Q = S", "C = 5.0 + 3",
        "M = abs(min(I64)) - first(I16)", "R = countDistinct(F64) + len(B)"), _by)
    _agg_case(f"formula_each_min-{_by_name}", [Agg(columns=Agg.AggregationColumns(spec=Spec(
        formula=Spec.AggSpecFormula(formula="min(x) + avg(x)", param_token="x")), match_pairs=["A=I32", "B2=F64"]))],
        _by)
_agg_case("formula_keys-by_H", _formula("A = sum(H)", "B2 = H + 1", "C = min(H)", "D = avg(H)", "E = count(H)",
                                        "F = first(H) * sum(I32)"), ["H"])
_agg_case("formula_keys-by_I32", _formula("A = sum(I32)", "C = max(I32)", "E = count(I32)", "M = median(I32)"),
          ["I32"])
_agg_case("formula_keys-by_F64", _formula("A = sum(F64)", "D = avg(F64)", "E = count(F64)"), ["F64"])
_agg_case("formula-with_other_aggs", [_column_agg("sum", "I32", "S1"), *_formula("F = sum(I32) - S1"),
                                      OTHER_AGGS["count"]], ["G"])
_agg_case("formula-same_output", [_column_agg("sum", "I32", "X"), *_formula("X = sum(I64)")], ["G"])
_agg_case("formula-unknown_column", _formula("X = sum(Nope)"), ["G"])
_agg_case("formula-vector_arithmetic", _formula("X = I32 + 1"), ["G"])
_agg_case("formula-not_a_selectable", _formula("sum(I32)"), ["G"])

# group keys of every type, nulls, NaN and -0.0 among them
for _key in ["H", "I8", "I16", "I32", "I64", "F32", "F64", "B", "S", "Ts"]:
    _agg_case(f"count_and_sum-by_{_key}", [OTHER_AGGS["count"], _column_agg("sum", "W", "SW"),
                                           _column_agg("group", "Id", "Ids")], [_key])
    _case(f"select_distinct-{_key}", lambda s, t, k=_key: t["data"].select_distinct([k]))
_case("select_distinct-G_B", lambda s, t: t["data"].select_distinct(["G", "B"]))
_case("select_distinct-F64_F32", lambda s, t: t["data"].select_distinct(["F64", "F32"]))
_case("select_distinct-none", lambda s, t: t["data"].select_distinct([]))
_case("select_distinct-empty-G", lambda s, t: t["empty"].select_distinct(["G"]))
_case("select_distinct-empty-none", lambda s, t: t["empty"].select_distinct([]))
_case("select_distinct-unknown", lambda s, t: t["data"].select_distinct(["Nope"]))

# head_by / tail_by
for _n in (1, 2, 10):
    _case(f"head_by-{_n}-G", lambda s, t, n=_n: t["data"].head_by(n, ["G"]))
    _case(f"tail_by-{_n}-G", lambda s, t, n=_n: t["data"].tail_by(n, ["G"]))
_case("head_by-2-G_H", lambda s, t: t["data"].head_by(2, ["G", "H"]))
_case("tail_by-1-B", lambda s, t: t["data"].tail_by(1, ["B"]))
_case("head_by-2-F64", lambda s, t: t["data"].head_by(2, ["F64"]))
_case("head_by-2-no_keys", lambda s, t: t["data"].head_by(2, []))
_case("head_by-0-G", lambda s, t: t["data"].head_by(0, ["G"]))
_case("tail_by-negative-G", lambda s, t: t["data"].tail_by(-1, ["G"]))
_case("head_by-empty", lambda s, t: t["empty"].head_by(1, ["G"]))

# the *_by shortcuts, on every column and on the numeric ones
_SHORTCUTS = {
    "sum_by": lambda t, by: t.sum_by(by), "avg_by": lambda t, by: t.avg_by(by), "std_by": lambda t, by: t.std_by(by),
    "var_by": lambda t, by: t.var_by(by), "median_by": lambda t, by: t.median_by(by),
    "min_by": lambda t, by: t.min_by(by), "max_by": lambda t, by: t.max_by(by),
    "first_by": lambda t, by: t.first_by(by), "last_by": lambda t, by: t.last_by(by),
    "group_by": lambda t, by: t.group_by(by), "count_by": lambda t, by: t.count_by("N", by),
}
_NUMERIC_VIEW = ["G", "H", *NUMERIC, "W"]
for _name, _fn in _SHORTCUTS.items():
    _case(f"{_name}-all-by_G", lambda s, t, f=_fn: f(t["data"], ["G"]))
    _case(f"{_name}-numeric-by_G", lambda s, t, f=_fn: f(t["data"].view(_NUMERIC_VIEW), ["G"]))
    _case(f"{_name}-numeric-by_G_H", lambda s, t, f=_fn: f(t["data"].view(_NUMERIC_VIEW), ["G", "H"]))
    _case(f"{_name}-numeric-no_keys", lambda s, t, f=_fn: f(t["data"].view([*NUMERIC, "W"]), []))
    _case(f"{_name}-numeric-empty-no_keys", lambda s, t, f=_fn: f(t["empty"].view([*NUMERIC, "W"]), []))

# AggregateAll with each kind (agg_all_by), on every column and on the numeric ones
for _kind in KINDS:
    _spec = KINDS[_kind]("I32")
    for _label, _view in (("all", None), ("numeric", _NUMERIC_VIEW)):
        for _by_name, _by in {"by_G": ["G"], "no_keys": []}.items():
            def _make_agg_all(s, t, spec=_spec, view=_view, by=_by):
                src = t["data"] if view is None else t["data"].view(view if by else [c for c in view if c != "G"])
                return s.table_service.grpc_table_op(src, _AggregateAll(spec, by))
            _case(f"agg_all-{_kind}-{_label}-{_by_name}", _make_agg_all)

# everything together: each kind on each column Deephaven answers (added by the fixture, see
# _combined_aggs), by one key, two keys and none
COMBINED_BYS = {"by_G": ["G"], "by_G_H": ["G", "H"], "no_keys": [], "by_B": ["B"]}

# request-level errors
_agg_case("error-no_aggregations", [], ["G"])
_agg_case("error-unknown_by", [_column_agg("sum", "I32")], ["Nope"])
_agg_case("error-unknown_column", [_column_agg("sum", "Nope")], ["G"])
_agg_case("error-aggregates_key", [_column_agg("sum", "H")], ["H"])
_agg_case("error-same_output", [_column_agg("sum", "I32"), _column_agg("max", "I32")], ["G"])
_agg_case("error-unknown_weight", [Agg(columns=Agg.AggregationColumns(
    spec=Spec(weighted_avg=Spec.AggSpecWeighted(weight_column="Nope")), match_pairs=["I32"]))], ["G"])
_agg_case("error-string_weight", [Agg(columns=Agg.AggregationColumns(
    spec=Spec(weighted_avg=Spec.AggSpecWeighted(weight_column="S")), match_pairs=["I32"]))], ["G"])
_agg_case("error-pct_above_1", [Agg(columns=Agg.AggregationColumns(spec=_pct(1.5), match_pairs=["I32"]))], ["G"])
_agg_case("error-unique_without_sentinel", [Agg(columns=Agg.AggregationColumns(
    spec=Spec(unique=Spec.AggSpecUnique()), match_pairs=["I32"]))], ["G"])
_agg_case("unique-sentinel_long", [Agg(columns=Agg.AggregationColumns(spec=Spec(unique=Spec.AggSpecUnique(
    non_unique_sentinel=Spec.AggSpecNonUniqueSentinel(long_value=-1))), match_pairs=["I32", "I64"]))], ["G"])
_agg_case("unique-sentinel_string", [Agg(columns=Agg.AggregationColumns(spec=Spec(unique=Spec.AggSpecUnique(
    non_unique_sentinel=Spec.AggSpecNonUniqueSentinel(string_value="many"))), match_pairs=["S"]))], ["G"])
_agg_case("error-unique_sentinel_type", [Agg(columns=Agg.AggregationColumns(spec=Spec(unique=Spec.AggSpecUnique(
    non_unique_sentinel=Spec.AggSpecNonUniqueSentinel(string_value="many"))), match_pairs=["I32"]))], ["G"])
_agg_case("rename-and-order", [_column_agg("sum", "I32", "X"), OTHER_AGGS["count"], _column_agg("max", "F64", "Y"),
                               _column_agg("first", "S", "F")], ["H", "G"])
_agg_case("by_same_column_twice", [_column_agg("sum", "I32")], ["G", "G"])

# initial groups (a table of G values: "zz" (no rows), "b", null, "a")
for _pe in (False, True):
    for _src in ("data", "empty"):
        _agg_case(f"initial_groups-{_src}-preserve_empty_{_pe}", [OTHER_AGGS["count"], _column_agg("sum", "I32"),
                                                                  _column_agg("group", "Id"), _column_agg("min", "S")],
                  ["G"], source=_src, preserve_empty=_pe, initial="initial")
_agg_case("initial_groups-no_keys", [OTHER_AGGS["count"]], [], initial="initial")

# ComboAggregate (superseded by Aggregate, still served)
_CA = table_pb2.ComboAggregateRequest
for _name, _type, _extra in [
        ("COUNT", _CA.COUNT, {"column_name": "N"}), ("SUM", _CA.SUM, {"match_pairs": ["I32", "F64"]}),
        ("ABS_SUM", _CA.ABS_SUM, {"match_pairs": ["F32"]}), ("AVG", _CA.AVG, {"match_pairs": ["I16", "F64"]}),
        ("FIRST", _CA.FIRST, {"match_pairs": ["S", "Ts"]}), ("LAST", _CA.LAST, {"match_pairs": ["B", "F32"]}),
        ("MIN", _CA.MIN, {"match_pairs": ["S", "F64"]}), ("MAX", _CA.MAX, {"match_pairs": ["Ts", "I8"]}),
        ("MEDIAN", _CA.MEDIAN, {"match_pairs": ["I32", "F64"]}),
        ("PERCENTILE", _CA.PERCENTILE, {"match_pairs": ["I64", "F32"], "percentile": 0.25}),
        ("STD", _CA.STD, {"match_pairs": ["I8"]}), ("VAR", _CA.VAR, {"match_pairs": ["F64"]}),
        ("WEIGHTED_AVG", _CA.WEIGHTED_AVG, {"match_pairs": ["I32"], "column_name": "W"}),
        ("GROUP", _CA.GROUP, {"match_pairs": ["S"]}), ("SUM_all_columns", _CA.SUM, {}),
        ("FIRST_all_columns", _CA.FIRST, {}), ("MEDIAN_avg_median", _CA.MEDIAN, {"match_pairs": ["I32"],
                                                                                 "avg_median": True})]:
    for _by_name, _by in {"by_G": ["G"], "no_keys": []}.items():
        _case(f"combo-{_name}-{_by_name}", lambda s, t, ty=_type, ex=_extra, by=_by: s.table_service.grpc_table_op(
            t["data"], _Combo([_CA.Aggregate(type=ty, **ex)], by)))


# a Batch: the aggregation as one step of a chain
def _batch(session, tables):
    from pydeephaven import agg

    return (session.query(tables["data"]).where(["Id >= 0"])
            .agg_by([agg.sum_(["SI=I32"]), agg.count_("N"), agg.group(["Ids=Id"])], by=["G"])
            .sort(["N"]).exec())


_case("batch-where_agg_sort", _batch)
_case("batch-agg_all", lambda s, t: s.query(t["data"]).view(_NUMERIC_VIEW).agg_all_by(
    pydeephaven.agg.max_(), ["G"]).exec())


# ------------------------------------------------------------------------------------------------
# the writes that take tickwire's keyed table to DATA, in steps, after every request was made
def _row(i: int, **changes) -> dict:
    r = dict(zip(_NAMES, _ROWS[i]))
    r.update(changes)
    return r


def _rows(dicts) -> pa.Table:
    return _table([tuple(d[n] for n in _NAMES) for d in dicts])


def _write_steps() -> list[tuple[Optional[pa.Table], Optional[list[int]]]]:
    """(rows to upsert, Ids to delete) per step. The groups first appear in DATA's order; rows
    keep their first position (upserts change them in place); only rows that are not in DATA are
    deleted."""
    extra_a = _row(0, Id=100, I32=1000, F64=1000.0, S="tmp")
    extra_tmp = _row(1, Id=101, G="tmp")
    step1 = [_row(i) for i in range(5)] + [_row(5), _row(6, G="b", F64=50.0), _row(7), extra_a, extra_tmp]
    step2 = [_row(i) for i in range(8, 17)] + [_row(6), _row(0, F64=99.0, I8=None), _row(5, G="a")]
    step3 = [_row(0), _row(5), _row(6, I32=-7)]
    step4 = [_row(6)]
    return [(_rows(step1), None), (_rows(step2), None), (_rows(step3), [100, 101]), (_rows(step4), None)]


# ------------------------------------------------------------------------------------------------
@dataclass
class Answers:
    """What each server answered, per case: ("ok", arrow table), ("refused", status) or
    ("broken", status) when the request was taken but the table could not be read."""
    dh: dict = field(default_factory=dict)
    tw_static: dict = field(default_factory=dict)
    tw_ticking: dict = field(default_factory=dict)


def _combined_aggs(answered: Callable[[str], bool]):
    """Every kind on every column answered alone (grouped and not), with output names KIND_COLUMN."""
    aggs = []
    for kind in KINDS:
        for col in VALUE_COLUMNS:
            if answered(f"{kind}-{col}-by_G") and answered(f"{kind}-{col}-no_keys"):
                aggs.append(_column_agg(kind, col, f"{kind}_{col}"))
    for name in ("count", "first_row_key", "last_row_key", "count_where", "formula"):
        if answered(f"{name}-by_G") and answered(f"{name}-no_keys"):
            aggs.append(OTHER_AGGS[name])
    return aggs


def _make_all(session, tables, keep: list, cases: dict) -> dict:
    from pydeephaven import DHError

    made = {}
    for name, case in cases.items():
        try:
            t = case.make(session, tables)
            keep.append(t)
            made[name] = ("made", t)
        except DHError as exc:
            made[name] = ("refused", _status(exc))
    return made


def _read_all(made: dict) -> dict:
    from pydeephaven import DHError

    out = {}
    for name, (state, t) in made.items():
        if state != "made":
            out[name] = (state, t)
            continue
        try:
            out[name] = ("ok", t.to_arrow())
        except (DHError, pa.ArrowException) as exc:
            out[name] = ("broken", _status(exc))
    return out


def _sources(session, base, keep: list) -> dict:
    tables = {"data": base, "empty": base.where(["Id < 0"])}
    keep.extend(tables.values())
    return tables


@pytest.fixture(scope="module")
def answers(deephaven_server):
    from pydeephaven import Session
    from pydeephaven.table import Table as DhTable

    from tickwire.server.app import TickwireServer

    # pydeephaven releases a Table's export when the object is collected, with a blocking call that
    # deadlocks when the collection happens inside grpc's own event handling (the module makes
    # thousands of tables). Here every export lives until its session closes instead.
    patch = pytest.MonkeyPatch()
    patch.setattr(DhTable, "__del__", lambda self: None)
    keep: list = []
    initial = pa.table({"G": pa.array(["zz", "b", None, "a"])})
    engine = Engine(interval_ms=50)
    engine.create(TableSpec("data", "static", data=DATA))
    engine.create(TableSpec("initial", "static", data=initial))
    ticking = engine.create(TableSpec("ticking", "keyed", schema=DATA.schema, keys=("Id",)))
    tw = TickwireServer(engine, port=0).start()
    dh_session = Session(host="127.0.0.1", port=deephaven_server.port)
    tw_session = Session(host="127.0.0.1", port=tw.port)
    try:
        got = Answers()
        # Deephaven: the per-kind requests first, then the combined ones built from what it took
        dh_tables = _sources(dh_session, dh_session.import_table(DATA), keep)
        dh_tables["initial"] = dh_session.import_table(initial)
        started = time.monotonic()
        got.dh = _read_all(_make_all(dh_session, dh_tables, keep, CASES))
        print(f"Deephaven answered in {time.monotonic() - started:.1f} s")

        tw_static = _sources(tw_session, tw_session.open_table("data"), keep)
        tw_static["initial"] = tw_session.open_table("initial")
        started = time.monotonic()
        got.tw_static = _read_all(_make_all(tw_session, tw_static, keep, CASES))
        print(f"tickwire answered the static table in {time.monotonic() - started:.1f} s")

        # every kind together: all Deephaven answers alone, and all both answer alone
        more: dict = {}
        for label, answered in (("all", lambda n: got.dh[n][0] == "ok"),
                                ("served", lambda n: got.dh[n][0] == "ok" and got.tw_static[n][0] == "ok")):
            combined = _combined_aggs(answered)
            for by_name, by in COMBINED_BYS.items():
                _agg_case(f"combined-{label}-{by_name}", combined, by, into=more)
                _agg_case(f"combined-{label}-empty-preserve_empty-{by_name}", combined, by, source="empty",
                          preserve_empty=True, into=more)
        got.dh.update(_read_all(_make_all(dh_session, dh_tables, keep, more)))
        got.tw_static.update(_read_all(_make_all(tw_session, tw_static, keep, more)))
        cases = {**CASES, **more}
        started = time.monotonic()

        tw_ticking = _sources(tw_session, tw_session.open_table("ticking"), keep)
        tw_ticking["initial"] = tw_static["initial"]
        made = _make_all(tw_session, tw_ticking, keep, cases)
        for rows, deletes in _write_steps():
            delete = None if deletes is None else pa.table({"Id": pa.array(deletes, pa.int32())})
            engine.write(ticking, rows, delete=delete)
        engine.flush()
        _, settled = engine.snapshot(ticking)
        settled = settled.select(_NAMES)
        assert all(_same(_plain(settled.column(n)), _plain(DATA.column(n))) for n in _NAMES), (
            f"the writes did not take the keyed table to DATA: {settled.to_pylist()}")
        got.tw_ticking = _read_all(made)
        print(f"tickwire answered the ticking table in {time.monotonic() - started:.1f} s")
        yield got
    finally:
        for s in (dh_session, tw_session):
            close_dh_session(s)  # each, whatever the other's close did
        tw.stop()
        engine.stop()
        keep.clear()
        patch.undo()


# ------------------------------------------------------------------------------------------------
# comparison
def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t):
        return pa.timestamp("ns")
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_plain_type(t.value_type))
    return t


def _plain(col: pa.ChunkedArray) -> list:
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
    if isinstance(u, float) or isinstance(v, float):
        if not isinstance(u, (int, float)) or not isinstance(v, (int, float)) or isinstance(u, bool):
            return False
        u, v = float(u), float(v)
        if math.isnan(u) or math.isnan(v):
            return math.isnan(u) and math.isnan(v)
        if u == v == 0.0:
            return math.copysign(1.0, u) == math.copysign(1.0, v)
        if math.isinf(u) or math.isinf(v):
            return u == v
        return abs(u - v) <= 1e-9 * max(abs(u), abs(v))
    return type(u) is type(v) and u == v


def _dh_type(f: pa.Field) -> tuple:
    md = f.metadata or {}
    return md.get(b"deephaven:type"), md.get(b"deephaven:componentType")


def _difference(dh, tw) -> Optional[str]:
    """None when tickwire answered as Deephaven did, else what differs."""
    dh_state, dh_out = dh
    tw_state, tw_out = tw
    if dh_state == "broken":
        pytest.skip(f"Deephaven itself cannot answer this: {dh_out[:200]}")
    if dh_state == "refused":
        if tw_state == "refused":
            return None
        shown = tw_out.to_pylist() if tw_state == "ok" else tw_out
        return f"Deephaven refused ({dh_out[:160]}) but tickwire answered: {shown}"[:900]
    if tw_state != "ok":
        return f"tickwire {tw_state}: {tw_out[:400]}"
    if dh_out.column_names != tw_out.column_names:
        return f"columns: Deephaven {dh_out.column_names} vs tickwire {tw_out.column_names}"
    problems = []
    for name in dh_out.column_names:
        fd, ft = dh_out.schema.field(name), tw_out.schema.field(name)
        if _plain_type(fd.type) != _plain_type(ft.type):
            problems.append(f"{name} type: Deephaven {fd.type} vs tickwire {ft.type}")
        elif _dh_type(fd) != _dh_type(ft):
            problems.append(f"{name} deephaven:type: Deephaven {_dh_type(fd)} vs tickwire {_dh_type(ft)}")
    if dh_out.num_rows != tw_out.num_rows:
        problems.append(f"rows: Deephaven {dh_out.num_rows} {_brief(dh_out)} vs tickwire {tw_out.num_rows} "
                        f"{_brief(tw_out)}")
        return "; ".join(problems)
    for name in dh_out.column_names:
        try:
            a = _plain(dh_out.column(name))
        except SystemError as exc:  # Deephaven 42.7's first_by/last_by key column: string offsets pyarrow rejects
            pytest.skip(f"Deephaven's answer cannot be read: column {name}: {exc}")
        b = _plain(tw_out.column(name))
        bad = [i for i, (u, v) in enumerate(zip(a, b)) if not _same(u, v)]
        if bad:
            problems.append(f"{name} values at rows {bad}: Deephaven {a} vs tickwire {b}")
    return "; ".join(problems)[:3000] or None


def _brief(t: pa.Table) -> str:
    return str(t.slice(0, 20).to_pylist())[:600]


_NAMES_OF_CASES = list(CASES)


#: what tickwire does not serve, refused UNIMPLEMENTED by name: approximate percentiles (which the
#: issue lets tickwire refuse when Deephaven's t-digest cannot be matched)
NOT_SERVED = {"approx_pct_": "approximate_percentile", "agg_all-approx_pct_": "approximate_percentile",
              "combined-all": ""}

#: differences known and not (yet) matched, each with its reason
KNOWN = {
    "formula-vector_arithmetic": "Deephaven computes element-wise arithmetic of a group's vector (an array per "
                                 "group); tickwire refuses a vector outside its reducing functions",
    "error-aggregates_key": "Deephaven answers an aggregation of a group-by column; tickwire refuses its output "
                            "column made twice",
}
#: on the keyed table, which of -0.0 and 0.0 a median shows depends on the order its writes came in
ZERO_SIGN = ("median", "pct_", "agg_all-median", "agg_all-pct_", "median_by", "combo-MEDIAN", "combo-PERCENTILE")

#: a keyed table's running float sums after removals of values near 1e300 lose the small values next
#: to them (tickwire keeps a running double sum, with NaN and infinities counted apart); the static
#: answer has no such history. Not compared with a ticking Deephaven.
DRIFTING = ("sum-F", "avg-F", "agg_all-sum-numeric", "agg_all-avg-numeric", "avg_by-numeric", "sum_by-numeric",
            "combo-AVG", "combo-SUM", "combined-served-by_G", "formula_fn-sum", "formula_fn-avg")


def _refused_as_not_served(case: str, tw) -> bool:
    kind = next((k for k in NOT_SERVED if case.startswith(k)), None)
    if kind is None:
        return False
    state, message = tw
    assert state == "refused" and "UNIMPLEMENTED" in message and NOT_SERVED[kind] in message, (case, tw)
    return True


@pytest.mark.parametrize("source", ["static", "ticking"])
@pytest.mark.parametrize("case", _NAMES_OF_CASES)
def test_same_answer_as_deephaven(answers, case, source):
    if source == "ticking" and case.startswith(("first_row_key", "last_row_key")):
        pytest.skip("row keys are the source's: the keyed table's differ from the static one's after its removals")
    if source == "ticking" and case == "initial_groups-data-preserve_empty_True":
        pytest.skip("preserve_empty keeps the group 'tmp' the writes emptied, which the static table never had")
    tw = answers.tw_static if source == "static" else answers.tw_ticking
    if answers.dh[case][0] == "ok" and _refused_as_not_served(case, tw[case]):
        return
    difference = _difference(answers.dh[case], tw[case])
    if difference is not None:  # a known difference is reported as such, with what differed
        if source == "ticking" and case.startswith(DRIFTING):
            pytest.xfail(f"running float sums after removing values near 1e300 (see DRIFTING): {difference}")
        if case in KNOWN:
            pytest.xfail(f"{KNOWN[case]}: {difference}")
        if source == "ticking" and case.startswith(ZERO_SIGN) and "-0.0" in difference:
            pytest.xfail(f"which zero a median shows depends on the keyed table's history: {difference}")
    assert difference is None, f"{case} ({source}): {difference}"


@pytest.mark.parametrize("source", ["static", "ticking"])
@pytest.mark.parametrize("by", list(COMBINED_BYS))
@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("kinds", ["all", "served"])
def test_every_kind_in_one_request(answers, kinds, by, source, empty):
    """`all`: every kind on every column Deephaven answers alone; `served`: those tickwire answers
    alone as well (so that one kind tickwire does not have leaves the others compared)."""
    name = f"combined-{kinds}-empty-preserve_empty-{by}" if empty else f"combined-{kinds}-{by}"
    dh = answers.dh[name]
    assert dh[0] == "ok", f"Deephaven did not answer the combined request: {dh[1]}"
    assert dh[1].num_columns > 100  # the request has every kind on every column it takes
    tw = answers.tw_static if source == "static" else answers.tw_ticking
    if kinds == "all":  # holds kinds tickwire does not serve: refused by name
        assert _refused_as_not_served(name, tw[name])
        return
    if source == "ticking":
        # row keys are the source's: the keyed table's differ from the static one's after its removals
        keep = [c for c in dh[1].column_names if c not in ("FirstKey", "LastKey")]
        dh = (dh[0], dh[1].select(keep))
        got = tw[name]
        tw = {name: (got[0], got[1].select(keep) if got[0] == "ok" else got[1])}
    difference = _difference(dh, tw[name])
    if difference is not None and source == "ticking" and name.startswith(DRIFTING):
        pytest.xfail(f"running float sums after removing values near 1e300 (see DRIFTING): {difference}")
    assert difference is None, f"{name} ({source}): {difference}"


def test_deephaven_answers_as_recorded(answers):
    """A few of Deephaven's rules the cases rest on, so that a different Deephaven build shows up
    here rather than as a tickwire mismatch."""
    dh = answers.dh
    assert dh["sum-S-by_G"][0] == "refused" and dh["avg-B-by_G"][0] == "refused"
    assert dh["count-empty-no_keys"][1].num_rows == 0  # a zero-key aggregation of no rows has no row
    assert dh["count-empty-preserve_empty"][1].to_pylist() == [{"N": 0}]
    assert dh["sum-I32-by_G"][1].column("G").to_pylist() == ["a", "b", "n", "f", "one", None]
    assert dh["median-I8-by_G"][1].schema.field("I8").type == pa.int8()
    assert dh["median-I32-by_G"][1].schema.field("I32").type == pa.float64()
    assert dh["distinct-I32-by_G"][1].column("I32").to_pylist()[0] == [-2 ** 31 + 1, 1, 2, 3, 2 ** 31 - 1]
