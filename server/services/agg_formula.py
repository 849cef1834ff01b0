"""Deephaven's formula aggregations: AggregationFormula (``X = sum(Qty) * 2 + max(Px)``) and
AggSpecFormula (``min(each)`` applied to column pairs with ``each`` standing for the column).

In such a formula a column is the group's values (a vector); Deephaven's vector functions reduce
it. tickwire serves the functions Deephaven 42.7 offers that reduce to one of its incremental
aggregations (`formula_aggs`): each `fn(Column)` becomes a hidden aggregation of the `agg_by`
(shared when two formulas use the same one) and the rest of the formula is an ordinary
expression over those hidden columns, evaluated by a view over the aggregation. So a formula
aggregation is exactly as incremental as the aggregations it reads. Types follow Deephaven's:
sum of integers is long, of floats double; min, max, first and last keep the column's type;
avg, median, std and var are double; count (non-null values), countDistinct, len and size()
are long; a bare column is the group's vector.

What Deephaven computes and tickwire does not (a vector inside arithmetic, methods other than
size(), other vector functions) is refused with INVALID_ARGUMENT naming the case; vector functions
of boolean and string columns are refused as Deephaven refuses them.

Must not touch: the engine's private state (only `Agg` values and the schema are read here).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NoReturn, Optional, Union

import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.graph.ops import Agg
from tickwire.server.engine.graph.ops.aggregate import result_type
from tickwire.server.services.dh_expr import (
    _FUNCTIONS,
    ExpressionError,
    _Builder,
    _kind,
    _Node,
    _Parser,
    _tokenize,
    _Val,
)

__all__ = ["FormulaAggs", "formula_aggs", "VECTOR_FUNCTIONS"]

#: Deephaven's vector function -> the aggregation kind that computes it
VECTOR_FUNCTIONS = {"sum": "sum", "min": "min", "max": "max", "avg": "avg", "first": "first", "last": "last",
                    "median": "median", "std": "std", "var": "var", "countDistinct": "count_distinct",
                    "count": "count_where", "len": "count"}
_HIDDEN = "__formula_agg_{}"
_NAME = re.compile(r"^\s*([A-Za-z_$][A-Za-z_0-9$]*)\s*=(?!=)\s*(.*)$", re.S)


@dataclass
class FormulaAggs:
    """The hidden aggregations formula aggregations read, and each formula's output column as
    an expression over them (in request order)."""

    hidden: list[Agg] = field(default_factory=list)
    #: (output, expression), or (output, hidden column) for a bare vector (a rename keeps its vector type)
    columns: list[tuple[str, Union[pc.Expression, str]]] = field(default_factory=list)
    _index: dict[tuple, str] = field(default_factory=dict)

    def hidden_column(self, a: Agg) -> str:
        """The hidden column computing `a` (its name ignored), added once."""
        key = (a.kind, a.column, str(a.where) if a.where is not None else None)
        name = self._index.get(key)
        if name is None:
            name = _HIDDEN.format(len(self._index))
            self._index[key] = name
            self.hidden.append(Agg(a.kind, a.column, name, where=a.where, wide=a.wide))
        return name


class _GroupParser(_Parser):
    """The formula parser, with Deephaven's vector functions as calls."""

    def primary(self) -> _Node:
        t = self.tok
        if t.kind == "name" and t.text in VECTOR_FUNCTIONS and t.text not in _FUNCTIONS:
            start = self.i
            self.i += 1
            if self.take_op("("):
                return self.node("fn", t.pos, value=t.text, args=self.arguments(t.text))
            self.i = start
        return super().primary()


class _GroupBuilder(_Builder):
    """Builds a formula aggregation: the source's columns are vectors, readable only through a
    vector function, which becomes a hidden aggregation of `plan`."""

    def __init__(self, schema: pa.Schema, text: str, keys: list[str], plan: FormulaAggs, clock=None):
        super().__init__(schema, text, clock=clock)
        self.keys = keys
        self.plan = plan

    def _vector(self, node: _Node) -> Optional[str]:
        """The source column `node` names, when it is a bare column reference (a group-by
        column's is one value, the others' the group's vector)."""
        if node.kind == "col" and node.value in self.schema.names:
            return str(node.value)
        return None

    def _refuse_vector(self, node: _Node, name: str) -> NoReturn:
        self.fail(node, f"column {name!r} is the group's values (a vector) here: read it through one of "
                        f"{', '.join(sorted(VECTOR_FUNCTIONS))} or size()")

    def column(self, node: _Node) -> _Val:
        if node.value in self.schema.names and node.value not in self.keys:  # a group-by column is one value
            self._refuse_vector(node, str(node.value))
        return super().column(node)

    def _hidden(self, node: _Node, kind: str, col: str) -> _Val:
        t = self.schema.field(col).type
        if kind != "count" and (_kind(t) != "num" or t == pa.uint16()):
            self.fail(node, f"{node.value}() of column {col!r} of type {t} is not supported (Deephaven refuses "
                            f"its vector functions on boolean, char and text columns too)")
        if col in self.keys:
            return self._of_key(node, kind, col, t)
        where = pc.is_valid(pc.field(col)) if kind == "count_where" else None
        a = Agg(kind, None if kind in ("count", "count_where") else col, "x", where=where, wide=True)
        rt = result_type(a, t, None)
        value = pc.field(self.plan.hidden_column(a))
        if kind == "count_distinct":
            # countDistinct(vector) is 0 for a group without values, and counts NaN as a value
            value = pc.coalesce(value, pc.scalar(pa.scalar(0, pa.int64())))
            if pa.types.is_floating(t):  # and -0.0 apart from 0.0 (Java's Double.equals)
                x = pc.field(col)
                zero = pc.equal(x, pc.scalar(0.0))
                inv = pc.divide(pc.scalar(1.0), x.cast(pa.float64()))
                neg = self._any(pc.and_kleene(zero, pc.less(inv, pc.scalar(0.0))))
                pos = self._any(pc.and_kleene(zero, pc.greater(inv, pc.scalar(0.0))))
                has = [self._any(pc.is_nan(x)), pc.and_kleene(neg, pos)]
                for h in has:
                    value = pc.add(value, h.cast(pa.int64()))
        return _Val(value, rt)

    def _any(self, where: pc.Expression) -> pc.Expression:
        """Whether any row of the group meets `where` (a hidden count_where)."""
        n = pc.field(self.plan.hidden_column(Agg("count_where", None, "x", where=where)))
        return pc.greater(n, pc.scalar(pa.scalar(0, pa.int64())))

    def _of_key(self, node: _Node, kind: str, col: str, t: pa.DataType) -> _Val:
        """A vector function of a group-by column: as in Deephaven, the key is one value there
        (the function of a single argument)."""
        e = pc.field(col)
        if kind in ("min", "max", "first", "last"):
            return _Val(e, t)
        if kind == "sum" and not pa.types.is_floating(t):
            return _Val(e.cast(pa.int64()), pa.int64())
        if kind in ("sum", "avg"):  # a double sum starting from 0.0: -0.0 comes out 0.0
            return _Val(pc.add(e.cast(pa.float64()), pc.scalar(0.0)), pa.float64())
        if kind == "median":
            return _Val(e.cast(pa.float64()), pa.float64())
        if kind == "count_where":
            return _Val(pc.is_valid(e).cast(pa.int64()), pa.int64())
        self.fail(node, f"{node.value}() of group-by column {col!r} is not supported")

    def function(self, node: _Node) -> _Val:
        name, args = node.value, node.args
        if name in VECTOR_FUNCTIONS and len(args) == 1:
            col = self._vector(args[0])
            if col is not None:
                return self._hidden(node, VECTOR_FUNCTIONS[name], col)
            if name not in _FUNCTIONS:
                self.fail(node, f"{name}() takes a column of the source here")
        return super().function(node)

    def build(self, node: _Node) -> _Val:
        if node.kind == "call" and node.value == "size" and len(node.args) == 1:
            col = self._vector(node.args[0])
            if col is not None and col not in self.keys:
                return self._hidden(node, "count", col)
        if node.kind == "call" and self._vector(node.args[0]) not in (None, *self.keys):
            self.fail(node, f"method {node.value}() of a column's vector is not supported (size() is)")
        return super().build(node)


def _substitute(text: str, token: str, column: str) -> str:
    """`text` with the identifier `token` replaced by `column` (not inside string literals)."""
    out, last = [], 0
    for t in _tokenize(text):
        if t.kind == "name" and t.text == token:
            out.append(text[last:t.pos])
            out.append(column)
            last = t.pos + len(t.text)
    out.append(text[last:])
    return "".join(out)


def formula_aggs(formulas: list[tuple[str, str]], schema: pa.Schema, keys: list[str], clock=None) -> FormulaAggs:
    """The plan of formula aggregations given as (output column, formula) over a source of
    `schema` grouped by `keys`. Raises ExpressionError naming what cannot be served."""
    plan = FormulaAggs()
    for out, text in formulas:
        body = text.strip()
        if re.fullmatch(r"[A-Za-z_$][A-Za-z_0-9$]*", body) and body in schema.names and body not in keys:
            # the group's vector itself: Deephaven's group aggregation
            plan.columns.append((out, plan.hidden_column(Agg("group", body, "x"))))
            continue
        b = _GroupBuilder(schema, body, keys, plan, clock)
        v = b.build(_GroupParser(body).parse())
        if v.type == "null":
            raise ExpressionError(f"a formula of only null has no type in {out} = {body}")
        expr = v.expr
        if v.is_lit:  # a constant formula: one value per group, of its type
            expr = pc.scalar(pa.scalar(v.lit, v.type))
        plan.columns.append((out, expr))
    return plan


def parse_selectable(raw: str) -> tuple[str, str]:
    """``"Out = formula"`` -> (Out, formula); ExpressionError when it is not of that form."""
    m = _NAME.match(raw)
    if not m or not m.group(2).strip():
        raise ExpressionError(f"cannot parse formula aggregation {raw!r}: expected NAME = FORMULA")
    return m.group(1), m.group(2).strip()


def each(formula: str, token: str, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """AggSpecFormula's (output, formula) pairs: `token` in `formula` stands for each input column."""
    if not re.fullmatch(r"[A-Za-z_$][A-Za-z_0-9$]*", token):
        raise ExpressionError(f"formula parameter {token!r} is not a name")
    return [(out, _substitute(formula, token, col)) for out, col in pairs]
