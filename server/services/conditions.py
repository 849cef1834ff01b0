"""TableService filter conditions (the structured `Condition` of Filter requests) as pyarrow
boolean expressions, with Deephaven's rules for comparisons, nulls and NaN."""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.services.dh_expr import ExpressionError, compare_operands
from tickwire.server.services.rpc import CallError

__all__ = ["condition_expression", "fold"]

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


def condition_expression(cond, schema: pa.Schema) -> pc.Expression:
    """A TableService Condition as a pyarrow boolean expression (the simple conditions)."""
    which = cond.WhichOneof("data")
    if which == "and":
        return fold([condition_expression(c, schema) for c in getattr(cond, "and").filters], pc.and_kleene, True)
    if which == "or":
        return fold([condition_expression(c, schema) for c in getattr(cond, "or").filters], pc.or_kleene, False)
    if which == "not":
        return pc.invert(condition_expression(getattr(cond, "not").filter, schema))
    if which == "compare":
        c = cond.compare
        op = _COMPARE.get(c.operation)
        if op is None:
            raise CallError(f"unknown compare operation {c.operation}", "INVALID_ARGUMENT")
        if c.case_sensitivity != 0:
            raise CallError("Filter: case-insensitive comparison is not supported", "UNIMPLEMENTED")
        lhs, rhs = _value(c.lhs, schema, "compare"), _value(c.rhs, schema, "compare")
        return _compare(op, lhs, rhs, schema, "compare")
    if which == "in":
        c = getattr(cond, "in")
        if c.case_sensitivity != 0:
            raise CallError("Filter: case-insensitive 'in' is not supported", "UNIMPLEMENTED")
        target = _value(c.target, schema, "in")
        terms = [_compare("==", target, _value(v, schema, "in"), schema, "in") for v in c.candidates]
        expr = fold(terms, pc.or_kleene, False)
        return pc.invert(expr) if c.match_type == 1 else expr
    if which == "is_null":
        name = cond.is_null.reference.column_name
        if name not in schema.names:
            raise CallError(f"is_null: unknown column {name!r}", "INVALID_ARGUMENT")
        return pc.is_null(pc.field(name))
    raise CallError(f"Filter: condition {which!r} is not supported", "UNIMPLEMENTED")


def fold(parts: list, fn, empty: bool) -> pc.Expression:
    if not parts:
        return pc.scalar(empty)
    out = parts[0]
    for p in parts[1:]:
        out = fn(out, p)
    return out
