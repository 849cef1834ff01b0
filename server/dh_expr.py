"""Deephaven's filter and column-formula strings, as pyarrow compute expressions.

Deephaven clients send filters such as ``Sym = `AAPL` && Price > 100`` and column specs such as
``Notional = Price * Size`` as strings (TableService.UnstructuredFilter, View, Select, Update).
This module parses the subset that has a clear meaning on Arrow data:

- literals: integers, floats, strings in backticks or quotes, ``true``/``false``, ``null``;
- column names; ``+ - * / %`` and unary minus; parentheses;
- comparisons ``= == != < <= > >=`` (``=`` is equality, as in Deephaven), chained comparisons;
- ``&&`` / ``and``, ``||`` / ``or``, ``!`` / ``not``;
- ``X in `a`, `b` `` / ``X not in ...`` (filters only), ``isNull(X)`` / ``!isNull(X)``.

Anything else raises `ExpressionError` naming what was not understood, which the server turns
into INVALID_ARGUMENT. Parsing goes through Python's `ast` after a token-level translation of
Deephaven's operators, with only the node types above accepted.
"""
from __future__ import annotations

import ast
import io
import re
import tokenize
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ExpressionError", "parse_filter", "parse_column_spec"]


class ExpressionError(ValueError):
    pass


_IN = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s+(not\s+in|in)\s+(.+)$", re.S)


def _translate(text: str) -> str:
    """Deephaven operators and literals -> Python syntax (outside string literals)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "`\"'":
            j = text.find(ch, i + 1)
            if j < 0:
                raise ExpressionError(f"unterminated string in {text!r}")
            out.append(repr(text[i + 1:j]))
            i = j + 1
            continue
        two = text[i:i + 2]
        if two == "&&":
            out.append(" and ")
            i += 2
        elif two == "||":
            out.append(" or ")
            i += 2
        elif two in ("==", "!=", "<=", ">="):
            out.append(two)
            i += 2
        elif ch == "=":
            out.append("==")
            i += 1
        elif ch == "!":
            out.append(" not ")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _literal_words(src: str) -> str:
    """true/false/null (Deephaven) -> True/False/None, at token level."""
    toks = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME and tok.string in ("true", "false", "null"):
            tok = tok._replace(string={"true": "True", "false": "False", "null": "None"}[tok.string])
        toks.append(tok)
    return tokenize.untokenize(toks)


class _Builder:
    def __init__(self, schema: pa.Schema, text: str):
        self.schema = schema
        self.text = text

    @staticmethod
    def compare(op, fn, left, right, right_node):
        """Equality is null-safe, as in Deephaven: `X = null` matches nulls, `X != v` matches nulls."""
        if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(right_node, ast.Constant) and right_node.value is None:
            return pc.is_null(left) if isinstance(op, ast.Eq) else pc.is_valid(left)
        if isinstance(op, ast.Eq):
            return pc.and_kleene(pc.is_valid(left), fn(left, right))
        if isinstance(op, ast.NotEq):
            return pc.or_kleene(pc.is_null(left), fn(left, right))
        return fn(left, right)

    def fail(self, what: str):
        raise ExpressionError(f"{what} in {self.text!r}")

    def build(self, node):
        if isinstance(node, ast.Expression):
            return self.build(node.body)
        if isinstance(node, ast.Name):
            if node.id not in self.schema.names:
                self.fail(f"unknown column {node.id!r} (columns: {', '.join(self.schema.names)})")
            return pc.field(node.id)
        if isinstance(node, ast.Constant):
            if node.value is None or isinstance(node.value, (bool, int, float, str)):
                return pc.scalar(node.value)
            self.fail(f"unsupported literal {node.value!r}")
        if isinstance(node, ast.UnaryOp):
            v = self.build(node.operand)
            if isinstance(node.op, ast.USub):
                return pc.negate(v)
            if isinstance(node.op, ast.UAdd):
                return v
            if isinstance(node.op, ast.Not):
                return pc.invert(v)
        if isinstance(node, ast.BinOp):
            a, b = self.build(node.left), self.build(node.right)
            ops = {ast.Add: pc.add, ast.Sub: pc.subtract, ast.Mult: pc.multiply, ast.Div: pc.divide}
            for k, fn in ops.items():
                if isinstance(node.op, k):
                    return fn(a, b)
            if isinstance(node.op, ast.Mod):
                return pc.subtract(a, pc.multiply(pc.floor(pc.divide(a, b)), b))
            self.fail(f"unsupported operator {type(node.op).__name__}")
        if isinstance(node, ast.BoolOp):
            vals = [self.build(v) for v in node.values]
            fn = pc.and_kleene if isinstance(node.op, ast.And) else pc.or_kleene
            out = vals[0]
            for v in vals[1:]:
                out = fn(out, v)
            return out
        if isinstance(node, ast.Compare):
            ops = {ast.Eq: pc.equal, ast.NotEq: pc.not_equal, ast.Lt: pc.less, ast.LtE: pc.less_equal,
                   ast.Gt: pc.greater, ast.GtE: pc.greater_equal}
            left = self.build(node.left)
            out = None
            for op, right_node in zip(node.ops, node.comparators):
                fn = next((f for k, f in ops.items() if isinstance(op, k)), None)
                if fn is None:
                    self.fail(f"unsupported comparison {type(op).__name__}")
                right = self.build(right_node)
                term = self.compare(op, fn, left, right, right_node)
                out = term if out is None else pc.and_kleene(out, term)
                left = right
            return out
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isNull" \
                and len(node.args) == 1 and not node.keywords:
            return pc.is_null(self.build(node.args[0]))
        self.fail(f"unsupported expression {ast.unparse(node)!r}")


def _parse(text: str, schema: pa.Schema) -> pc.Expression:
    try:
        src = _literal_words(_translate(text))
        tree = ast.parse(src.strip(), mode="eval")
    except (SyntaxError, tokenize.TokenError) as exc:
        raise ExpressionError(f"cannot parse {text!r}: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    return _Builder(schema, text).build(tree)


def parse_filter(text: str, schema: pa.Schema) -> pc.Expression:
    """A Deephaven filter string -> a boolean expression (null counts as not matching)."""
    m = _IN.match(text)
    if m:
        col, neg, rest = m.group(1), m.group(2), m.group(3)
        if col not in schema.names:
            raise ExpressionError(f"unknown column {col!r} in {text!r}")
        values = _literal_list(rest, text)
        arr = pa.array(values, type=schema.field(col).type) if values else pa.array([], schema.field(col).type)
        expr = pc.field(col).isin(arr)
        return pc.invert(expr) if neg.startswith("not") else expr
    return _parse(text, schema)


def _literal_list(rest: str, text: str) -> list:
    try:
        tree = ast.parse(_literal_words(_translate(rest)).strip(), mode="eval").body
    except SyntaxError:
        raise ExpressionError(f"cannot parse the values of {text!r}") from None
    items = tree.elts if isinstance(tree, ast.Tuple) else [tree]
    out = []
    for it in items:
        if isinstance(it, ast.UnaryOp) and isinstance(it.op, ast.USub) and isinstance(it.operand, ast.Constant):
            out.append(-it.operand.value)
        elif isinstance(it, ast.Constant):
            out.append(it.value)
        else:
            raise ExpressionError(f"the values of {text!r} must be literals")
    return out


def parse_column_spec(spec: str, schema: pa.Schema) -> tuple[str, Optional[pc.Expression], Optional[str]]:
    """A View/Select column spec -> (output name, expression, source column).

    ``"A"`` -> ("A", None, "A"); ``"B = A"`` -> ("B", None, "A") (a rename); ``"C = A * 2"`` ->
    ("C", expression, None)."""
    text = spec.strip()
    m = re.match(r"^([A-Za-z_][A-Za-z_0-9]*)\s*(?:=(?!=)\s*(.+))?$", text, re.S)
    if not m:
        raise ExpressionError(f"cannot parse column spec {spec!r}")
    name, formula = m.group(1), m.group(2)
    if formula is None:
        if name not in schema.names:
            raise ExpressionError(f"unknown column {name!r} (columns: {', '.join(schema.names)})")
        return name, None, name
    formula = formula.strip()
    if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", formula) and formula not in ("true", "false", "null"):
        if formula not in schema.names:
            raise ExpressionError(f"unknown column {formula!r} in {spec!r}")
        return name, None, formula
    return name, _parse(formula, schema), None
