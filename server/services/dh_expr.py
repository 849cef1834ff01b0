"""Deephaven's filter and column-formula strings, as pyarrow compute expressions.

Deephaven clients send filters such as ``Sym = `AAPL` && Price > 100`` and column specs such as
``Notional = Price * Size`` as strings (TableService.UnstructuredFilter, View, Select, Update).
This module accepts the subset whose answers it can give exactly as Deephaven gives them (values
and result types), and refuses everything else with `ExpressionError` (the server answers
INVALID_ARGUMENT), naming the position and what was expected there.

Accepted:

- literals: decimal integers (int, or long when too large for an int; ``L`` suffix = long),
  decimal floats (double; ``f`` suffix = float, ``d`` = double), strings in backticks or double
  quotes, instants in single quotes (``'2023-11-14T22:20:00Z'``, ``'...+01:00'``, ``'... UTC'``),
  ``true``/``false``, ``null`` (only as an operand of ``==``/``!=``);
- column names of integer, floating-point, boolean, string and timestamp columns;
- ``+ - * / %`` and unary minus with Java's numeric promotion: byte and short operands become
  int, ``int op int`` is int (wrapping on overflow), a mixed operation takes the wider type; ``/``
  is floating-point division (an integer quotient is a double, ``x / 0`` is infinity or NaN);
  ``%`` is Java's truncated remainder, on integers only by a non-zero literal. A null operand
  gives null, and so does a result equal to Deephaven's null sentinel (the type's minimum integer,
  ``-MAX_VALUE`` for floats), as in Deephaven;
- comparisons ``== = != < <= > >=`` with Deephaven's ordering: null is below every value and
  equal to null; NaN compares false with everything (``!=`` true); -0.0 is below 0.0 for
  ``< <= > >=`` except in a lone ``column op literal`` filter (Deephaven's range filter), and
  equal to it for ``==``; strings and booleans compare for equality only; one comparison per
  operand (``a < b < c`` is refused, as in Java);
- ``&&``, ``||``, ``!``, parentheses, ``isNull(X)``;
- filters only: ``X in v1, v2, ...`` / ``X not in ...`` with literals of X's type (null matches
  nulls), and ``X = 'text'`` / ``X != 'text'`` for a string column.

Results of comparisons and ``isNull`` are never null, so a filter keeps exactly the rows it is
true for. Expressions are limited to MAX_LENGTH characters, MAX_NODES operators/operands and
MAX_DEPTH levels of nesting.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass
from typing import Any, NoReturn, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.errors import TickwireError
from tickwire.protocol.schema import sentinel_for

__all__ = ["ExpressionError", "parse_filter", "parse_column_spec", "parse_column_specs", "compare_operands",
           "MAX_LENGTH", "MAX_DEPTH", "MAX_NODES"]

MAX_LENGTH = 8192
MAX_DEPTH = 64
MAX_NODES = 2000


class ExpressionError(TickwireError, ValueError):
    pass


# -- tokens ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tok:
    kind: str  # "num", "str", "sq", "name", "op", "end"
    text: str
    pos: int


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLfFdD]?(?![A-Za-z0-9_$.]))
  | (?P<name>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[=<>+\-*/%!(),])
""", re.X)


def _tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "`\"'":
            j = text.find(ch, i + 1)
            if j < 0:
                raise ExpressionError(f"unterminated string starting at position {i} in {text!r}")
            out.append(_Tok("sq" if ch == "'" else "str", text[i + 1:j], i))
            i = j + 1
            continue
        m = _TOKEN.match(text, i)
        if m is None:
            if ch == "." and out and out[-1].kind in ("name", "str", "sq") or ch == ".":
                raise ExpressionError(f"unsupported expression {text!r}: method calls and field access "
                                      f"(the '.' at position {i}) are not supported")
            raise ExpressionError(f"cannot parse {text!r}: unexpected character {ch!r} at position {i}")
        if m.lastgroup != "ws":
            out.append(_Tok(m.lastgroup or "", m.group(), i))
        i = m.end()
    out.append(_Tok("end", "", n))
    return out


# -- syntax tree ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Node:
    kind: str  # "lit", "col", "neg", "not", "bin", "isnull"
    pos: int
    op: str = ""
    value: Any = None  # literal value, or column name
    vtype: Any = None  # literal type: a pa.DataType, "null" or "sq" (text in single quotes)
    args: tuple = ()


_EQ_OPS = ("==", "=", "!=")
_REL_OPS = ("<", "<=", ">", ">=")


class _Parser:
    """Recursive descent over Java's precedence: || < && < equality < relational < + - < * / %
    < unary. Nesting deeper than MAX_DEPTH and more than MAX_NODES nodes are refused."""

    def __init__(self, text: str, tokens: Optional[list[_Tok]] = None):
        if len(text) > MAX_LENGTH:
            raise ExpressionError(f"expression too long ({len(text)} characters, at most {MAX_LENGTH})")
        self.text = text
        self.toks = tokens if tokens is not None else _tokenize(text)
        self.i = 0
        self.depth = 0
        self.nodes = 0

    # helpers
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def fail(self, expected: str) -> NoReturn:
        t = self.tok
        quoted = ("`" + t.text + "`" if t.kind == "str" else "'" + t.text + "'")
        found = "the end" if t.kind == "end" else repr(t.text if t.kind not in ("str", "sq") else quoted)
        raise ExpressionError(f"cannot parse {self.text!r}: at position {t.pos}: expected {expected}, found {found}")

    def node(self, *a, **k) -> _Node:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ExpressionError(f"expression too large (more than {MAX_NODES} terms) in {self.text[:80]!r}...")
        return _Node(*a, **k)

    def take_op(self, *ops: str) -> Optional[_Tok]:
        t = self.tok
        if t.kind == "op" and t.text in ops:
            self.i += 1
            return t
        return None

    def parse(self) -> _Node:
        n = self.expr()
        if self.tok.kind != "end":
            self.fail("an operator or the end of the expression")
        return n

    # grammar
    def expr(self) -> _Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"expression nested too deeply (more than {MAX_DEPTH} levels) at position "
                                  f"{self.tok.pos} in {self.text[:80]!r}")
        try:
            return self.binary(0)
        finally:
            self.depth -= 1

    _LEVELS = (("||",), ("&&",), _EQ_OPS, _REL_OPS, ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> _Node:
        if level == len(self._LEVELS):
            return self.unary()
        ops = self._LEVELS[level]
        left = self.binary(level + 1)
        chains = level in (2, 3)  # equality and relational operators take one comparison each
        while True:
            t = self.take_op(*ops)
            if t is None:
                return left
            right = self.binary(level + 1)
            left = self.node("bin", t.pos, op="==" if t.text == "=" else t.text, args=(left, right))
            if chains and self.tok.kind == "op" and self.tok.text in ops:
                self.fail("an operator other than a second comparison (write (a < b) && (b < c))")

    def unary(self) -> _Node:
        t = self.take_op("-", "!")
        if t is None:
            return self.primary()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"expression nested too deeply (more than {MAX_DEPTH} levels) at position "
                                  f"{t.pos} in {self.text[:80]!r}")
        try:
            operand = self.unary()
        finally:
            self.depth -= 1
        if t.text == "-" and operand.kind == "lit" and operand.vtype != "null" \
                and not isinstance(operand.value, (str, bool)) and operand.op == "number":
            return self._negated_literal(operand, t.pos)
        return self.node("neg" if t.text == "-" else "not", t.pos, args=(operand,))

    def _negated_literal(self, lit: _Node, pos: int) -> _Node:
        v = -lit.value
        if lit.vtype == pa.int32() and v == -(2 ** 31):
            vt = pa.int64()  # 2147483648 is a long before its minus applies, as in Deephaven
        else:
            vt = lit.vtype
        return _Node("lit", pos, op="number", value=v, vtype=vt)

    def primary(self) -> _Node:
        t = self.tok
        if t.kind == "num":
            self.i += 1
            v, vt = _number(t, self.text)
            return self.node("lit", t.pos, op="number", value=v, vtype=vt)
        if t.kind == "str":
            self.i += 1
            return self.node("lit", t.pos, value=t.text, vtype=pa.string())
        if t.kind == "sq":
            self.i += 1
            return self.node("lit", t.pos, value=t.text, vtype="sq")
        if t.kind == "name":
            self.i += 1
            if t.text in ("true", "false"):
                return self.node("lit", t.pos, value=t.text == "true", vtype=pa.bool_())
            if t.text == "null":
                return self.node("lit", t.pos, value=None, vtype="null")
            if t.text in ("and", "or", "not", "in"):
                self.i -= 1
                self.fail("a value (Deephaven writes &&, ||, ! for and, or, not)")
            if self.take_op("("):
                if t.text != "isNull":
                    raise ExpressionError(f"unsupported expression {self.text!r}: function {t.text!r} at position "
                                          f"{t.pos} (only isNull is supported)")
                arg = self.expr()
                if not self.take_op(")"):
                    self.fail("')' closing isNull(")
                return self.node("isnull", t.pos, args=(arg,))
            return self.node("col", t.pos, value=t.text)
        if self.take_op("("):
            inner = self.expr()
            if not self.take_op(")"):
                self.fail("')'")
            return inner
        self.fail("a value (a column, a literal or '(')")


def _number(t: _Tok, text: str):
    s = t.text
    suffix = s[-1].lower() if s[-1] in "lLfFdD" else ""
    body = s[:-1] if suffix else s
    is_float = suffix in ("f", "d") or any(c in body for c in ".eE")
    if not is_float:
        v = int(body)
        if suffix == "l":
            if v > 2 ** 63 - 1:
                raise ExpressionError(f"integer literal {s} at position {t.pos} is too large for a long in {text!r}")
            return v, pa.int64()
        if v <= 2 ** 31 - 1:
            return v, pa.int32()
        if v <= 2 ** 63 - 1:
            return v, pa.int64()
        raise ExpressionError(f"integer literal {s} at position {t.pos} is too large in {text!r}")
    x = float(body)
    if suffix == "f":
        f32 = pa.scalar(x, pa.float32()).as_py()
        subnormal = x != 0.0 and abs(f32) < 1.1754943508222875e-38 and x != f32
        if math.isinf(f32) or (f32 == 0.0 and x != 0.0) or subnormal:
            raise ExpressionError(f"float literal {s} at position {t.pos} is out of range in {text!r}")
        return f32, pa.float32()
    if math.isinf(x) or (x == 0.0 and re.search(r"[1-9]", body.split("e")[0].split("E")[0])):
        raise ExpressionError(f"floating-point literal {s} at position {t.pos} is out of range in {text!r}")
    return x, pa.float64()


# -- types and values -----------------------------------------------------------------------------

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_FLOATS = (pa.float32(), pa.float64())
_RANK = {pa.int8(): 0, pa.int16(): 1, pa.int32(): 2, pa.int64(): 3, pa.float32(): 4, pa.float64(): 5}


def _kind(t) -> str:
    if t == "null":
        return "null"
    if t in _INTS or t in _FLOATS:
        return "num"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_timestamp(t):
        return "ts"
    return "other"


@dataclass
class _Val:
    expr: Any  # pc.Expression
    type: Any  # pa.DataType or "null"
    pred: bool = False  # a never-null boolean (a comparison, isNull, a logical operation of those)
    lit: Any = None
    is_lit: bool = False
    nonnull: bool = False


def _promote(a, b):
    """Java's binary numeric promotion."""
    top = max(_RANK[a], _RANK[b], _RANK[pa.int32()])
    return next(t for t, r in _RANK.items() if r == top)


def _null_sentinel(expr, t):
    """A result equal to Deephaven's null value for its type is null there (`t` is a promoted
    numeric type: int32, int64, float32 or float64)."""
    s = sentinel_for(t)
    if s is None:
        return expr
    return pc.if_else(pc.equal(expr, pc.scalar(pa.scalar(s, t))), pc.scalar(pa.scalar(None, t)), expr)


def _as(v: _Val, t) -> Any:
    if v.is_lit:
        lit = v.lit
        if t in _FLOATS and isinstance(lit, int):  # Java's int-to-floating conversion: round to nearest
            lit = float(np.float32(np.int64(lit))) if t == pa.float32() else float(lit)
        return pc.scalar(pa.scalar(lit, t))
    return v.expr if v.type == t else v.expr.cast(t, safe=False)


def _ts_nanos(v: _Val):
    """A timestamp value as int64 nanoseconds since the epoch."""
    if v.is_lit:
        return pc.scalar(pa.scalar(v.lit, pa.int64()))
    t = v.type
    e = v.expr if t.unit == "ns" else v.expr.cast(pa.timestamp("ns", t.tz), safe=False)
    return e.cast(pa.int64())


_INSTANT = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
                      r"(Z| UTC|[+-]\d{2}:\d{2})$")


def _instant_nanos(s: str) -> Optional[int]:
    m = _INSTANT.match(s)
    if m is None:
        return None
    date, hh, mm, ss, frac, zone = m.groups()
    try:
        base = _dt.datetime.fromisoformat(f"{date}T{hh}:{mm}:{ss or '00'}").replace(tzinfo=_dt.timezone.utc)
    except ValueError:
        return None
    offset = 0
    if zone not in ("Z", " UTC"):
        sign = 1 if zone[0] == "+" else -1
        offset = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    seconds = int((base - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)).total_seconds()) - offset
    nanos = seconds * 1_000_000_000 + int((frac or "0").ljust(9, "0"))
    # Deephaven's instants are long nanoseconds, and the minimum long is its null
    if not -(2 ** 63) < nanos < 2 ** 63:
        raise ExpressionError(f"instant '{s}' is out of range (1677-09-21 to 2262-04-11)")
    return nanos


class _Builder:
    def __init__(self, schema: pa.Schema, text: str, signed_zeros: bool = True):
        self.schema = schema
        self.text = text
        self.signed_zeros = signed_zeros

    def fail(self, node: _Node, what: str) -> NoReturn:
        raise ExpressionError(f"{what} at position {node.pos} in {self.text!r}")

    def column(self, node: _Node) -> _Val:
        name = node.value
        if name not in self.schema.names:
            raise ExpressionError(f"unknown column {name!r} at position {node.pos} in {self.text!r} "
                                  f"(columns: {', '.join(self.schema.names)})")
        t = self.schema.field(name).type
        if pa.types.is_large_string(t):
            return _Val(pc.field(name).cast(pa.string()), pa.string())
        if _kind(t) == "other":
            self.fail(node, f"column {name!r} of type {t} cannot be used in an expression")
        return _Val(pc.field(name), t)

    def build(self, node: _Node) -> _Val:
        k = node.kind
        if k == "col":
            return self.column(node)
        if k == "lit":
            if node.vtype == "sq":
                nanos = _instant_nanos(node.value)
                if nanos is None:
                    self.fail(node, f"'{node.value}' is not an instant (write strings in backticks; instants as "
                                    "'2023-11-14T22:20:00Z')")
                return _Val(pc.scalar(pa.scalar(nanos, pa.timestamp("ns", "UTC"))), pa.timestamp("ns", "UTC"),
                            lit=nanos, is_lit=True, nonnull=True)
            if node.vtype == "null":
                return _Val(pc.scalar(None), "null", is_lit=True)
            return _Val(pc.scalar(pa.scalar(node.value, node.vtype)), node.vtype, lit=node.value, is_lit=True,
                        nonnull=True, pred=False)
        if k == "isnull":
            a = self.build(node.args[0])
            if a.type == "null":
                return _Val(pc.scalar(True), pa.bool_(), pred=True)
            return _Val(pc.is_null(a.expr), pa.bool_(), pred=True)
        if k == "not":
            a = self.build(node.args[0])
            if not a.pred:
                self.fail(node, "'!' needs a comparison, isNull(...) or a combination of those "
                                f"(found a value of type {a.type})")
            return _Val(pc.invert(a.expr), pa.bool_(), pred=True)
        if k == "neg":
            a = self.build(node.args[0])
            if _kind(a.type) != "num" or a.type in (pa.int8(), pa.int16()):
                self.fail(node, f"unary minus is not supported on {a.type}")
            return _Val(pc.negate(a.expr), a.type)
        if k == "bin":
            op = node.op
            a, b = self.build(node.args[0]), self.build(node.args[1])
            if op in ("&&", "||"):
                for side in (a, b):
                    if not side.pred:
                        self.fail(node, f"'{op}' needs comparisons or isNull(...) on both sides "
                                        f"(found a value of type {side.type})")
                fn = pc.and_kleene if op == "&&" else pc.or_kleene
                return _Val(fn(a.expr, b.expr), pa.bool_(), pred=True)
            if op in ("+", "-", "*", "/", "%"):
                return self.arithmetic(node, op, a, b)
            return _Val(compare(op, a, b, lambda what: self.fail(node, what), self.signed_zeros), pa.bool_(),
                        pred=True)
        self.fail(node, "unsupported expression")

    def arithmetic(self, node: _Node, op: str, a: _Val, b: _Val) -> _Val:
        for side in (a, b):
            if _kind(side.type) != "num":
                what = "null" if side.type == "null" else str(side.type)
                self.fail(node, f"'{op}' needs numbers on both sides (found {what})")
        t = _promote(a.type, b.type)
        if op == "/":
            t = pa.float32() if b.type == pa.float32() and a.type != pa.float64() else pa.float64()
            return _Val(_null_sentinel(pc.divide(_as(a, t), _as(b, t)), t), t)
        if op == "%" and t in _INTS:
            if not b.is_lit:
                self.fail(node, "an integer '%' needs a literal divisor (a zero divisor is an error in Deephaven)")
            if b.lit == 0:
                self.fail(node, "integer remainder by zero")
        fn = {"+": pc.add, "-": pc.subtract, "*": pc.multiply, "%": pc.remainder}[op]
        return _Val(_null_sentinel(fn(_as(a, t), _as(b, t)), t), t)


def _f32_exact(v: _Val) -> bool:
    if not v.is_lit:
        return False
    return float(pa.scalar(float(v.lit), pa.float32()).as_py()) == v.lit


def _neg_zero(v: _Val, e):
    """true where a floating-point value is -0.0 (false for null)"""
    if v.is_lit:
        return pc.scalar(v.lit == 0.0 and math.copysign(1.0, v.lit) < 0)
    negative = pc.less(pc.divide(pc.scalar(1.0), e.cast(pa.float64())), pc.scalar(0.0))
    return pc.coalesce(pc.and_kleene(pc.equal(e, pc.scalar(0.0)), negative), pc.scalar(False))


def compare(op: str, a: _Val, b: _Val, fail, signed_zeros: bool = True) -> Any:
    """Deephaven's comparison of two values: null is below everything and equals null, NaN
    compares false (so `!=` is true). The result is never null.

    With `signed_zeros` (Deephaven's formulas and general filters), -0.0 orders below 0.0 in
    `< <= > >=` though `==` holds between them; without it (Deephaven's range filters, a lone
    `column op literal`), they are equal for every operator."""
    if op == "=":
        op = "=="
    ka, kb = _kind(a.type), _kind(b.type)
    if ka == "null" or kb == "null":
        if op not in ("==", "!="):
            fail(f"'{op}' with null is not supported (use isNull(...))")
        other = b if ka == "null" else a
        if other.type == "null":
            fail("comparison of null with null")
        if other.nonnull:
            return pc.scalar(op == "!=")
        return pc.is_null(other.expr) if op == "==" else pc.is_valid(other.expr)
    if ka != kb or ka == "other":
        fail(f"cannot compare {a.type} with {b.type}")
    if ka == "num":
        ta, tb = a.type, b.type
        for x, y in ((a, b), (b, a)):
            if x.type == pa.float32() and y.type == pa.float64() and y.is_lit and not _f32_exact(y):
                fail(f"comparing a float with {y.lit!r}, which a float cannot hold exactly, is not supported")
            if x.type in _FLOATS and y.type in _INTS and y.is_lit:
                limit = 2 ** 24 if x.type == pa.float32() else 2 ** 53
                if abs(y.lit) > limit:
                    fail(f"comparing a floating-point value with {y.lit}, which it cannot hold exactly, "
                         "is not supported")
            if not y.is_lit and not x.is_lit and x.type in _FLOATS and y.type in _INTS:
                if (x.type == pa.float32() and y.type in (pa.int32(), pa.int64())) or y.type == pa.int64():
                    fail(f"comparing {x.type} with {y.type} (not exact) is not supported")
        t = _promote(ta, tb)
        ea, eb = _as(a, t), _as(b, t)
        floats = t in _FLOATS
    elif ka == "ts":
        ea, eb = _ts_nanos(a), _ts_nanos(b)
        floats = False
    elif ka in ("str", "bool"):
        if op not in ("==", "!="):
            fail(f"ordering comparison '{op}' of {a.type} values is not supported")
        ea, eb = a.expr, b.expr
        floats = False
    else:
        fail(f"cannot compare {a.type} with {b.type}")

    def null(v: _Val, e):
        return pc.scalar(False) if v.nonnull else pc.is_null(e)

    def not_nan(v: _Val, e):
        """true where the value is a non-NaN number (null counts as not NaN)"""
        if not floats or v.is_lit and not (isinstance(v.lit, float) and math.isnan(v.lit)):
            return pc.scalar(True)
        return pc.invert(pc.coalesce(pc.is_nan(e), pc.scalar(False)))

    def both_null():
        return pc.and_kleene(null(a, ea), null(b, eb))

    if op in ("==", "!="):
        eq = pc.coalesce(pc.equal(ea, eb), pc.scalar(False))
        if not (a.nonnull or b.nonnull):
            eq = pc.or_kleene(eq, both_null())
        return eq if op == "==" else pc.invert(eq)
    if op in (">", ">="):
        a, b, ea, eb = b, a, eb, ea
        op = "<" if op == ">" else "<="
    fn = pc.less if op == "<" else pc.less_equal
    out = pc.coalesce(fn(ea, eb), pc.scalar(False))
    if floats and signed_zeros and not (a.is_lit and a.lit != 0.0) and not (b.is_lit and b.lit != 0.0):
        if op == "<":  # -0.0 < 0.0
            out = pc.or_kleene(out, pc.and_kleene(_neg_zero(a, ea), pc.and_kleene(
                pc.coalesce(pc.equal(eb, pc.scalar(0.0)), pc.scalar(False)), pc.invert(_neg_zero(b, eb)))))
        else:  # but not 0.0 <= -0.0
            out = pc.and_kleene(out, pc.invert(pc.and_kleene(pc.and_kleene(
                pc.coalesce(pc.equal(ea, pc.scalar(0.0)), pc.scalar(False)), pc.invert(_neg_zero(a, ea))),
                _neg_zero(b, eb))))
    if a.nonnull:
        return out
    # a null left side is below every non-null, non-NaN right side (and equal to a null one)
    if op == "<":
        low = pc.and_kleene(null(a, ea), pc.and_kleene(pc.invert(null(b, eb)), not_nan(b, eb)))
    else:
        low = pc.and_kleene(null(a, ea), not_nan(b, eb))
    return pc.or_kleene(out, low)


# -- entry points ---------------------------------------------------------------------------------

def _range_form(toks: list[_Tok]) -> bool:
    """`column op literal` or `literal op column` alone: Deephaven's range filter, whose float
    comparisons treat -0.0 and 0.0 as equal."""
    body = [t for t in toks if t.kind != "end"]
    i = next((k for k, t in enumerate(body) if t.kind == "op" and t.text in _REL_OPS), None)
    if i is None:
        return False
    left, right = body[:i], body[i + 1:]

    def literal(side):
        if len(side) == 2 and side[0].kind == "op" and side[0].text == "-":
            side = side[1:]
        return len(side) == 1 and side[0].kind in ("num", "str", "sq")

    def column(side):
        return len(side) == 1 and side[0].kind == "name" and side[0].text not in ("true", "false", "null")

    return (column(left) and literal(right)) or (literal(left) and column(right))


def _build_predicate(text: str, schema: pa.Schema, tokens=None) -> pc.Expression:
    tree = _Parser(text, tokens).parse()
    v = _Builder(schema, text, signed_zeros=not _range_form(tokens or _tokenize(text))).build(tree)
    if not v.pred:
        if v.type != "null" and _kind(v.type) == "bool" and v.is_lit:
            return pc.scalar(bool(v.lit))
        raise ExpressionError(f"a filter must be a comparison, isNull(...) or a combination of those; "
                              f"{text!r} is a value of type {v.type}")
    return v.expr


def _literal_value(tok: _Tok, neg: bool, t, text: str, col: str):
    """A literal of an `in` list or a match filter, converted to column type `t` exactly."""
    k = _kind(t)
    if tok.kind == "name" and tok.text == "null" and not neg:
        return None
    if k == "str" and tok.kind in ("str", "sq") and not neg:
        return tok.text
    if k == "bool" and tok.kind == "name" and tok.text in ("true", "false") and not neg:
        return tok.text == "true"
    if k == "ts" and tok.kind == "sq" and not neg:
        nanos = _instant_nanos(tok.text)
        if nanos is not None:
            return nanos
    if k == "num" and tok.kind == "num":
        v, vt = _number(tok, text)
        v = -v if neg else v
        if t in _INTS:
            if vt in _INTS:
                bits = {pa.int8(): 7, pa.int16(): 15, pa.int32(): 31, pa.int64(): 63}[t]
                if -(2 ** bits) < v < 2 ** bits:  # the type's minimum is Deephaven's null
                    return v
                raise ExpressionError(f"value {v} at position {tok.pos} is out of range for column {col!r} ({t}) "
                                      f"in {text!r}")
        else:
            fv = float(v)
            if t == pa.float32() and float(pa.scalar(fv, pa.float32()).as_py()) != fv:
                raise ExpressionError(f"value {v} at position {tok.pos} is not exactly a float (column {col!r}) "
                                      f"in {text!r}")
            if vt in _INTS and abs(v) > 2 ** 53:
                raise ExpressionError(f"value {v} at position {tok.pos} is not exactly a double in {text!r}")
            return fv
    if tok.kind in ("num", "str", "sq") or (tok.kind == "name" and tok.text in ("true", "false", "null")):
        raise ExpressionError(f"type mismatch at position {tok.pos}: {tok.text!r} is not a value of column "
                              f"{col!r} ({t}) in {text!r}")
    raise ExpressionError(f"the values of {text!r} must be literals (position {tok.pos})")


def _match(col: str, values: list, negate: bool, schema: pa.Schema) -> pc.Expression:
    t = schema.field(col).type
    field = pc.field(col)
    if _kind(t) == "ts":
        field = _ts_nanos(_Val(field, t))
        t = pa.int64()
    present = [v for v in values if v is not None]
    if not present:
        hit = pc.scalar(False)
    elif t in _FLOATS:  # equality, not hashing: -0.0 matches 0.0
        hit = None
        for v in present:
            term = pc.coalesce(pc.equal(field, pc.scalar(pa.scalar(v, t))), pc.scalar(False))
            hit = term if hit is None else pc.or_kleene(hit, term)
    else:
        hit = pc.coalesce(pc.is_in(field, value_set=pa.array(present, t)), pc.scalar(False))
    if len(present) < len(values):
        hit = pc.or_kleene(hit, pc.is_null(field))
    return pc.invert(hit) if negate else hit


def parse_filter(text: str, schema: pa.Schema) -> pc.Expression:
    """A Deephaven filter string -> a never-null boolean expression."""
    if len(text) > MAX_LENGTH:
        raise ExpressionError(f"filter too long ({len(text)} characters, at most {MAX_LENGTH})")
    toks = _tokenize(text)
    # X in v1, v2, ... / X not in ...
    if len(toks) >= 2 and toks[0].kind == "name" and toks[1].kind == "name" and toks[1].text in ("in", "not"):
        col = toks[0].text
        i = 2
        negate = toks[1].text == "not"
        if negate:
            if toks[2].kind != "name" or toks[2].text != "in":
                raise ExpressionError(f"cannot parse {text!r}: at position {toks[2].pos}: expected 'in' after 'not'")
            i = 3
        if col not in schema.names:
            raise ExpressionError(f"unknown column {col!r} in {text!r} (columns: {', '.join(schema.names)})")
        t = schema.field(col).type
        if _kind(t) in ("other", "null"):
            raise ExpressionError(f"column {col!r} of type {t} cannot be matched in {text!r}")
        values = []
        while True:
            neg = toks[i].kind == "op" and toks[i].text == "-"
            if neg:
                i += 1
            tok = toks[i]
            if tok.kind == "end":
                raise ExpressionError(f"cannot parse {text!r}: at position {tok.pos}: expected a value")
            values.append(_literal_value(tok, neg, t, text, col))
            i += 1
            if toks[i].kind == "end":
                break
            if not (toks[i].kind == "op" and toks[i].text == ","):
                if toks[i].kind == "op" and toks[i].text in ("&&", "||"):
                    raise ExpressionError(f"cannot parse {text!r}: at position {toks[i].pos}: an 'in' filter "
                                          "cannot be combined with other conditions; pass it as its own filter")
                raise ExpressionError(f"the values of {text!r} must be literals separated by ',' "
                                      f"(position {toks[i].pos})")
            i += 1
        if len(values) > 10_000:
            raise ExpressionError(f"too many values in {text[:80]!r}")
        return _match(col, values, negate, schema)
    # X = 'text' on a string column: Deephaven matches the text in single quotes
    if len(toks) == 4 and toks[0].kind == "name" and toks[1].kind == "op" and toks[1].text in ("=", "==", "!=") \
            and toks[2].kind == "sq" and toks[0].text in schema.names \
            and _kind(schema.field(toks[0].text).type) == "str":
        return _match(toks[0].text, [toks[2].text], toks[1].text == "!=", schema)
    return _build_predicate(text, schema, toks)


def compare_operands(op: str, left, right, schema: pa.Schema) -> pc.Expression:
    """A comparison of two operands with Deephaven's rules, as in a filter string. Each operand is
    ("column", name) or ("literal", value, pa type or None for null)."""

    def val(x) -> _Val:
        if x[0] == "column":
            return _Builder(schema, x[1]).column(_Node("col", 0, value=x[1]))
        if x[1] is None:
            return _Val(pc.scalar(None), "null", is_lit=True)
        t = x[2]
        return _Val(pc.scalar(pa.scalar(x[1], t)), t, lit=x[1], is_lit=True, nonnull=True)

    def fail(what) -> NoReturn:
        raise ExpressionError(what)

    a, b = val(left), val(right)
    return compare(op, a, b, fail, signed_zeros=a.is_lit == b.is_lit)


def parse_column_spec(spec: str, schema: pa.Schema) -> tuple[str, Optional[pc.Expression], Optional[str]]:
    """A View/Select column spec -> (output name, expression, source column).

    ``"A"`` -> ("A", None, "A"); ``"B = A"`` -> ("B", None, "A") (a rename); ``"C = A * 2"`` ->
    ("C", expression, None)."""
    if len(spec) > MAX_LENGTH:
        raise ExpressionError(f"column spec too long ({len(spec)} characters, at most {MAX_LENGTH})")
    text = spec.strip()
    m = re.match(r"^([A-Za-z_$][A-Za-z_0-9$]*)\s*(?:=(?!=)\s*(.*))?$", text, re.S)
    if not m:
        raise ExpressionError(f"cannot parse column spec {spec!r}: expected NAME or NAME = FORMULA")
    name, formula = m.group(1), m.group(2)
    if formula is None:
        if name not in schema.names:
            raise ExpressionError(f"unknown column {name!r} (columns: {', '.join(schema.names)})")
        return name, None, name
    formula = formula.strip()
    if not formula:
        raise ExpressionError(f"cannot parse column spec {spec!r}: expected a formula after '='")
    if re.fullmatch(r"[A-Za-z_$][A-Za-z_0-9$]*", formula) and formula not in ("true", "false", "null"):
        if formula not in schema.names:
            raise ExpressionError(f"unknown column {formula!r} in {spec!r}")
        return name, None, formula
    tree = _Parser(formula).parse()
    v = _Builder(schema, formula).build(tree)
    if v.type == "null":
        raise ExpressionError(f"a formula of only null has no type in {spec!r}")
    return name, v.expr, None


def parse_column_specs(specs: list[str], schema: pa.Schema) -> list[tuple[str, Optional[pc.Expression], Optional[str]]]:
    """The column specs of one View/Select/Update call, each as `parse_column_spec` gives it."""
    return [parse_column_spec(s, schema) for s in specs]
