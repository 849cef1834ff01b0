"""The web grid's quick-filter conditions (TableService Filter with structured `Condition`s)
answer as a real Deephaven 42.7 answers them.

The grid's text quick filter sends, for `abc`, `=abc`, `!=abc`: an InCondition ignoring case (an
inverted one for `!=`); for `~abc`, `abc*`, `*abc`: `!isNull && S.matches("(?s)(?i).*\\Qabc\\E.*")`
as an InvokeCondition under And/Not/IsNull (`!~` etc. as `isNull || !matches`); its advanced
filters also send Contains and Matches conditions and CompareConditions ignoring case. Each form
below is checked in process (its rows written out, from runs against Deephaven) and, in the
interop test, against a real Deephaven server through a raw Filter request, on both servers.
"""
from __future__ import annotations

import pyarrow as pa
import pytest

from tests.interop import close_dh_session
from tickwire.protocol.proto import table_pb2
from tickwire.server.services.conditions import condition_expression
from tickwire.server.services.rpc import CallError

DATA = pa.table({
    "Id": pa.array(range(16), pa.int32()),
    "S": pa.array([None, "abc", "ABC", "xAbCx", "a\nbc", "", "ébc", "Ébc", "\u212a", "k", "\u017f", "s\nx", "a.c",
                   "a\\Eb", "\u00df", "x\u2028y"]),
    "I": pa.array([None, *range(1, 16)], pa.int32()),
    # a second string column, for comparisons of two columns
    "T": pa.array([None, "ABC", None, "xabcx", "a\nbc", "", "ÉBC", "x", None, "K", "S", "s\nx", "A.C", "x", "ss", "q"]),
})

MATCH_CASE, IGNORE_CASE = 0, 1
REGULAR, INVERTED = 0, 1


def build(pb, spec):
    """A Condition of module `pb` (tickwire's or Deephaven's table_pb2) from a spec:
    ("cmp", op, column, string, case), ("cmpx", op, lhs, rhs, case) with ("col", name) or a literal
    on either side, ("in", column, [strings], case, match), ("contains", column,
    text, case, match), ("matches", column, regex, case, match), ("invoke", column, method, [args]),
    ("isnull", column), ("not", spec), ("and", [specs]), ("or", [specs])."""
    kind = spec[0]

    def ref(name):
        v = pb.Value()
        v.reference.column_name = name
        return v

    def lit(x):
        v = pb.Value()
        if isinstance(x, str):
            v.literal.string_value = x
        elif isinstance(x, bool):
            v.literal.bool_value = x
        elif isinstance(x, float):
            v.literal.double_value = x
        else:
            v.literal.long_value = x
        return v

    def operand(x):
        return ref(x[1]) if isinstance(x, tuple) else lit(x)

    if kind == "cmp":
        _k, op, col, value, case = spec
        return pb.Condition(compare=pb.CompareCondition(operation=op, lhs=ref(col), rhs=lit(value),
                                                        case_sensitivity=case))
    if kind == "cmpx":
        _k, op, lhs, rhs, case = spec
        return pb.Condition(compare=pb.CompareCondition(operation=op, lhs=operand(lhs), rhs=operand(rhs),
                                                        case_sensitivity=case))
    if kind == "in":
        _k, col, values, case, match = spec
        return pb.Condition(**{"in": pb.InCondition(target=ref(col), candidates=[lit(v) for v in values],
                                                    case_sensitivity=case, match_type=match)})
    if kind == "contains":
        _k, col, text, case, match = spec
        return pb.Condition(contains=pb.ContainsCondition(reference=pb.Reference(column_name=col), search_string=text,
                                                          case_sensitivity=case, match_type=match))
    if kind == "matches":
        _k, col, regex, case, match = spec
        return pb.Condition(matches=pb.MatchesCondition(reference=pb.Reference(column_name=col), regex=regex,
                                                        case_sensitivity=case, match_type=match))
    if kind == "invoke":
        _k, col, method, args = spec
        return pb.Condition(invoke=pb.InvokeCondition(method=method, target=ref(col), arguments=[lit(a) for a in args]))
    if kind == "isnull":
        return pb.Condition(is_null=pb.IsNullCondition(reference=pb.Reference(column_name=spec[1])))
    if kind == "not":
        return pb.Condition(**{"not": pb.NotCondition(filter=build(pb, spec[1]))})
    if kind in ("and", "or"):
        inner = [build(pb, s) for s in spec[1]]
        return pb.Condition(**{kind: (pb.AndCondition if kind == "and" else pb.OrCondition)(filters=inner)})
    raise AssertionError(spec)


def text_filter(regex: str, negate: bool = False):
    """The grid's quick filter `~x` (`!~x` when negate): matches guarded by isNull."""
    call = ("invoke", "S", "matches", [regex])
    if negate:
        return ("or", [("isnull", "S"), ("not", call)])
    return ("and", [("not", ("isnull", "S")), call])


#: (spec, the Ids Deephaven 42.7 keeps)
ANSWERED = [
    (("cmp", 4, "S", "abc", IGNORE_CASE), [1, 2]),
    (("cmp", 4, "S", "ÉBC", IGNORE_CASE), [6, 7]),             # equalsIgnoreCase is Unicode
    (("cmp", 4, "S", "K", IGNORE_CASE), [8, 9]),               # the Kelvin sign lower-cases to k
    (("cmp", 4, "S", "abc", MATCH_CASE), [1]),
    # IGNORE_CASE turns every operation into `!isNull(lhs) && lhs.equalsIgnoreCase(rhs)` (Deephaven's
    # MakeExpressionsNullSafe): `<`, `!=`, ... keep the rows equal ignoring case
    *[(("cmp", op, "S", "abc", IGNORE_CASE), [1, 2]) for op in (0, 1, 2, 3, 5)],
    *[(("cmpx", op, "abc", ("col", "S"), IGNORE_CASE), [1, 2]) for op in (0, 4, 5)],   # a null S: false
    *[(("cmpx", op, ("col", "S"), ("col", "T"), IGNORE_CASE), [0, 1, 3, 4, 5, 6, 9, 10, 11, 12])
      for op in (0, 4, 5)],                                    # both null: equal; one null: not
    (("cmpx", 5, "a", "A", IGNORE_CASE), list(range(16))),
    (("cmpx", 4, "a", "b", IGNORE_CASE), []),
    (("in", "S", ["abc", "ébc"], IGNORE_CASE, REGULAR), [1, 2, 6, 7]),
    (("in", "S", ["abc"], IGNORE_CASE, INVERTED), [0, *range(3, 16)]),   # a null is in nothing
    (("in", "S", ["S", "SS"], IGNORE_CASE, REGULAR), [10]),    # ſ upper-cases to S; ß is not SS
    (("in", "S", [""], IGNORE_CASE, REGULAR), [5]),
    (("contains", "S", "Bc", MATCH_CASE, REGULAR), []),
    (("contains", "S", "bC", MATCH_CASE, REGULAR), [3]),
    (("contains", "S", "Bc", IGNORE_CASE, REGULAR), [1, 2, 3, 4, 6, 7]),
    (("contains", "S", "Bc", MATCH_CASE, INVERTED), list(range(1, 16))),  # a null matches neither way
    (("contains", "S", "Bc", IGNORE_CASE, INVERTED), [5, *range(8, 16)]),
    (("contains", "S", "É", IGNORE_CASE, REGULAR), [7]),        # ignoring ASCII case only
    (("contains", "S", "K", IGNORE_CASE, REGULAR), [9]),
    (("contains", "S", "", MATCH_CASE, REGULAR), list(range(1, 16))),
    (("contains", "S", "\\E", MATCH_CASE, REGULAR), [13]),
    (("contains", "S", ".", MATCH_CASE, REGULAR), [12]),
    (("matches", "S", "a.c", MATCH_CASE, REGULAR), [1, 12]),
    (("matches", "S", "a.c", IGNORE_CASE, REGULAR), [1, 2, 12]),
    (("matches", "S", "a.c", MATCH_CASE, INVERTED), [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15]),
    (("matches", "S", "a.bc", MATCH_CASE, REGULAR), [4]),       # Deephaven compiles with DOTALL
    (("matches", "S", "x.y", MATCH_CASE, REGULAR), [15]),
    (("matches", "S", "(?i)ébc", MATCH_CASE, REGULAR), [6]),
    (("matches", "S", "k", IGNORE_CASE, REGULAR), [9]),
    (("matches", "S", "(?s)(?i).*\\QBC\\E.*", MATCH_CASE, REGULAR), [1, 2, 3, 4, 6, 7]),
    (("matches", "S", "a\\.c", MATCH_CASE, REGULAR), [12]),
    (("matches", "S", "^a.*$", MATCH_CASE, REGULAR), [1, 4, 12, 13]),
    (("matches", "S", ".+", MATCH_CASE, REGULAR), [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]),
    (text_filter("(?s)(?i).*\\QBC\\E.*"), [1, 2, 3, 4, 6, 7]),
    (text_filter("(?s)(?i).*\\QBC\\E.*", negate=True), [0, 5, *range(8, 16)]),
    (text_filter("(?s)(?i)^\\Qa\\E.*"), [1, 2, 4, 12, 13]),
    (text_filter("(?s)(?i)^\\Qa\\E.*", negate=True), [0, 3, 5, 6, 7, 8, 9, 10, 11, 14, 15]),
    (text_filter("(?s)(?i).*\\Qc\\E$"), [1, 2, 4, 6, 7, 12]),
    (text_filter("(?s)(?i).*\\Q.\\E.*"), [12]),
    (text_filter("(?s)(?i).*\\Qk\\E.*"), [9]),
    (text_filter("(?s)(?i).*\\Qa\\E\\\\E\\Qb\\E.*"), [13]),
    (text_filter("x.y"), []),                                  # String.matches: no DOTALL
    (text_filter("(?s)x.y"), [15]),
    (text_filter("s.x"), []),
    (("and", [("not", ("isnull", "S")), ("invoke", "S", "contains", ["b"])]), [1, 3, 4, 6, 7, 13]),
    (("and", [("not", ("isnull", "S")), ("invoke", "S", "startsWith", ["a"])]), [1, 4, 12, 13]),
    (("and", [("not", ("isnull", "S")), ("invoke", "S", "endsWith", ["c"])]), [1, 4, 6, 7, 12]),
    (("and", [("not", ("isnull", "S")), ("invoke", "S", "equalsIgnoreCase", ["abc"])]), [1, 2]),
    (("and", [("not", ("isnull", "S")), ("invoke", "S", "isEmpty", [])]), [5]),
    (("or", [("isnull", "S"), ("not", ("invoke", "S", "startsWith", ["a"]))]),
     [0, 2, 3, 5, 6, 7, 8, 9, 10, 11, 14, 15]),
    (("or", [("isnull", "S"), ("invoke", "S", "isEmpty", [])]), [0, 5]),
    (("and", [("cmp", 5, "S", "abc", MATCH_CASE), ("not", ("isnull", "S")), ("invoke", "S", "contains", ["c"])]),
     [4, 6, 7, 12]),
    (("isnull", "S"), [0]),
    (("isnull", "I"), [0]),
    (("not", ("isnull", "S")), list(range(1, 16))),
]

#: Conditions refused: (spec, words of tickwire's message). Deephaven refuses the first group
#: too; tickwire also refuses what it cannot answer as Deephaven does (the rest).
REFUSED = [
    (("cmp", 4, "I", 3, IGNORE_CASE), "a string literal"),
    (("cmp", 5, "I", 3, IGNORE_CASE), "a string literal"),
    (("cmp", 0, "I", "3", IGNORE_CASE), "not a string column"),
    (("cmpx", 5, ("col", "S"), 3, IGNORE_CASE), "a string literal"),
    (("cmpx", 4, ("col", "S"), 2.5, IGNORE_CASE), "a string literal"),
    (("cmpx", 4, ("col", "S"), True, IGNORE_CASE), "a string literal"),
    (("cmpx", 4, 3, ("col", "I"), IGNORE_CASE), "a string literal"),
    (("cmpx", 5, ("col", "I"), ("col", "I"), IGNORE_CASE), "not a string column"),
    (("cmpx", 4, ("col", "S"), ("col", "I"), IGNORE_CASE), "not a string column"),
    (("contains", "I", "3", MATCH_CASE, REGULAR), "not a string column"),
    (("invoke", "S", "matches", ["(?s)(?i).*\\QBC\\E.*"]), "NullPointerException"),  # a null S, not guarded
    (("invoke", "S", "length", []), "not a condition"),
    (("and", [("isnull", "S"), ("invoke", "S", "contains", ["a"])]), "NullPointerException"),
    (("or", [("not", ("isnull", "S")), ("invoke", "S", "contains", ["a"])]), "NullPointerException"),
    (("matches", "S", "a|b", MATCH_CASE, REGULAR), "'|' at position 1"),
    (("matches", "S", "[ab]c", MATCH_CASE, REGULAR), "'[' at position 0"),
    (("matches", "S", "\\d+", MATCH_CASE, REGULAR), "the escape '\\\\d'"),
    (("matches", "S", "(?u)(?i)abc", MATCH_CASE, REGULAR), "'(' at position 0"),
    (("matches", "S", "a**", MATCH_CASE, REGULAR), "the quantifier"),
]


def _ids(spec) -> list:
    expr = condition_expression(build(table_pb2, spec), DATA.schema)
    return DATA.filter(expr)["Id"].to_pylist()


@pytest.mark.parametrize("spec, expected", ANSWERED, ids=[repr(s) for s, _e in ANSWERED])
def test_quick_filter_conditions(spec, expected):
    assert _ids(spec) == expected


@pytest.mark.parametrize("spec, words", REFUSED, ids=[repr(s) for s, _w in REFUSED])
def test_refused_conditions_say_what(spec, words):
    with pytest.raises((CallError, pa.ArrowInvalid)) as info:
        _ids(spec)
    assert words in str(info.value)
    if isinstance(info.value, CallError):
        assert info.value.code == "INVALID_ARGUMENT"


def test_a_null_target_fails_only_where_reached():
    """The failure of a method on a null string is evaluated only on the rows its and/or reaches:
    without nulls the same condition answers."""
    spec = ("invoke", "S", "startsWith", ["a"])
    no_nulls = DATA.filter(condition_expression(build(table_pb2, ("not", ("isnull", "S"))), DATA.schema))
    got = no_nulls.filter(condition_expression(build(table_pb2, spec), DATA.schema))["Id"].to_pylist()
    assert got == [1, 4, 12, 13]


# -- against a real Deephaven ---------------------------------------------------------------------

class _Filter:
    """A TableService.Filter call for pydeephaven's `grpc_table_op` with one Condition."""

    def __init__(self, spec):
        self.spec = spec

    @classmethod
    def get_stub_func(cls, stub):
        return stub.Filter

    def make_grpc_request(self, result_id, source_id):
        from deephaven_core.proto import table_pb2 as dh_pb

        return dh_pb.FilterTableRequest(result_id=result_id, source_id=source_id, filters=[build(dh_pb, self.spec)])


def _answer(table, spec):
    """("ok", Ids) or ("refused", status and details)."""
    from pydeephaven import DHError

    from .test_expr_conformance import _status

    try:
        out = table.session.table_service.grpc_table_op(table, _Filter(spec)).to_arrow()
    except DHError as exc:
        return "refused", _status(exc)
    return "ok", out["Id"].to_pylist()


@pytest.mark.slow
@pytest.mark.interop
def test_conditions_answer_as_deephaven(deephaven_server):
    """Every condition of ANSWERED keeps Deephaven's rows on both servers; every one of REFUSED
    is refused by tickwire with INVALID_ARGUMENT (and the first ones by Deephaven too)."""
    from pydeephaven import Session

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=50)
    engine.create(TableSpec("data", "static", data=DATA))
    tw_server = TickwireServer(engine, port=0).start()
    dh_session = Session(host="127.0.0.1", port=deephaven_server.port)
    tw_session = Session(host="127.0.0.1", port=tw_server.port)
    try:
        dh, tw = dh_session.import_table(DATA), tw_session.open_table("data")
        bad = {}
        for spec, expected in ANSWERED:
            got = (_answer(dh, spec), _answer(tw, spec))
            if got != (("ok", expected), ("ok", expected)):
                bad[repr(spec)] = f"Deephaven {got[0]}, tickwire {got[1]}, written {expected}"
        deephaven_refuses = 14  # the first REFUSED ones; Deephaven answers the others in its own way
        for k, (spec, words) in enumerate(REFUSED):
            dk, dout = _answer(dh, spec)
            tk, tout = _answer(tw, spec)
            if tk != "refused" or "INVALID_ARGUMENT" not in tout or words not in tout:
                bad[repr(spec)] = f"tickwire {tk} {tout}"
            if k < deephaven_refuses and dk != "refused":
                bad[repr(spec)] = f"Deephaven answered {dout}"
        assert not bad, bad
    finally:
        for s in (dh_session, tw_session):
            close_dh_session(s)  # each, whatever the other's close did
        tw_server.stop()
        engine.stop()


def test_the_conditions_of_one_request_see_only_the_rows_kept_before():
    from tickwire.server.services.conditions import conditions_expression

    guard, call = build(table_pb2, ("not", ("isnull", "S"))), build(table_pb2, ("invoke", "S", "startsWith", ["a"]))
    assert DATA.filter(conditions_expression([guard, call], DATA.schema))["Id"].to_pylist() == [1, 4, 12, 13]
    with pytest.raises(pa.ArrowInvalid, match="NullPointerException"):
        DATA.filter(conditions_expression([call, guard], DATA.schema))
    assert DATA.filter(conditions_expression([], DATA.schema)).num_rows == len(DATA)
