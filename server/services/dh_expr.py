"""Deephaven's filter and column-formula strings, as pyarrow compute expressions.

Deephaven clients send filters such as ``Sym = `AAPL` && Price > 100`` and column specs such as
``Notional = Price * Size`` as strings (TableService.UnstructuredFilter, View, Select, Update).
This module accepts the subset whose answers it can give exactly as Deephaven gives them (values
and result types), and refuses everything else with `ExpressionError` (the server answers
INVALID_ARGUMENT), naming the position and what was expected there.

Accepted:

- literals: decimal integers (int, or long when too large for an int; ``L`` suffix = long),
  decimal floats (double; ``f`` suffix = float, ``d`` = double), strings in backticks or double
  quotes, instants in single quotes as Deephaven's parseInstant reads them (``'2023-11-14T22:20:00Z'``,
  ``'...+01:00'``, ``'2023-11-14T17:20 ET'``, ``'... America/New_York'``, epoch numbers; see
  `parse_instant`), one character in single quotes (Java's char literal), ``true``/``false``, ``null``
  (only as an operand of ``==``/``!=`` or of a cast);
- Deephaven's time constants ``MICRO MILLI SECOND MINUTE HOUR DAY WEEK YEAR_365 YEAR_AVG`` (long
  nanoseconds) and ``SECONDS_PER_NANO`` ... ``YEARS_PER_NANO_AVG`` (doubles), unless a column has the name;
- column names of integer, floating-point, char (uint16; 0xFFFF is Deephaven's null char), boolean,
  string and timestamp columns;
- ``+ - * / %`` and unary minus with Java's numeric promotion: byte and short operands become
  int, ``int op int`` is int (wrapping on overflow), a mixed operation takes the wider type; ``/``
  is floating-point division (an integer quotient is a double, ``x / 0`` is infinity or NaN);
  ``%`` is Java's truncated remainder, on integers only by a non-zero literal. A null operand
  gives null, and so does a result equal to Deephaven's null sentinel (the type's minimum integer,
  ``-MAX_VALUE`` for floats), as in Deephaven. A char is a number there, promoted to int as short
  is (no unary minus);
- instant ``+``/``-`` integer nanoseconds (an instant) and instant ``-`` instant (long nanoseconds),
  as Deephaven's DateTimeUtils.plus/minus: null if a side is null; an instant from
  2262-04-11T23:47:16Z on fails the evaluation, one below the long range wraps around, the minimum
  long is null; ``long + instant`` is refused, as there;
- comparisons ``== = != < <= > >=`` with Deephaven's ordering: null is below every value and
  equal to null; NaN compares false with everything (``!=`` true); -0.0 is below 0.0 for
  ``< <= > >=`` except in a lone ``column op literal`` filter (Deephaven's range filter), and
  equal to it for ``==``; strings and booleans compare for equality only; one comparison per
  operand (``a < b < c`` is refused, as in Java);
- ``&&``, ``||``, ``!``, parentheses, ``isNull(X)``;
- ``cond ? a : b`` (the condition a comparison or the like, never null): a ``null`` branch takes
  the other's type; branches of different numeric types take the wider type with Java's
  conversion of the raw values (a null of the narrower type is its sentinel there, so
  ``c ? I8 : 3`` gives -128 for a null I8, as Deephaven does); byte with short is refused, as
  Deephaven refuses it;
- casts ``(byte) (short) (int) (long) (float) (double) (char)`` of numbers, ``(String)`` of a string
  and ``(Instant)`` of an instant (also written ``(java.lang.String)``, ``(java.time.Instant)``):
  null stays null, floating point to integer (and char) truncates, saturates at the int/long range
  and makes NaN 0, integer narrowing keeps the low bits, and a result equal to the null sentinel is
  null; ``(T)null`` is a null of type T;
- ``abs`` (same type), ``sqrt`` (double), ``floor``/``ceil`` of floating point (double),
  ``min``/``max`` of two numbers (the promoted type, char for two chars; nulls skipped, NaN wins, the first argument
  wins a tie, so ``min(0.0, -0.0)`` is 0.0), ``isNaN``/``isInf``/``isFinite`` (never null: false
  for null; ``isFinite`` of an integer is true unless null). ``Math.*`` is refused (Deephaven
  42.7 refuses it too);
- ``now()`` (an instant, read from the clock passed to the parse functions when the data is
  evaluated) and ``today()`` (the clock's date as yyyy-MM-dd in the machine's time zone);
- String methods ``length() toUpperCase() toLowerCase() trim() isEmpty() contains(s)
  startsWith(s) endsWith(s) equals(s) equalsIgnoreCase(s) matches(regex) substring(b[, e])``
  with literal arguments, and ``+`` of two strings (a null is written "null", as in Java). As
  in Deephaven a null receiver fails the evaluation (a NullPointerException there), and so does a
  substring out of range; Java's ``&&``, ``||`` and ``?:`` evaluate an operand only where it is
  reached, so ``!isNull(S) && S.length() > 3`` never fails. Strings that a method cannot answer
  exactly as Java does (case mappings that are not one-to-one, substrings of text beyond the
  Basic Multilingual Plane) fail the evaluation too, naming the case. Failures surface as Arrow
  errors when the data is evaluated;
- in a View/Select/Update call, the columns made by the earlier specs of the call
  (`parse_column_specs`).
- filters only: ``X in v1, v2, ...`` / ``X not in ...`` with literals of X's type (null matches
  nulls), and ``X = 'text'`` / ``X != 'text'`` for a string column.

Results of comparisons and ``isNull`` are never null, so a filter keeps exactly the rows it is
true for. Expressions are limited to MAX_LENGTH characters, MAX_NODES operators/operands and
MAX_DEPTH levels of nesting.
"""
from __future__ import annotations

import calendar
import datetime as _dt
import functools
import math
import re
import zoneinfo
from dataclasses import dataclass
from typing import Any, NoReturn, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.errors import TickwireError
from tickwire.protocol.schema import sentinel_for

__all__ = ["ExpressionError", "parse_filter", "parse_filters", "parse_column_spec", "parse_column_specs",
           "parse_instant", "java_zone", "compare_operands", "string_method", "java_regex",
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
  | (?P<op>==|!=|<=|>=|&&|\|\||[=<>+\-*/%!(),?:.])
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
#: casts: Java's primitive type name -> the Arrow type
_CAST_TYPES = {"byte": pa.int8(), "short": pa.int16(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
               "double": pa.float64(), "char": pa.uint16(), "String": pa.string(), "Instant": pa.timestamp("ns", "UTC")}
#: casts written with the class's full name
_QUALIFIED_CASTS = {"java.lang.String": "String", "java.time.Instant": "Instant"}
_CASTS = (*_CAST_TYPES, *_QUALIFIED_CASTS, "boolean", "Boolean", "Integer", "Long", "Double", "Float", "Short", "Byte")
#: Deephaven's time constants (io.deephaven.time.DateTimeUtils, imported into every formula): long
#: nanoseconds, and their reciprocals as doubles; a column of the same name hides one
TIME_CONSTANTS = {
    "MICRO": (1_000, pa.int64()), "MILLI": (1_000_000, pa.int64()), "SECOND": (1_000_000_000, pa.int64()),
    "MINUTE": (60 * 10 ** 9, pa.int64()), "HOUR": (3600 * 10 ** 9, pa.int64()), "DAY": (86_400 * 10 ** 9, pa.int64()),
    "WEEK": (7 * 86_400 * 10 ** 9, pa.int64()), "YEAR_365": (365 * 86_400 * 10 ** 9, pa.int64()),
    "YEAR_AVG": (31_556_952_000_000_000, pa.int64()),
    "SECONDS_PER_NANO": (1.0 / 1e9, pa.float64()), "MINUTES_PER_NANO": (1.0 / 60e9, pa.float64()),
    "HOURS_PER_NANO": (1.0 / 3600e9, pa.float64()), "DAYS_PER_NANO": (1.0 / 86_400e9, pa.float64()),
    "YEARS_PER_NANO_365": (1.0 / float(365 * 86_400 * 10 ** 9), pa.float64()),
    "YEARS_PER_NANO_AVG": (1.0 / 31_556_952_000_000_000.0, pa.float64()),
}
_FUNCTIONS = ("isNull", "isNaN", "isInf", "isFinite", "abs", "sqrt", "floor", "ceil", "min", "max", "now", "today")
#: String methods: name -> number of arguments
_METHODS = {"length": 0, "toUpperCase": 0, "toLowerCase": 0, "trim": 0, "isEmpty": 0, "contains": 1,
            "startsWith": 1, "endsWith": 1, "equals": 1, "equalsIgnoreCase": 1, "matches": 1, "substring": (1, 2)}
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
            cond = self.binary(0)
            t = self.take_op("?")
            if t is None:
                return cond
            a = self.expr()
            if not self.take_op(":"):
                self.fail("':' of the conditional operator")
            b = self.expr()
            return self.node("cond", t.pos, args=(cond, a, b))
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
            cast = self.cast_ahead()
            if cast is not None:
                pos, (target, width) = self.tok.pos, cast
                self.i += width
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    raise ExpressionError(f"expression nested too deeply (more than {MAX_DEPTH} levels) at "
                                          f"position {pos} in {self.text[:80]!r}")
                try:
                    operand = self.unary()
                finally:
                    self.depth -= 1
                return self.node("cast", pos, op=target, args=(operand,))
            return self.postfix(self.primary())
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

    def cast_ahead(self) -> Optional[tuple[str, int]]:
        """(the type, the number of tokens) of a cast `(type)` or `(java.time.Instant)` starting here."""
        toks, i = self.toks, self.i
        if not (toks[i].kind == "op" and toks[i].text == "(" and toks[i + 1].kind == "name"):
            return None
        j, name = i + 2, toks[i + 1].text
        while toks[j].kind == "op" and toks[j].text == "." and toks[j + 1].kind == "name":
            name += "." + toks[j + 1].text
            j += 2
        if toks[j].kind == "op" and toks[j].text == ")" and name in _CASTS:
            return _QUALIFIED_CASTS.get(name, name), j + 1 - i
        return None

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
                if t.text not in _FUNCTIONS:
                    raise ExpressionError(f"unsupported expression {self.text!r}: function {t.text!r} at position "
                                          f"{t.pos} (supported: {', '.join(sorted(_FUNCTIONS))})")
                args = self.arguments(t.text)
                if t.text == "isNull":
                    if len(args) != 1:
                        raise ExpressionError(f"isNull takes one argument, not {len(args)}, at position {t.pos} "
                                              f"in {self.text!r}")
                    return self.node("isnull", t.pos, args=args)
                return self.node("fn", t.pos, value=t.text, args=args)
            return self.node("col", t.pos, value=t.text)
        if self.take_op("("):
            inner = self.expr()
            if not self.take_op(")"):
                self.fail("')'")
            return inner
        self.fail("a value (a column, a literal or '(')")


    def arguments(self, what: str) -> tuple:
        """The arguments of a call whose '(' was taken, up to and with its ')'."""
        args: list[_Node] = []
        if self.take_op(")"):
            return ()
        while True:
            args.append(self.expr())
            if self.take_op(")"):
                return tuple(args)
            if not self.take_op(","):
                self.fail(f"',' or ')' in the arguments of {what}(")

    def postfix(self, node: _Node) -> _Node:
        """Method calls on a value: `S.length()`, `S.substring(1).trim()`."""
        while True:
            t = self.take_op(".")
            if t is None:
                return node
            name = self.tok
            if name.kind != "name":
                self.fail("a method name after '.'")
            self.i += 1
            if not self.take_op("("):
                raise ExpressionError(f"unsupported expression {self.text!r}: field access '.{name.text}' at "
                                      f"position {t.pos} (only method calls are supported)")
            node = self.node("call", name.pos, value=name.text, args=(node, *self.arguments(name.text)))


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
#: Java's char (Deephaven's char columns travel as uint16, 0xFFFF being its null): a number that
#: arithmetic promotes to int, as short is
_CHAR = pa.uint16()
_RANK = {pa.int8(): 0, pa.int16(): 1, pa.int32(): 2, pa.int64(): 3, pa.float32(): 4, pa.float64(): 5, _CHAR: 1}
_TS = pa.timestamp("ns", "UTC")


def _kind(t) -> str:
    if t == "null":
        return "null"
    if t in _INTS or t in _FLOATS or t == _CHAR:
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


# -- instants, as Deephaven's DateTimeUtils.parseInstant reads them -----------------------------------

#: Deephaven 42.7's time-zone aliases (its default timezone.aliases file), read before Java's zone ids
TIME_ZONE_ALIASES = {"ET": "America/New_York", "CT": "America/Chicago", "MT": "America/Denver",
                     "PT": "America/Los_Angeles", "HK": "Asia/Hong_Kong", "JP": "Asia/Tokyo", "LON": "Europe/London"}
#: names the local time-zone database has that Deephaven's Java (17) refuses as zone ids
_NOT_JAVA_ZONES = frozenset({"EST", "MST", "HST", "ROC", "Factory", "localtime", "posixrules", "America/Coyhaique"})
_JAVA_REGION = re.compile(r"[A-Za-z][A-Za-z0-9~/._+-]+")
#: Java's ZoneOffset.of forms by length: +h, +hh, +hhmm, +hh:mm, +hhmmss, +hh:mm:ss
_OFFSET_FORMS = {2: re.compile(r"([0-9])"), 3: re.compile(r"([0-9]{2})"), 5: re.compile(r"([0-9]{2})([0-9]{2})"),
                 6: re.compile(r"([0-9]{2}):([0-9]{2})"), 7: re.compile(r"([0-9]{2})([0-9]{2})([0-9]{2})"),
                 9: re.compile(r"([0-9]{2}):([0-9]{2}):([0-9]{2})")}
#: Deephaven converts an instant to long nanoseconds only below this epoch second (DateTimeUtils.epochNanos)
_MAX_EPOCH_SECOND = (2 ** 63 - 1) // 10 ** 9
#: the first instant (epoch nanoseconds) a Deephaven column cannot hold
INSTANT_LIMIT = _MAX_EPOCH_SECOND * 10 ** 9
_MICROTIME_THRESHOLD = 9_309_341_000_000  # Deephaven's bound between epoch micros and nanos (seconds, millis below)
_EPOCH_NUMBER = re.compile(r"-?[0-9]{1,19}")
# java.time's ISO zoned date-time (strict: two-digit fields, no day 30 of February, no hour 24)
_ISO_ZONED = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]{0,9}))?)?"
                        r"([Zz]|[+-][0-9]{2}(?::[0-9]{2}(?::[0-9]{2})?)?)(?:\[([^\]]*)\])?")
# Deephaven's "<date> <zone>" (midnight) and permissive local date-time before " <zone>" (one- or two-digit
# fields; a day past the month's end is its last day, 24:00 the next midnight)
_DATE_ZONE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})[tT]? ([a-zA-Z_/]+)")
_LOCAL_DATE_TIME = re.compile(r"([0-9]{4})-([0-9]{1,2})-([0-9]{1,2})[Tt]([0-9]{1,2}):([0-9]{1,2})"
                              r"(?::([0-9]{1,2})(?:\.([0-9]{0,9}))?)?")
_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_UTC)


class _NotAnInstant(ExpressionError):
    """The text is not an instant at all (as opposed to an instant out of range)."""


@functools.lru_cache(maxsize=1)
def _zone_names() -> frozenset:
    try:
        return frozenset(zoneinfo.available_timezones()) - _NOT_JAVA_ZONES
    except (OSError, ValueError):  # no time-zone database on this machine: region names are refused
        return frozenset()


def _zone_offset(text: str) -> Optional[int]:
    """Seconds east of UTC of a Java ZoneOffset id (+h, +hh, +hhmm, +hh:mm, +hhmmss, +hh:mm:ss, at most
    18 hours), or None."""
    form = _OFFSET_FORMS.get(len(text))
    m = form.fullmatch(text, 1) if form is not None and text[:1] in ("+", "-") else None
    if m is None:
        return None
    h, mi, s = (int(g) for g in (*m.groups(), "0", "0")[:3])
    if h > 18 or mi > 59 or s > 59 or (h == 18 and (mi or s)):
        return None
    total = h * 3600 + mi * 60 + s
    return -total if text[0] == "-" else total


def java_zone(name: str, aliases: bool = True) -> Optional[_dt.tzinfo]:
    """The time zone `name` names as Deephaven's DateTimeUtils.parseTimeZone reads it (its aliases
    ET, CT, MT, PT, HK, JP, LON first, then Java's ZoneId.of: offsets such as +05:30, UTC, GMT and UT
    with or without an offset, region ids such as America/New_York, case-sensitive), or None.
    Without `aliases`, as java.time reads a zone id in brackets."""
    if aliases:
        if len(name) <= 1:
            return None
        name = TIME_ZONE_ALIASES.get(name, name)
    if name == "Z":
        return _UTC
    if name[:1] in ("+", "-") and name:
        off = _zone_offset(name)
        return None if off is None else _dt.timezone(_dt.timedelta(seconds=off))
    for prefix in ("UTC", "GMT", "UT"):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if not rest:
                return _UTC
            if rest[0] in "+-":
                off = _zone_offset(rest)
                return None if off is None else _dt.timezone(_dt.timedelta(seconds=off))
            break
    if not _JAVA_REGION.fullmatch(name) or name not in _zone_names():
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _wrap64(n: int) -> int:
    return (n + 2 ** 63) % 2 ** 64 - 2 ** 63


def _zoned_nanos(text: str, fields, zone: _dt.tzinfo, smart: bool) -> int:
    """Epoch nanoseconds of a local date-time (year, month, day, hour, minute, second, fraction
    digits) in `zone`. A local time a daylight-saving change skips is moved later by the gap, one it
    repeats takes the earlier offset (as java.time's atZone does). `smart`: java.time's SMART
    resolving (a day past the month's end is the month's last day, 24:00 the next midnight)."""
    y, mo, d, h, mi, s = (int(x or 0) for x in fields[:6])
    nanos = int((fields[6] or "").ljust(9, "0") or 0)
    next_day = False
    try:
        if smart:
            if not (1 <= mo <= 12 and 1 <= d <= 31):
                raise ValueError("month or day out of range")
            d = min(d, calendar.monthrange(y, mo)[1])
            if h == 24 and mi == 0 and s == 0 and nanos == 0:
                h, next_day = 0, True
        date = _dt.date(y, mo, d) + _dt.timedelta(days=1 if next_day else 0)
        local = _dt.datetime.combine(date, _dt.time(h, mi, s), tzinfo=zone)
        delta = local - _EPOCH
    except (ValueError, OverflowError, calendar.IllegalMonthError) as exc:
        raise _NotAnInstant(f"cannot parse instant {text!r} ({exc})") from None
    return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + nanos


def parse_instant(text: str) -> Optional[int]:
    """Epoch nanoseconds of an instant written as Deephaven's DateTimeUtils.parseInstant reads it
    (TimeTable's start time, instant literals of formulas):

    - java.time's ISO form: ``2023-01-01T11:00Z``, ``...:00.5+01:00``, ``...+01``, ``...-05:00[America/New_York]``;
    - a local date-time and a zone after one space, with one- or two-digit fields:
      ``2023-01-01T11:00 ET``, ``2023-2-1T11:00:34.001 PT``, ``... America/New_York``, ``... +05:30``,
      ``... UTC``; a date and a zone, ``2023-01-01 ET``, is its midnight there;
    - an integer, epoch seconds, milliseconds, microseconds or nanoseconds by its size (as Deephaven
      guesses the unit, multiplying in long arithmetic).

    An instant at the minimum long nanoseconds, Deephaven's null, is None.

    Anything else raises ExpressionError naming the text; so does an instant outside the range of
    long nanoseconds."""
    if _EPOCH_NUMBER.fullmatch(text):
        n = int(text)
        if not -(2 ** 63) <= n < 2 ** 63:
            raise _NotAnInstant(f"cannot parse instant {text!r} (too large for a long)")
        size = abs(n)
        scale = 1 if size > 1000 * _MICROTIME_THRESHOLD else 1000 if size > _MICROTIME_THRESHOLD \
            else 10 ** 6 if size > _MICROTIME_THRESHOLD // 1000 else 10 ** 9
        nanos = _wrap64(n * scale)  # Deephaven multiplies in long arithmetic
        return None if nanos == -(2 ** 63) else nanos
    m = _ISO_ZONED.fullmatch(text)
    if m is not None:
        offset, bracket = m.group(8), m.group(9)
        seconds = 0 if offset in ("Z", "z") else _zone_offset(offset if len(offset) > 3 else offset + ":00")
        if seconds is None or (bracket is not None and java_zone(bracket, aliases=False) is None):
            raise _NotAnInstant(f"cannot parse instant {text!r} (bad offset or zone)")
        nanos = _zoned_nanos(text, m.groups()[:7], _dt.timezone(_dt.timedelta(seconds=seconds)), smart=False)
    else:
        m = _DATE_ZONE.fullmatch(text)
        if m is not None:
            fields: tuple = (*m.groups()[:3], 0, 0, 0, None)
            zone_name = m.group(4)
        else:
            space = text.find(" ")
            local = _LOCAL_DATE_TIME.fullmatch(text[:space]) if space > 0 else None
            if local is None:
                raise _NotAnInstant(f"cannot parse instant {text!r} (expected an ISO-8601 instant such as "
                                    "2023-01-01T11:00:00Z, a local date-time and a time zone such as "
                                    "2023-01-01T11:00 ET, or epoch seconds, millis, micros or nanos)")
            fields, zone_name = local.groups(), text[space + 1:]
        zone = java_zone(zone_name)
        if zone is None:
            raise _NotAnInstant(f"cannot parse instant {text!r}: no time zone {zone_name!r}")
        nanos = _zoned_nanos(text, fields, zone, smart=True)
    # Deephaven's instants are long nanoseconds, and the minimum long is its null
    if nanos == -(2 ** 63):
        return None
    if not -(2 ** 63) < nanos < 2 ** 63:
        raise ExpressionError(f"instant {text!r} is out of range (1677-09-21 to 2262-04-11)")
    return nanos


def _instant_nanos(s: str) -> Optional[int]:
    """parse_instant's nanoseconds, or None when `s` is not an instant (or is Deephaven's null
    instant); an instant out of range raises ExpressionError."""
    try:
        return parse_instant(s)
    except _NotAnInstant:
        return None


def _raw(v: _Val, t) -> Any:
    """A value converted to numeric type `t` as Java converts a primitive: a null is its type's
    null sentinel (the minimum integer, -MAX_VALUE) before the conversion."""
    if v.is_lit:
        return _as(v, t)
    s = sentinel_for(v.type)
    e = v.expr if s is None else pc.coalesce(v.expr, pc.scalar(pa.scalar(s, v.type)))
    return e if v.type == t else e.cast(t, safe=False)


def _fold_case(e):
    """Java's equalsIgnoreCase compares characters after upper-casing, then lower-casing, each."""
    return pc.utf8_lower(pc.utf8_upper(e))


#: characters outside the Basic Multilingual Plane (two UTF-16 units each in Java)
_ASTRAL = r"[\x{10000}-\x{10FFFF}]"
#: characters whose Java toUpperCase is not a one-to-one mapping (SpecialCasing: ß -> SS, ligatures,
#: Greek with iota subscript) or depends on context (final sigma, dotted capital I)
_UPPER_SPECIAL = r"[\x{DF}\x{149}\x{1F0}\x{390}\x{3B0}\x{587}\x{1E96}-\x{1E9A}\x{1F50}-\x{1F56}" \
                 r"\x{1F80}-\x{1FFF}\x{FB00}-\x{FB17}]"
_LOWER_SPECIAL = r"[\x{130}\x{3A3}\x{1F88}-\x{1FFF}]"
#: Java's String.trim removes the characters up to U+0020 at both ends
_JAVA_TRIM = "".join(chr(c) for c in range(0x21))

# now() and today() read the clock when the data is evaluated: a compute function of the clock
# registered here by key
_NOW_UDF, _TODAY_UDF = "tickwire_dh_now", "tickwire_dh_today"
_CLOCKS: dict[int, Clock] = {0: SYSTEM_CLOCK}


def _clock_key(clock: Optional[Clock]) -> int:
    if clock is None or clock is SYSTEM_CLOCK:
        return 0
    key = id(clock)
    _CLOCKS[key] = clock
    return key


def _scalar_key(key) -> int:
    return int(key.as_py() if isinstance(key, pa.Scalar) else key[0].as_py())


def _udf_now(ctx, key):
    ns = _CLOCKS[_scalar_key(key)].now_ns()
    return pa.array([ns] * ctx.batch_length, pa.int64()).cast(pa.timestamp("ns", "UTC"))


def _udf_today(ctx, key):
    """Today's date (yyyy-MM-dd) by the clock, in the machine's time zone (as Deephaven's
    default time zone is the JVM's)."""
    ns = _CLOCKS[_scalar_key(key)].now_ns()
    day = _dt.datetime.fromtimestamp(ns / 1e9).date().isoformat()
    return pa.array([day] * ctx.batch_length, pa.string())


def _register_udfs() -> None:
    for name, fn, out in ((_NOW_UDF, _udf_now, pa.timestamp("ns", "UTC")), (_TODAY_UDF, _udf_today, pa.string())):
        try:
            pc.get_function(name)
            continue
        except KeyError:
            pass
        pc.register_scalar_function(fn, name, {"summary": name, "description": f"Deephaven's {name[12:]}()"},
                                    {"clock": pa.int64()}, out)


_register_udfs()


def java_regex(pattern: str, *, dotall: bool, ignore_case: bool) -> str:
    """A Java regular expression matched against the whole string (`String.matches`,
    Deephaven's MatchesCondition) -> the RE2 pattern that matches the same strings.

    Accepted: leading inline flags `(?i)`, `(?s)` (combined too), `^` at the start and `$` at the
    end, `\\Q...\\E` quoting, `\\` before a punctuation character, `.` and plain characters, each
    optionally followed by `*`, `+` or `?`. Java's `(?i)` without `(?u)` folds ASCII letters
    only, and `.` without `(?s)` stops at \\n, \\r, \\u0085, \\u2028 and \\u2029; both are written
    out so that RE2 does the same. Anything else is refused, naming it."""
    i, n = 0, len(pattern)
    flags = re.match(r"(?:\(\?[is]+\))*", pattern)
    assert flags is not None
    for f in re.findall(r"[is]", flags.group()):
        dotall = dotall or f == "s"
        ignore_case = ignore_case or f == "i"
    i = flags.end()
    if i < n and pattern[i] == "^":
        i += 1
    out: list[str] = []

    def char(c: str) -> str:
        if ignore_case and c.isascii() and c.isalpha():
            return f"[{c.lower()}{c.upper()}]"
        if c.isascii() and not c.isalnum():
            return "\\x{%x}" % ord(c)
        return c

    last_atom = False
    while i < n:
        c = pattern[i]
        if c == "\\" and pattern.startswith("\\Q", i):
            j = pattern.find("\\E", i + 2)
            body = pattern[i + 2:] if j < 0 else pattern[i + 2:j]
            out.append("".join(char(x) for x in body))
            i = n if j < 0 else j + 2
            last_atom = False
            continue
        if c == "\\":
            if i + 1 < n and pattern[i + 1].isascii() and not pattern[i + 1].isalnum():
                out.append(char(pattern[i + 1]))
                i += 2
                last_atom = True
                continue
            raise ExpressionError(f"regular expression {pattern!r}: the escape {pattern[i:i + 2]!r} at position {i} "
                                  "is not supported")
        if c == "$" and i == n - 1:
            break
        if c in "*+?":
            if not last_atom:
                raise ExpressionError(f"regular expression {pattern!r}: {c!r} at position {i} is not supported here")
            if i + 1 < n and pattern[i + 1] in "*+?{":
                raise ExpressionError(f"regular expression {pattern!r}: the quantifier {pattern[i:i + 2]!r} at "
                                      f"position {i} is not supported")
            out.append(c)
            last_atom = False
            i += 1
            continue
        if c == ".":
            out.append("(?s:.)" if dotall else r"[^\n\r\x{85}\x{2028}\x{2029}]")
        elif c in "^$|()[]{}":
            raise ExpressionError(f"regular expression {pattern!r}: {c!r} at position {i} is not supported "
                                  "(supported: inline flags (?i) (?s), ^ and $ at the ends, \\Q...\\E, ., *, +, ?)")
        else:
            out.append(char(c))
        last_atom = True
        i += 1
    return "^(?:" + "".join(out) + ")$"


class _Builder:
    def __init__(self, schema: pa.Schema, text: str, signed_zeros: bool = True, *,
                 made: Optional[dict] = None, clock: Optional[Clock] = None):
        self.schema = schema
        self.text = text
        self.signed_zeros = signed_zeros
        self.made: dict[str, _Val] = made or {}  # columns made by earlier formulas of the same call
        self.clock = clock
        # the rows on which the expression being built is evaluated, as Java's short-circuiting
        # operators decide (None: every row): a null receiver of a method raises only there
        self.reach: Any = None

    def fail(self, node: _Node, what: str) -> NoReturn:
        raise ExpressionError(f"{what} at position {node.pos} in {self.text!r}")

    def column(self, node: _Node) -> _Val:
        name = node.value
        if name in self.made:
            return self.made[name]
        if name not in self.schema.names and name in ("i", "ii", "k"):
            self.fail(node, f"the row position variable {name!r} is not supported")
        if name not in self.schema.names and name == "Math":
            self.fail(node, "Math.* functions are not supported (Deephaven 42.7 refuses them too; "
                            "abs, sqrt, floor, ceil, min and max are)")
        if name not in self.schema.names and name in TIME_CONSTANTS:
            value, vt = TIME_CONSTANTS[name]
            return _Val(pc.scalar(pa.scalar(value, vt)), vt, lit=value, is_lit=True, nonnull=True)
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
                if len(node.value) <= 1:  # Java's char literal, as in Deephaven
                    code = ord(node.value) if node.value else -1
                    if not 0 <= code < 0xFFFF or node.value == "\\":
                        self.fail(node, f"'{node.value}' is not a char literal this server reads (a character of "
                                        "the Basic Multilingual Plane other than \\ and \\uFFFF, Deephaven's "
                                        "null char)")
                    return _Val(pc.scalar(pa.scalar(code, _CHAR)), _CHAR, lit=code, is_lit=True, nonnull=True)
                nanos = _instant_nanos(node.value)
                if nanos is None:
                    self.fail(node, f"'{node.value}' is not an instant (write strings in backticks; instants as "
                                    "'2023-11-14T22:20:00Z' or '2023-11-14T17:20 ET')")
                return _Val(pc.scalar(pa.scalar(nanos, _TS)), _TS, lit=nanos, is_lit=True, nonnull=True)
            if node.vtype == "null":
                return _Val(pc.scalar(None), "null", is_lit=True)
            if node.vtype == pa.string() and "\\" in node.value and node.op != "value":
                # Deephaven reads a string literal of a formula as Java source, escapes and all
                self.fail(node, "a backslash (a Java escape sequence) in a string literal is not supported")
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
            if _kind(a.type) != "num" or a.type in (pa.int8(), pa.int16(), _CHAR):
                self.fail(node, f"unary minus is not supported on {a.type}")
            return _Val(pc.negate(a.expr), a.type)
        if k == "bin":
            op = node.op
            if op in ("&&", "||"):
                a = self.build(node.args[0])
                if not a.pred:
                    self.fail(node, f"'{op}' needs comparisons or isNull(...) on both sides "
                                    f"(found a value of type {a.type})")
                # Java evaluates the right side only where the left does not decide
                b = self.within(a.expr if op == "&&" else pc.invert(a.expr), node.args[1])
                if not b.pred:
                    self.fail(node, f"'{op}' needs comparisons or isNull(...) on both sides "
                                    f"(found a value of type {b.type})")
                fn = pc.and_kleene if op == "&&" else pc.or_kleene
                return _Val(fn(a.expr, b.expr), pa.bool_(), pred=True)
            a, b = self.build(node.args[0]), self.build(node.args[1])
            if op == "+" and "str" in (_kind(a.type), _kind(b.type)):
                return self.concat(node, a, b)
            if op in ("+", "-", "*", "/", "%"):
                return self.arithmetic(node, op, a, b)
            return _Val(compare(op, a, b, lambda what: self.fail(node, what), self.signed_zeros), pa.bool_(),
                        pred=True)
        if k == "cond":
            return self.conditional(node)
        if k == "cast":
            return self.cast(node, node.op, self.build(node.args[0]))
        if k == "fn":
            return self.function(node)
        if k == "call":
            return self.method(node, node.value, self.build(node.args[0]), node.args[1:])
        self.fail(node, "unsupported expression")

    # -- evaluation context, and errors Deephaven raises while evaluating -------------------------

    def within(self, condition, node: _Node) -> _Val:
        """`node` built as evaluated only on the rows where `condition` (never null) holds."""
        saved = self.reach
        self.reach = condition if saved is None else pc.and_kleene(saved, condition)
        try:
            return self.build(node)
        finally:
            self.reach = saved

    def raising(self, v: _Val, mask, message: str) -> _Val:
        """`v`, whose evaluation fails with `message` on the rows (evaluated by this expression)
        where `mask` is true, as Deephaven's evaluation fails there (a null receiver, an index out
        of range). The failure is an Arrow error naming the case when the data is evaluated."""
        hit = pc.coalesce(mask, pc.scalar(False))
        if self.reach is not None:
            hit = pc.and_kleene(hit, self.reach)
        text = f"{message} (in {self.text!r})"
        check = pc.if_else(hit, pc.scalar(text), pc.scalar("0")).cast(pa.int8())
        return _Val(pc.if_else(pc.equal(check, pc.scalar(pa.scalar(0, pa.int8()))), v.expr, v.expr), v.type,
                    pred=v.pred, nonnull=v.nonnull)

    # -- operators and functions beyond arithmetic ------------------------------------------------

    def concat(self, node: _Node, a: _Val, b: _Val) -> _Val:
        """String concatenation: Java writes a null string as "null"."""
        for side in (a, b):
            if _kind(side.type) != "str":
                what = "null" if side.type == "null" else str(side.type)
                self.fail(node, f"'+' of a string with {what} is not supported (only string + string)")
        ea, eb = (pc.coalesce(v.expr, pc.scalar("null")) for v in (a, b))
        return _Val(pc.binary_join_element_wise(ea, eb, pc.scalar("")), pa.string(), nonnull=True)

    def conditional(self, node: _Node) -> _Val:
        """`cond ? a : b`: only the branch chosen is evaluated for a row. Branches of different
        numeric types take the wider type with Java's conversion of the raw values (a null of the
        narrower type is its null sentinel there, as in Deephaven); a `null` branch takes the other
        branch's type."""
        c = self.build(node.args[0])
        if c.is_lit and c.type == pa.bool_():
            cond = pc.scalar(bool(c.lit))
        elif c.pred:
            cond = c.expr
        else:
            self.fail(node, "the condition of '?:' must be a comparison, isNull(...) or a combination of those "
                            f"(found a value of type {c.type}, which may be null)")
        a = self.within(cond, node.args[1])
        b = self.within(pc.invert(cond), node.args[2])
        if a.type == "null" and b.type == "null":
            self.fail(node, "'?:' of null and null has no type")
        if a.type == "null" or b.type == "null":
            v = b if a.type == "null" else a
            if _kind(v.type) == "other":
                self.fail(node, f"'?:' of {v.type} is not supported")
            nul = pc.scalar(pa.scalar(None, v.type))
            ea, eb = (nul, v.expr) if a.type == "null" else (v.expr, nul)
            return _Val(pc.if_else(cond, ea, eb), v.type)
        ka, kb = _kind(a.type), _kind(b.type)
        if a.type == b.type and ka != "other":
            return _Val(pc.if_else(cond, a.expr if not a.is_lit else _as(a, a.type),
                                   b.expr if not b.is_lit else _as(b, b.type)), a.type,
                        pred=all(v.pred or (v.is_lit and v.type == pa.bool_()) for v in (a, b)),
                        nonnull=a.nonnull and b.nonnull)
        if ka == kb == "num":
            if a.type in (pa.int8(), pa.int16(), _CHAR) and b.type in (pa.int8(), pa.int16(), _CHAR):
                self.fail(node, f"'?:' of {a.type} and {b.type} is not supported (Deephaven refuses it)")
            t = _promote(a.type, b.type)
            return _Val(_null_sentinel(pc.if_else(cond, _raw(a, t), _raw(b, t)), t), t)
        self.fail(node, f"'?:' of {a.type} and {b.type} is not supported")

    def cast(self, node: _Node, target: str, a: _Val) -> _Val:
        """Java's primitive casts with Deephaven's nulls: null stays null; floating-point to
        integer truncates, saturates at the int or long range and makes NaN 0; narrowing an
        integer keeps its low bits; a result equal to the type's null sentinel is null."""
        t = _CAST_TYPES.get(target)
        if t is None:
            self.fail(node, f"the cast ({target}) is not supported")
        if a.type == "null":  # Deephaven reads (int)null, (String)null, (Instant)null as a null of the type
            return _Val(pc.scalar(pa.scalar(None, t)), t)
        if t == pa.string() or t == _TS:
            if _kind(a.type) != _kind(t):
                self.fail(node, f"({target}) of {a.type} is not supported")
            return a
        if _kind(a.type) != "num":
            self.fail(node, f"({target}) of {'null' if a.type == 'null' else a.type} is not supported")
        e = _as(a, a.type)
        if t == a.type:
            return _Val(e, t, lit=a.lit, is_lit=a.is_lit, nonnull=a.nonnull)
        if t in _FLOATS:
            return _Val(_null_sentinel(e.cast(t, safe=False), t), t)
        if a.type in _FLOATS:  # to int (or long), then narrower as an int is
            wide = pa.int64() if t == pa.int64() else pa.int32()
            bits = 63 if wide == pa.int64() else 31
            x = e.cast(pa.float64())
            x = pc.if_else(pc.is_nan(x), pc.scalar(0.0), pc.trunc(x))
            big = pc.greater_equal(x, pc.scalar(float(2 ** bits)))
            small = pc.less_equal(x, pc.scalar(-float(2 ** bits)))
            x = pc.if_else(big, pc.scalar(0.0), pc.if_else(small, pc.scalar(0.0), x)).cast(wide)
            x = pc.if_else(big, pc.scalar(pa.scalar(2 ** bits - 1, wide)),
                           pc.if_else(small, pc.scalar(pa.scalar(-(2 ** bits), wide)), x))
            e = x
        return _Val(_null_sentinel(e.cast(t, safe=False), t), t)

    def function(self, node: _Node) -> _Val:
        name, args = node.value, node.args
        if name in ("now", "today"):
            if args:
                self.fail(node, f"{name}() takes no arguments here")
            key = pc.scalar(pa.scalar(_clock_key(self.clock), pa.int64()))
            if name == "now":
                return _Val(pc.Expression._call(_NOW_UDF, [key]),  # noqa: SLF001 (how a registered function is called)
                            pa.timestamp("ns", "UTC"), nonnull=True)
            return _Val(pc.Expression._call(_TODAY_UDF, [key]), pa.string(), nonnull=True)  # noqa: SLF001
        want = 2 if name in ("min", "max") else 1
        if len(args) != want:
            self.fail(node, f"{name} takes {want} argument{'s' if want > 1 else ''} here, not {len(args)}")
        vals = [self.build(x) for x in args]
        for v in vals:
            if _kind(v.type) != "num":
                self.fail(node, f"{name} of {'null' if v.type == 'null' else v.type} is not supported")
        a = vals[0]
        e = _as(a, a.type)
        floats = a.type in _FLOATS
        if name in ("isNaN", "isInf", "isFinite"):
            if not floats:
                out = pc.is_valid(e) if name == "isFinite" else pc.scalar(False)
            else:
                fn = {"isNaN": pc.is_nan, "isInf": pc.is_inf, "isFinite": pc.is_finite}[name]
                out = pc.coalesce(fn(e), pc.scalar(False))
            return _Val(out, pa.bool_(), pred=True)
        if name == "abs":
            return _Val(pc.abs(e), a.type)
        if name in ("sqrt", "floor", "ceil"):
            if name != "sqrt" and not floats:
                self.fail(node, f"{name} of {a.type} is not supported")
            fn = {"sqrt": pc.sqrt, "floor": pc.floor, "ceil": pc.ceil}[name]
            return _Val(_null_sentinel(fn(_as(a, pa.float64())), pa.float64()), pa.float64())
        # min / max of two values: nulls are skipped, NaN wins, the first wins a tie (so 0.0 vs -0.0)
        b = vals[1]
        t = _CHAR if a.type == b.type == _CHAR else _promote(a.type, b.type)  # min of two chars is a char
        ea, eb = _as(a, t), _as(b, t)
        better = (pc.less if name == "min" else pc.greater)(eb, ea)
        out = pc.if_else(pc.coalesce(better, pc.scalar(False)), eb, ea)
        out = pc.if_else(pc.is_null(ea), eb, pc.if_else(pc.is_null(eb), ea, out))
        if t in _FLOATS:
            nan = pc.or_kleene(pc.coalesce(pc.is_nan(ea), pc.scalar(False)),
                               pc.coalesce(pc.is_nan(eb), pc.scalar(False)))
            out = pc.if_else(nan, pc.scalar(pa.scalar(math.nan, t)), out)
        return _Val(_null_sentinel(out, t), t)

    def method(self, node: _Node, name: str, recv: _Val, args: tuple) -> _Val:
        """Java String methods; a null receiver fails the evaluation, as in Deephaven."""
        if _kind(recv.type) != "str":
            self.fail(node, f"method {name}() of {'null' if recv.type == 'null' else recv.type} is not supported")
        arity = _METHODS.get(name)
        if arity is None:
            self.fail(node, f"method {name}() is not supported (supported: {', '.join(sorted(_METHODS))})")
        counts = arity if isinstance(arity, tuple) else (arity,)
        if len(args) not in counts:
            self.fail(node, f"{name}() takes {' or '.join(map(str, counts))} argument(s), not {len(args)}")
        vals = [self.build(x) for x in args]
        s = recv.expr
        if name == "substring":
            bounds = []
            for v in vals:
                if not (v.is_lit and v.type in (pa.int32(), pa.int64()) and 0 <= v.lit < 2 ** 31):
                    self.fail(node, "substring() needs non-negative integer literals")
                bounds.append(int(v.lit))
        elif vals:
            v = vals[0]
            if not (v.is_lit and v.type == pa.string()):
                self.fail(node, f"{name}() needs a string literal argument")
            arg = v.lit
        if name == "length":
            n = pc.add(pc.utf8_length(s), pc.count_substring_regex(s, pattern=_ASTRAL).cast(pa.int32()))
            out = _Val(n.cast(pa.int32()), pa.int32())
        elif name in ("toUpperCase", "toLowerCase"):
            upper = name == "toUpperCase"
            special = _UPPER_SPECIAL if upper else _LOWER_SPECIAL
            out = self.raising(_Val(pc.utf8_upper(s) if upper else pc.utf8_lower(s), pa.string()),
                               pc.match_substring_regex(s, pattern=special),
                               f"{name}() of a string with characters whose Java case mapping differs from a "
                               "one-to-one mapping is not supported")
        elif name == "trim":
            out = _Val(pc.utf8_trim(s, characters=_JAVA_TRIM), pa.string())
        elif name == "isEmpty":
            out = _Val(pc.equal(pc.binary_length(s), pc.scalar(0)), pa.bool_(), pred=True)
        elif name == "contains":
            out = _Val(pc.match_substring(s, pattern=arg), pa.bool_(), pred=True)
        elif name == "startsWith":
            out = _Val(pc.starts_with(s, pattern=arg), pa.bool_(), pred=True)
        elif name == "endsWith":
            out = _Val(pc.ends_with(s, pattern=arg), pa.bool_(), pred=True)
        elif name == "equals":
            out = _Val(pc.equal(s, pc.scalar(arg)), pa.bool_(), pred=True)
        elif name == "equalsIgnoreCase":
            out = _Val(pc.equal(_fold_case(s), _fold_case(pc.scalar(arg))), pa.bool_(), pred=True)
        elif name == "matches":
            try:
                pattern = java_regex(arg, dotall=False, ignore_case=False)
            except ExpressionError as exc:
                self.fail(node, str(exc))
            out = _Val(pc.match_substring_regex(s, pattern=pattern), pa.bool_(), pred=True)
        else:  # substring
            begin = bounds[0]
            end = bounds[1] if len(bounds) > 1 else None
            n = pc.utf8_length(s)
            bad = pc.less(n, pc.scalar(begin if end is None else max(begin, end)))
            if end is not None and end < begin:
                bad = pc.is_valid(s)
            out = self.raising(_Val(pc.utf8_slice_codeunits(s, start=begin, stop=end), pa.string()), bad,
                               f"StringIndexOutOfBoundsException: substring({', '.join(map(str, bounds))}) of a "
                               "shorter string")
            out = self.raising(out, pc.match_substring_regex(s, pattern=_ASTRAL),
                               "substring() of a string with characters outside the Basic Multilingual Plane is "
                               "not supported")
        return self.raising(out, pc.is_null(s), f"NullPointerException: {name}() of a null string")

    def arithmetic(self, node: _Node, op: str, a: _Val, b: _Val) -> _Val:
        if "ts" in (_kind(a.type), _kind(b.type)):
            return self.instant_arithmetic(node, op, a, b)
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


    def instant_arithmetic(self, node: _Node, op: str, a: _Val, b: _Val) -> _Val:
        """Deephaven's DateTimeUtils.plus and minus: instant + or - integer nanoseconds is an instant,
        instant - instant the long nanoseconds between them; null if either side is null. An
        instant result from 2262-04-11T23:47:16Z on fails the evaluation (Deephaven's
        DateTimeOverflowException), one below the long range wraps around (Deephaven's conversion to
        long nanoseconds does); the minimum long is null. A difference beyond the long range fails."""
        if _kind(a.type) != "ts" or op not in ("+", "-"):
            what = "null" if b.type == "null" else str(b.type)
            self.fail(node, f"'{op}' of {'null' if a.type == 'null' else a.type} and {what} is not supported "
                            "(instant + or - integer nanoseconds, and instant - instant, are)")
        ea = _ts_nanos(a)
        zero, limit = pc.scalar(pa.scalar(0, pa.int64())), pc.scalar(pa.scalar(INSTANT_LIMIT, pa.int64()))
        if _kind(b.type) == "ts":
            if op != "-":
                self.fail(node, "'+' of two instants is not supported (instant - instant is the nanoseconds between)")
            eb = _ts_nanos(b)
            r = pc.subtract(ea, eb)  # wraps around; the overflow is found below
            over = pc.or_kleene(pc.and_kleene(pc.less(eb, zero), pc.less(r, ea)),
                                pc.and_kleene(pc.greater(eb, zero), pc.greater(r, ea)))
            over = pc.or_kleene(over, pc.or_kleene(pc.greater_equal(ea, limit), pc.greater_equal(eb, limit)))
            return self.raising(_Val(_null_sentinel(r, pa.int64()), pa.int64()), over,
                                "DateTimeOverflowException: the difference of two instants is beyond the long range")
        if b.type not in (*_INTS, _CHAR):
            what = "null" if b.type == "null" else str(b.type)
            self.fail(node, f"'{op}' of an instant and {what} is not supported (only integer nanoseconds)")
        eb = _as(b, pa.int64())
        r = (pc.add if op == "+" else pc.subtract)(ea, eb)  # wraps around; the overflow is found below
        up, down = pc.greater(eb, zero), pc.less(eb, zero)
        if op == "-":
            up, down = down, up
        past_max = pc.and_kleene(up, pc.less(r, ea))
        below_min = pc.and_kleene(down, pc.greater(r, ea))
        bad = pc.or_kleene(past_max, pc.and_kleene(pc.invert(below_min), pc.greater_equal(r, limit)))
        return self.raising(_Val(_null_sentinel(r, pa.int64()).cast(_TS), _TS), bad,
                            "DateTimeOverflowException: an instant from 2262-04-11T23:47:16Z on")


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


def _build_predicate(text: str, schema: pa.Schema, tokens=None, clock: Optional[Clock] = None,
                     reach=None) -> pc.Expression:
    tree = _Parser(text, tokens).parse()
    b = _Builder(schema, text, signed_zeros=not _range_form(tokens or _tokenize(text)), clock=clock)
    b.reach = reach
    v = b.build(tree)
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
    if t == _CHAR:
        if tok.kind == "sq" and len(tok.text) == 1 and ord(tok.text) < 0xFFFF and not neg:
            return ord(tok.text)
        raise ExpressionError(f"type mismatch at position {tok.pos}: {tok.text!r} is not a char literal ('A') for "
                              f"column {col!r} in {text!r}")
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


def parse_filters(texts: list[str], schema: pa.Schema, clock: Optional[Clock] = None) -> pc.Expression:
    """The filters of one where call, as one never-null boolean expression: as in Deephaven, each
    filter is evaluated only on the rows the filters before it kept (so `["!isNull(S)",
    "S.length() > 3"]` never fails on a null S)."""
    out, kept = None, None
    for text in texts:
        e = parse_filter(text, schema, clock, reach=kept)
        out = e if out is None else pc.and_kleene(out, e)
        kept = out
    return pc.scalar(True) if out is None else out


def parse_filter(text: str, schema: pa.Schema, clock: Optional[Clock] = None, reach=None) -> pc.Expression:
    """A Deephaven filter string -> a never-null boolean expression. `clock` is what now() and
    today() read (the engine's clock; the system clock when None); `reach` the rows the filter is
    evaluated on (None: all), where a failing method call fails."""
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
    return _build_predicate(text, schema, toks, clock, reach)


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


def parse_column_spec(spec: str, schema: pa.Schema, clock: Optional[Clock] = None
                      ) -> tuple[str, Optional[pc.Expression], Optional[str]]:
    """A View/Select column spec -> (output name, expression, source column).

    ``"A"`` -> ("A", None, "A"); ``"B = A"`` -> ("B", None, "A") (a rename); ``"C = A * 2"`` ->
    ("C", expression, None)."""
    _name, _v, out = _column_spec(spec, schema, {}, clock)
    return out


def _column_spec(spec: str, schema: pa.Schema, made: dict, clock: Optional[Clock]):
    """(name, its value for later formulas, (name, expression, source column))"""
    if len(spec) > MAX_LENGTH:
        raise ExpressionError(f"column spec too long ({len(spec)} characters, at most {MAX_LENGTH})")
    text = spec.strip()
    m = re.match(r"^([A-Za-z_$][A-Za-z_0-9$]*)\s*(?:=(?!=)\s*(.*))?$", text, re.S)
    if not m:
        raise ExpressionError(f"cannot parse column spec {spec!r}: expected NAME or NAME = FORMULA")
    name, formula = m.group(1), m.group(2)
    source = name if formula is None else formula.strip()
    if formula is not None and not source:
        raise ExpressionError(f"cannot parse column spec {spec!r}: expected a formula after '='")
    if re.fullmatch(r"[A-Za-z_$][A-Za-z_0-9$]*", source) and source not in ("true", "false", "null") \
            and (source in made or source in schema.names or source not in TIME_CONSTANTS):
        if source in made:
            v = made[source]
            return name, v, (name, v.expr, None)
        if source not in schema.names:
            if source in ("i", "ii", "k"):
                raise ExpressionError(f"the row position variable {source!r} is not supported in {spec!r}")
            if formula is None:
                raise ExpressionError(f"unknown column {name!r} (columns: {', '.join(schema.names)})")
            raise ExpressionError(f"unknown column {source!r} in {spec!r}")
        v = _Builder(schema, source).column(_Node("col", 0, value=source))
        return name, v, (name, None, source)
    tree = _Parser(source).parse()
    v = _Builder(schema, source, made=made, clock=clock).build(tree)
    if v.type == "null":
        raise ExpressionError(f"a formula of only null has no type in {spec!r}")
    if v.is_lit and v.type == _TS and v.lit >= INSTANT_LIMIT:
        raise ExpressionError(f"the instant of {spec!r} is beyond what a column holds (before 2262-04-11T23:47:16Z)")
    return name, v, (name, v.expr, None)


def parse_column_specs(specs: list[str], schema: pa.Schema, clock: Optional[Clock] = None
                       ) -> list[tuple[str, Optional[pc.Expression], Optional[str]]]:
    """The column specs of one View/Select/Update call, each as `parse_column_spec` gives it.

    As in Deephaven, a formula sees the columns made by the specs before it (with their types),
    and a spec that makes a column again replaces it for the specs after it; such a column is
    given once, where it was first made, with its last formula. The expressions read only the
    source table's columns (an earlier formula is written into the later ones). `clock` is what
    now() and today() read (the engine's clock; the system clock when None)."""
    made: dict[str, _Val] = {}
    out: dict[str, tuple[str, Optional[pc.Expression], Optional[str]]] = {}
    for spec in specs:
        name, v, entry = _column_spec(spec, schema, made, clock)
        made[name] = v
        out[name] = entry
    return list(out.values())


def string_method(column: str, method: str, args: list, schema: pa.Schema, reach=None) -> pc.Expression:
    """`column.method(args...)` with string literal arguments, as a formula computes it (a null
    receiver fails the evaluation where `reach`, the rows the call is evaluated on, holds; None
    for every row). The result must be a boolean."""
    text = f"{column}.{method}(" + ", ".join("`" + str(a) + "`" for a in args) + ")"
    b = _Builder(schema, text)
    b.reach = reach
    recv = b.column(_Node("col", 0, value=column))
    nodes = tuple(_Node("lit", 0, op="value", value=a, vtype=pa.string()) for a in args)  # values, not source
    v = b.method(_Node("call", 0, value=method), method, recv, nodes)
    if v.type != pa.bool_():
        raise ExpressionError(f"{text} is not a condition (its value is of type {v.type})")
    return v.expr
