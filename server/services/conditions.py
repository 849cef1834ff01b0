"""TableService filter conditions (the structured `Condition` of Filter requests) as pyarrow
boolean expressions, with Deephaven's rules for comparisons, nulls and NaN.

Besides comparisons, `in`, `is null` and their and/or/not, the conditions of the web grid's quick
filters are answered as Deephaven 42.7 answers them:

- `CompareCondition` with IGNORE_CASE: Java's equalsIgnoreCase (Unicode case, per character)
  whatever the operation, as Deephaven rewrites every one of them (`<`, `!=`, ...) into
  `!isNull(lhs) && lhs.equalsIgnoreCase(rhs)`: a string column and a string literal (either side)
  match where equal ignoring case, a null nowhere; two string columns also where both are null;
  two string literals everywhere or nowhere. Anything else (a number, a boolean) is refused, as
  Deephaven's formula does not compile;
- `InCondition` with IGNORE_CASE (the grid's `=` and `!=` on text): equalsIgnoreCase against
  each string candidate; a null is in nothing, so the inverted match keeps it;
- `ContainsCondition`: a substring, case-sensitive or ignoring ASCII case only (as Deephaven);
  a null matches neither the regular nor the inverted condition;
- `MatchesCondition`: a Java regular expression matching the whole string, with `.` matching
  line terminators (Deephaven compiles it with DOTALL) and IGNORE_CASE folding ASCII only; a null
  matches neither way. What `dh_expr.java_regex` cannot translate faithfully is refused;
- `InvokeCondition` (the grid's text filters: `matches`, and `contains`, `startsWith`,
  `endsWith`, `equals`, `equalsIgnoreCase`, `isEmpty`) as the String method in a formula: a null
  target fails the request, as Deephaven's NullPointerException does, unless the conditions
  before it in an and/or (the grid's `!isNull && ...`, `isNull || !...`) already decided the row.
  Deephaven evaluates an and's conditions one after another on the rows still kept, an or's on
  the rows not yet kept; so does this module when it decides where a null target fails.
"""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.services.dh_expr import ExpressionError, compare_operands, java_regex, string_method
from tickwire.server.services.rpc import CallError

__all__ = ["condition_expression", "conditions_expression", "fold"]

# CompareCondition.CompareOperation -> the operator of a filter string
_COMPARE = {0: "<", 1: "<=", 2: ">", 3: ">=", 4: "==", 5: "!="}

_LITERAL_TYPES = {"string_value": pa.string(), "double_value": pa.float64(), "bool_value": pa.bool_(),
                  "long_value": pa.int64(), "nano_time_value": pa.timestamp("ns", "UTC")}


def _value(v, schema: pa.Schema, what: str):
    """A Value as a `compare_operands` operand: ("column", name) or ("literal", value, type)."""
    which = v.WhichOneof("data")
    if which == "reference":
        name = v.reference.column_name
        if name not in schema.names:
            raise CallError(f"{what}: unknown column {name!r}", "INVALID_ARGUMENT")
        return ("column", name)
    if which == "literal":
        lit = v.literal
        kind = lit.WhichOneof("value")
        if kind is None:
            raise CallError(f"{what}: empty literal", "INVALID_ARGUMENT")
        return ("literal", getattr(lit, kind), _LITERAL_TYPES[kind])
    raise CallError(f"{what}: a value needs a column reference or a literal", "INVALID_ARGUMENT")


def _compare(op: str, lhs, rhs, schema: pa.Schema, what: str) -> pc.Expression:
    """A comparison with Deephaven's rules (those of filter strings: null below every value and
    equal to null, NaN unequal to everything); what they cannot match is INVALID_ARGUMENT."""
    for col, lit in ((lhs, rhs), (rhs, lhs)):
        if col[0] == "column" and lit[0] == "literal" and lit[2] == pa.float64() \
                and pa.types.is_integer(schema.field(col[1]).type):
            # Deephaven converts the literal to the column's type: only whole numbers in range
            bits = schema.field(col[1]).type.bit_width - 1
            if not (lit[1] == int(lit[1]) if math.isfinite(lit[1]) else False) or not abs(lit[1]) < 2 ** bits:
                raise CallError(f"{what}: {lit[1]!r} is not a value of integer column {col[1]!r}", "INVALID_ARGUMENT")
            lit_int = ("literal", int(lit[1]), pa.int64())
            lhs, rhs = (lit_int, rhs) if lit is lhs else (lhs, lit_int)
    try:
        return compare_operands(op, lhs, rhs, schema)
    except ExpressionError as exc:
        raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None


def _string_column(name: str, schema: pa.Schema, what: str) -> pc.Expression:
    if name not in schema.names:
        raise CallError(f"{what}: unknown column {name!r}", "INVALID_ARGUMENT")
    t = schema.field(name).type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        raise CallError(f"{what}: column {name!r} is {t}, not a string column", "INVALID_ARGUMENT")
    return pc.field(name) if pa.types.is_string(t) else pc.field(name).cast(pa.string())


def _fold_case(e):
    """Java's equalsIgnoreCase compares characters upper-cased, then lower-cased."""
    return pc.utf8_lower(pc.utf8_upper(e))


def _regex(pattern: str, what: str, **flags) -> str:
    try:
        return java_regex(pattern, **flags)
    except ExpressionError as exc:
        raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None


def _string_literals(values, what: str) -> list:
    out = []
    for v in values:
        if v.WhichOneof("data") != "literal" or v.literal.WhichOneof("value") != "string_value":
            raise CallError(f"{what}: case-insensitive matching needs string literals", "INVALID_ARGUMENT")
        out.append(v.literal.string_value)
    return out


def _equals_ignore_case(op: str, lhs, rhs, schema: pa.Schema) -> pc.Expression:
    """A CompareCondition with IGNORE_CASE, any operation `op`: Deephaven's equalsIgnoreCase
    (see the module's docstring)."""
    what = f"compare (case-insensitive {op!r}, which Deephaven answers as equalsIgnoreCase)"
    for v in (lhs, rhs):
        if v[0] == "literal" and v[2] != pa.string():
            raise CallError(f"{what}: needs string columns or a string literal, got {v[1]!r}", "INVALID_ARGUMENT")
    if lhs[0] == "literal" and rhs[0] == "literal":
        same = _fold_case(pa.scalar(lhs[1])).as_py() == _fold_case(pa.scalar(rhs[1])).as_py()
        return pc.scalar(same)
    if lhs[0] == "column" and rhs[0] == "column":
        a, b = _string_column(lhs[1], schema, what), _string_column(rhs[1], schema, what)
        both_null = pc.and_kleene(pc.is_null(a), pc.is_null(b))
        return pc.or_kleene(both_null, pc.coalesce(pc.equal(_fold_case(a), _fold_case(b)), pc.scalar(False)))
    col, lit = (lhs, rhs) if lhs[0] == "column" else (rhs, lhs)
    field = _string_column(col[1], schema, what)
    return pc.coalesce(pc.equal(_fold_case(field), _fold_case(pc.scalar(lit[1]))), pc.scalar(False))


def _both(a, b):
    return b if a is None else pc.and_kleene(a, b)


def condition_expression(cond, schema: pa.Schema, reach=None) -> pc.Expression:
    """A TableService Condition as a pyarrow boolean expression. `reach` is the rows on which
    Deephaven evaluates the condition (None: every row), where a failing method call fails."""
    if cond is None:
        return pc.scalar(True)
    which = cond.WhichOneof("data")
    if which in ("and", "or"):
        conj = which == "and"
        parts, decided = [], None  # decided: the rows the conditions so far leave to the next one
        for c in getattr(cond, which).filters:
            e = condition_expression(c, schema, _both(reach, decided))
            parts.append(e)
            step = pc.coalesce(e if conj else pc.invert(e), pc.scalar(False))
            decided = _both(decided, step)
        return fold(parts, pc.and_kleene if conj else pc.or_kleene, conj)
    if which == "not":
        return pc.invert(condition_expression(getattr(cond, "not").filter, schema, reach))
    if which == "compare":
        c = cond.compare
        op = _COMPARE.get(c.operation)
        if op is None:
            raise CallError(f"unknown compare operation {c.operation}", "INVALID_ARGUMENT")
        lhs, rhs = _value(c.lhs, schema, "compare"), _value(c.rhs, schema, "compare")
        if c.case_sensitivity != 0:
            return _equals_ignore_case(op, lhs, rhs, schema)
        return _compare(op, lhs, rhs, schema, "compare")
    if which == "in":
        c = getattr(cond, "in")
        if c.case_sensitivity != 0:
            if c.target.WhichOneof("data") != "reference":
                raise CallError("in: case-insensitive matching needs a column target", "INVALID_ARGUMENT")
            field = _string_column(c.target.reference.column_name, schema, "in")
            folded = _fold_case(pa.array(_string_literals(c.candidates, "in"), pa.string()))
            hit = pc.coalesce(pc.is_in(_fold_case(field), value_set=folded), pc.scalar(False))
            return pc.invert(hit) if c.match_type == 1 else hit
        target = _value(c.target, schema, "in")
        terms = [_compare("==", target, _value(v, schema, "in"), schema, "in") for v in c.candidates]
        expr = fold(terms, pc.or_kleene, False)
        return pc.invert(expr) if c.match_type == 1 else expr
    if which in ("contains", "matches"):
        c = getattr(cond, which)
        field = _string_column(c.reference.column_name, schema, which)
        ignore = c.case_sensitivity == 1
        if which == "contains":
            quoted = "\\Q" + c.search_string.replace("\\E", "\\E\\\\E\\Q") + "\\E"
            pattern = _regex(quoted, which, dotall=True, ignore_case=ignore)
            pattern = "^(?s:.)*" + pattern[1:-1] + "(?s:.)*$"
        else:
            pattern = _regex(c.regex, which, dotall=True, ignore_case=ignore)
        hit = pc.match_substring_regex(field, pattern=pattern)
        if c.match_type == 1:
            hit = pc.invert(hit)
        return pc.coalesce(hit, pc.scalar(False))
    if which == "invoke":
        c = cond.invoke
        if not c.HasField("target") or c.target.WhichOneof("data") != "reference":
            raise CallError(f"invoke: {c.method}() needs a column target", "INVALID_ARGUMENT")
        name = c.target.reference.column_name
        _string_column(name, schema, "invoke")
        args = []
        for a in c.arguments:
            if a.WhichOneof("data") != "literal" or a.literal.WhichOneof("value") != "string_value":
                raise CallError(f"invoke: the arguments of {c.method}() must be string literals", "INVALID_ARGUMENT")
            args.append(a.literal.string_value)
        try:
            return string_method(name, c.method, args, schema, reach)
        except ExpressionError as exc:
            raise CallError(f"invoke: {exc}", "INVALID_ARGUMENT") from None
    if which == "is_null":
        name = cond.is_null.reference.column_name
        if name not in schema.names:
            raise CallError(f"is_null: unknown column {name!r}", "INVALID_ARGUMENT")
        return pc.is_null(pc.field(name))
    raise CallError(f"Filter: condition {which!r} is not supported", "UNIMPLEMENTED")


def conditions_expression(conds, schema: pa.Schema) -> pc.Expression:
    """The conditions of one Filter request, as one expression: as Deephaven does, each is
    evaluated only on the rows the ones before it kept."""
    return condition_expression(_and_of(conds), schema)


def _and_of(conds):
    """An and of `conds` (a Condition of the same message module)."""
    conds = list(conds)
    if len(conds) == 1:
        return conds[0]
    out = type(conds[0])() if conds else None
    if out is None:
        return None
    getattr(out, "and").filters.extend(conds)
    return out


def fold(parts: list, fn, empty: bool) -> pc.Expression:
    if not parts:
        return pc.scalar(empty)
    out = parts[0]
    for p in parts[1:]:
        out = fn(out, p)
    return out
