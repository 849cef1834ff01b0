"""The SQL tickwire's Flight SQL serves: a parser for one SELECT over one table, into a plan the
Flight SQL service turns into table operations (server/services/flight_sql.py).

Served, with the answers Deephaven's Flight SQL gives for the same text:

    SELECT item [, item ...] [FROM table [[AS] alias] [WHERE condition]]

- an item is `*`, `table.*`, a column (`A`, `t.A`, `"A"`) or, without FROM, a literal: an integer
  (`int` when it fits 32 bits, else `long`; the smallest of each is null, as Deephaven reads it),
  an approximate number (`2.5e0`, a `double`), a string (`'it''s'`; one character is a `char`),
  `TRUE` or `FALSE`; each with an optional `[AS] alias`. Unnamed literals are `EXPR$<position>`;
  a name used twice gets a number (`A`, `A0`, `A1`, ...).
- a condition combines comparisons (`=`, `<>`, `!=`, `<`, `<=`, `>`, `>=`) of columns and
  literals, `IS [NOT] NULL`, `TRUE` and `FALSE` with AND, OR, NOT and parentheses. It is
  evaluated as Deephaven's filters are: null is below every value, and `<>` keeps null rows.
- unquoted names keep their case (`a` is not `A`); keywords are any case.

Everything else SQL has (expressions, functions, aggregation, ORDER BY, LIMIT, joins, subqueries,
set operations, parameters) is refused with `SqlError`, whose message names the construct; text
that is not SQL at all is refused as Deephaven does ("query can't be parsed").

Pure: no engine, no I/O."""
from __future__ import annotations

import dataclasses
import re
from typing import Optional, Union

__all__ = ["SqlError", "parse_select", "Select", "Star", "ColumnItem", "LiteralItem", "Literal", "Column",
           "Compare", "IsNull", "BoolOp", "Not", "Condition", "INT_MIN", "LONG_MIN"]

INT_MIN = -(1 << 31)
LONG_MIN = -(1 << 63)


class SqlError(ValueError):
    """A query tickwire does not serve; `code` is the gRPC status name to answer with."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT"):
        super().__init__(message)
        self.code = code


@dataclasses.dataclass(frozen=True)
class Literal:
    """`kind` is "int", "long", "double", "string", "char" or "bool"; a null int or long is None."""
    kind: str
    value: object


@dataclasses.dataclass(frozen=True)
class Column:
    name: str
    qualifier: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Star:
    qualifier: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ColumnItem:
    column: Column
    alias: Optional[str]


@dataclasses.dataclass(frozen=True)
class LiteralItem:
    literal: Literal
    alias: Optional[str]
    position: int  # in the select list, for its EXPR$<position> name


@dataclasses.dataclass(frozen=True)
class Compare:
    op: str  # "==", "!=", "<", "<=", ">", ">="
    left: Union[Column, Literal]
    right: Union[Column, Literal]


@dataclasses.dataclass(frozen=True)
class IsNull:
    column: Column
    negated: bool


@dataclasses.dataclass(frozen=True)
class BoolOp:
    op: str  # "and" or "or"
    parts: tuple


@dataclasses.dataclass(frozen=True)
class Not:
    part: object


Condition = Union[Compare, IsNull, BoolOp, Not, Literal]


@dataclasses.dataclass(frozen=True)
class Select:
    items: tuple  # of Star, ColumnItem, LiteralItem
    table: Optional[str]
    alias: Optional[str]
    where: Optional[Condition]


_TOKEN = re.compile(r"""
    (?P<ws>\s+|--[^\n]*)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*")
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op><>|!=|<=|>=|\|\||[=<>(),.*+\-/?;%])
""", re.X)

#: words the served grammar reads
_KEYWORDS = {"SELECT", "FROM", "WHERE", "AS", "AND", "OR", "NOT", "IS", "NULL", "TRUE", "FALSE"}
#: SQL words that start a construct tickwire refuses, named in the refusal
_REFUSED = {
    "GROUP": "GROUP BY (aggregation)", "HAVING": "HAVING (aggregation)", "ORDER": "ORDER BY",
    "LIMIT": "LIMIT", "OFFSET": "OFFSET", "FETCH": "FETCH", "JOIN": "joins", "INNER": "joins",
    "LEFT": "joins", "RIGHT": "joins", "FULL": "joins", "CROSS": "joins", "NATURAL": "joins",
    "UNION": "set operations (UNION)", "INTERSECT": "set operations (INTERSECT)",
    "EXCEPT": "set operations (EXCEPT)", "MINUS": "set operations (MINUS)", "DISTINCT": "SELECT DISTINCT",
    "ALL": "SELECT ALL", "WITH": "WITH (common table expressions)", "VALUES": "VALUES",
    "CASE": "CASE expressions", "CAST": "CAST", "IN": "IN lists", "BETWEEN": "BETWEEN", "LIKE": "LIKE",
    "EXISTS": "EXISTS", "INTERVAL": "INTERVAL literals", "TIMESTAMP": "TIMESTAMP literals",
    "DATE": "DATE literals", "TIME": "TIME literals", "WINDOW": "WINDOW", "OVER": "window functions",
    "INSERT": "INSERT (Flight SQL here is read-only)", "UPDATE": "UPDATE (Flight SQL here is read-only)",
    "DELETE": "DELETE (Flight SQL here is read-only)", "CREATE": "CREATE (Flight SQL here is read-only)",
    "DROP": "DROP (Flight SQL here is read-only)", "EXPLAIN": "EXPLAIN", "TABLESAMPLE": "TABLESAMPLE",
    "UNNEST": "UNNEST", "LATERAL": "LATERAL",
}
_SERVED = ("tickwire serves SELECT of columns and literals from one table, with a WHERE of comparisons, "
           "IS NULL, AND, OR and NOT")
_COMPARISONS = {"=": "==", "<>": "!=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


@dataclasses.dataclass(frozen=True)
class _Tok:
    kind: str  # "string", "quoted", "number", "name", "op", "end"
    text: str
    pos: int

    @property
    def word(self) -> str:
        return self.text.upper() if self.kind == "name" else ""


def _tokens(sql: str) -> list[_Tok]:
    out, pos = [], 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise SqlError("query can't be parsed")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    out.append(_Tok("end", "", len(sql)))
    return out


def _refuse(what: str) -> SqlError:
    return SqlError(f"{what} is not served: {_SERVED}")


class _Parser:
    def __init__(self, sql: str):
        self.toks = _tokens(sql)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def peek(self, ahead: int) -> _Tok:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def next(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def accept_word(self, word: str) -> bool:
        if self.tok.word == word:
            self.i += 1
            return True
        return False

    def accept_op(self, op: str) -> bool:
        if self.tok.kind == "op" and self.tok.text == op:
            self.i += 1
            return True
        return False

    def fail(self) -> SqlError:
        """The current token cannot go here: a construct tickwire refuses, or not SQL."""
        t = self.tok
        if t.word in _REFUSED:
            return _refuse(_REFUSED[t.word])
        if t.kind == "op" and t.text == "?":
            return SqlError("Illegal use of dynamic parameter")  # as Deephaven words it
        if t.kind == "op" and t.text in ("+", "-", "*", "/", "%", "||"):
            return _refuse(f"the operator {t.text!r} (expressions)")
        if t.kind == "op" and t.text == "(":
            return _refuse("a subquery or parenthesised expression")
        return SqlError("query can't be parsed")

    # -- names -----------------------------------------------------------------------------------
    def name(self) -> Optional[str]:
        """An identifier (unquoted, not a keyword, or "quoted"), or None."""
        t = self.tok
        if t.kind == "quoted":
            self.i += 1
            return t.text[1:-1].replace('""', '"')
        if t.kind == "name" and t.word not in _KEYWORDS and t.word not in _REFUSED:
            self.i += 1
            return t.text
        return None

    def alias(self) -> Optional[str]:
        if self.accept_word("AS"):
            a = self.name()
            if a is None:
                raise self.fail()
            return a
        return self.name()

    # -- values ------------------------------------------------------------------------------------
    def literal(self) -> Optional[Literal]:
        t = self.tok
        if t.kind == "op" and t.text == "-" and self.peek(1).kind == "number":
            self.i += 1
            return _number("-" + self.next().text)
        if t.kind == "number":
            self.i += 1
            return _number(t.text)
        if t.kind == "string":
            self.i += 1
            s = t.text[1:-1].replace("''", "'")
            return Literal("char", s) if len(s) == 1 else Literal("string", s)
        if t.word in ("TRUE", "FALSE"):
            self.i += 1
            return Literal("bool", t.word == "TRUE")
        if t.word == "NULL":
            raise _refuse("a NULL literal (Deephaven cannot type it; compare with IS NULL)")
        return None

    def column(self) -> Optional[Column]:
        first = self.name()
        if first is None:
            return None
        if self.tok.kind == "op" and self.tok.text == "(":
            raise _refuse(f"the function {first}(...)")
        if self.accept_op("."):
            second = self.name()
            if second is None:
                raise self.fail()
            return Column(second, first)
        return Column(first)

    def operand(self) -> Union[Column, Literal]:
        lit = self.literal()
        if lit is not None:
            return lit
        col = self.column()
        if col is None:
            raise self.fail()
        return col

    # -- the select list -----------------------------------------------------------------------------
    def item(self, position: int):
        if self.accept_op("*"):
            return Star()
        t0, t1, t2 = self.tok, self.peek(1), self.peek(2)
        if t0.kind in ("name", "quoted") and t1.text == "." and t2.text == "*" and t2.kind == "op":
            qualifier = self.name()
            self.i += 2
            return Star(qualifier)
        lit = self.literal()
        if lit is not None:
            self.refuse_operator()
            return LiteralItem(lit, self.alias(), position)
        col = self.column()
        if col is None:
            raise self.fail()
        self.refuse_operator()
        return ColumnItem(col, self.alias())

    def refuse_operator(self) -> None:
        t = self.tok
        if t.kind == "op" and t.text in ("+", "-", "*", "/", "%", "||"):
            raise _refuse(f"the operator {t.text!r} (expressions)")

    # -- conditions -----------------------------------------------------------------------------------
    def condition(self):
        parts = [self.conjunction()]
        while self.accept_word("OR"):
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else BoolOp("or", tuple(parts))

    def conjunction(self):
        parts = [self.negation()]
        while self.accept_word("AND"):
            parts.append(self.negation())
        return parts[0] if len(parts) == 1 else BoolOp("and", tuple(parts))

    def negation(self):
        if self.accept_word("NOT"):
            return Not(self.negation())
        return self.primary()

    def primary(self):
        if self.accept_op("("):
            if self.tok.word == "SELECT":
                raise _refuse("a subquery")
            inner = self.condition()
            if not self.accept_op(")"):
                raise self.fail()
            return inner
        left = self.operand()
        if self.accept_word("IS"):
            negated = self.accept_word("NOT")
            if not self.accept_word("NULL"):
                raise self.fail() if self.tok.word in _REFUSED else _refuse("IS other than IS [NOT] NULL")
            if not isinstance(left, Column):
                raise _refuse("IS NULL of a literal")
            return IsNull(left, negated)
        t = self.tok
        if t.kind == "op" and t.text in _COMPARISONS:
            self.i += 1
            right = self.operand()
            self.refuse_operator()
            if isinstance(left, Literal) and isinstance(right, Literal):
                raise _refuse("a comparison of two literals")
            op = _COMPARISONS[t.text]
            if isinstance(left, Literal):  # literal op column: the column first
                left, right, op = right, left, _FLIP[op]
            return Compare(op, left, right)
        self.refuse_operator()
        if isinstance(left, Literal) and left.kind == "bool":
            return left
        raise self.fail()

    # -- the statement ------------------------------------------------------------------------------------
    def select(self) -> Select:
        if not self.accept_word("SELECT"):
            raise self.fail()
        if self.tok.word in ("DISTINCT", "ALL"):
            raise self.fail()
        items = [self.item(0)]
        while self.accept_op(","):
            items.append(self.item(len(items)))
        table = alias = where = None
        if self.accept_word("FROM"):
            if self.accept_op("("):
                raise _refuse("a subquery in FROM")
            table = self.name()
            if table is None:
                raise self.fail()
            if self.accept_op("."):
                raise _refuse("a catalog or schema name (tables here have neither)")
            if self.tok.kind == "op" and self.tok.text == ",":
                raise _refuse("joins")
            alias = self.alias()
            if self.accept_word("WHERE"):
                where = self.condition()
        if self.tok.kind != "end":
            raise self.fail()
        if table is None and any(isinstance(i, (Star, ColumnItem)) for i in items):
            if any(isinstance(i, Star) for i in items):
                raise SqlError("SELECT * requires a FROM clause")
            raise SqlError(f"Column '{next(i for i in items if isinstance(i, ColumnItem)).column.name}' "
                           f"not found in any table", "NOT_FOUND")
        if table is not None and any(isinstance(i, LiteralItem) for i in items):
            raise _refuse("a literal in the select list of a query with FROM")
        return Select(tuple(items), table, alias, where)


def _number(text: str) -> Literal:
    if re.fullmatch(r"-?\d+", text):
        v = int(text)
        if INT_MIN <= v < (1 << 31):
            return Literal("int", None if v == INT_MIN else v)
        if LONG_MIN <= v < (1 << 63):
            return Literal("long", None if v == LONG_MIN else v)
        raise _refuse(f"the integer {text} (beyond 64 bits: a DECIMAL)")
    if "e" in text.lower():
        return Literal("double", float(text))
    raise _refuse(f"the exact decimal {text} (a DECIMAL; write {text}e0 for a double)")


def parse_select(sql: str) -> Select:
    """The plan of `sql`; raises SqlError for what is not served or not SQL."""
    return _Parser(sql).select()
