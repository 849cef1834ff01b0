"""rolling_formula: arithmetic over aggregations of the window, as Deephaven's formulas type it.

A formula such as `max(x) - min(x)` or `sum(x) + 1`, with `x` the parameter standing for the
window's values, is parsed (Python's `ast`, nothing evaluated) into a tree of tuples:

    ("agg", name)           an aggregation of the window: sum, avg, min, max, count, std, prod, median
    ("const", value, jt)    an int/long/double literal
    ("neg", tree)           unary minus
    ("bin", op, a, b)       a + b, a - b, a * b, a / b

Types follow Java's numeric promotion as Deephaven's formula language applies it: byte, short
and int operands compute as int, then long, float, double; `/` always gives double (Deephaven
divides numbers as doubles); an aggregation's own type is that of the matching rolling operation
(sum of integers long, of floats double; min and max the column's type; avg, std and median
double; count long). A null operand makes the result null (Deephaven's null-aware operators).
Integer results wrap as Java's do.

Evaluation is vectorised: each aggregation is a column over all windows (computed by the caller's
`leaf`), combined with numpy. Nothing here reads tables or knows the update graph.
"""
from __future__ import annotations

import ast
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.ops.update_by_kernels import window_count

#: aggregation name -> the rolling kind that computes it ("median" is computed here)
AGGREGATIONS = {"sum": "rolling_sum", "avg": "rolling_avg", "min": "rolling_min", "max": "rolling_max",
                "count": "rolling_count", "std": "rolling_std", "prod": "rolling_prod", "median": "median"}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_RANK = {"int": 0, "long": 1, "float": 2, "double": 3}
_ARROW = {"int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64()}
_NUMPY = {"int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
_INT_MAX = 2**31 - 1
Tree = tuple[Any, ...]  # see the module's docstring


def parse(formula: str, param: str) -> Tree:
    """The tree of `formula` with parameter `param`; OperationError names what is not served."""
    try:
        node = ast.parse(formula.strip(), mode="eval").body
    except SyntaxError as e:
        raise OperationError(f"rolling_formula {formula!r}: not a formula tickwire reads ({e.msg})") from None

    def walk(n: ast.AST) -> Tree:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in AGGREGATIONS \
                and len(n.args) == 1 and not n.keywords and isinstance(n.args[0], ast.Name) \
                and n.args[0].id == param:
            return ("agg", n.func.id)
        if isinstance(n, ast.BinOp) and type(n.op) in _BINOPS:
            return ("bin", _BINOPS[type(n.op)], walk(n.left), walk(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
            inner = walk(n.operand)
            return ("neg", inner) if isinstance(n.op, ast.USub) else inner
        if isinstance(n, ast.Constant) and isinstance(n.value, float):
            return ("const", n.value, "double")
        if isinstance(n, ast.Constant) and isinstance(n.value, int) and not isinstance(n.value, bool):
            return ("const", n.value, "int" if abs(n.value) <= _INT_MAX else "long")
        raise OperationError(
            f"rolling_formula {formula!r}: tickwire serves +, -, *, / of numbers and of "
            f"{', '.join(a + '(' + param + ')' for a in AGGREGATIONS)}; {ast.unparse(n)!r} is none of them")

    return walk(node)


def single(tree: Tree) -> str | None:
    """The aggregation name when the formula is that one aggregation alone, else None."""
    return tree[1] if tree[0] == "agg" else None


def _java(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "long" if t.bit_width == 64 else "int"
    if pa.types.is_floating(t):
        return "float" if t.bit_width == 32 else "double"
    raise OperationError(f"rolling_formula does not take a column of type {t}")


def leaf_type(name: str, t: pa.DataType) -> pa.DataType:
    """The type of aggregation `name` of a column of type `t`."""
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise OperationError(f"rolling_formula with arithmetic takes numbers, not {t}")
    if name == "sum":
        return pa.int64() if pa.types.is_integer(t) else pa.float64()
    if name in ("min", "max"):
        return t
    if name == "count":
        return pa.int64()
    return pa.float64()


def result_type(tree: Tree, t: pa.DataType) -> pa.DataType:
    """The type of the formula's result over a column of type `t`."""
    kind = tree[0]
    if kind == "agg":
        return leaf_type(tree[1], t)
    return _ARROW[_jtype(tree, t)]


def _jtype(tree: Tree, t: pa.DataType) -> str:
    kind = tree[0]
    if kind == "agg":
        return _java(leaf_type(tree[1], t))
    if kind == "const":
        return str(tree[2])
    if kind == "neg":
        return _promote(_jtype(tree[1], t), "int")
    if tree[1] == "/":
        return "double"
    return _promote(_jtype(tree[2], t), _jtype(tree[3], t))


def _promote(a: str, b: str) -> str:
    return a if _RANK[a] >= _RANK[b] else b


def evaluate(tree: Tree, t: pa.DataType, n: int, leaf: Callable[[str], pa.Array]) -> pa.Array:
    """The formula over n windows; `leaf(name)` gives aggregation `name` over them (an Arrow array
    of leaf_type(name, t), null where the window has no value)."""
    cache: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def ev(node: Tree) -> tuple[np.ndarray, np.ndarray, str]:
        kind = node[0]
        if kind == "agg":
            if node[1] not in cache:
                arr = leaf(node[1])
                ok = np.ones(len(arr), dtype=bool) if arr.null_count == 0 else \
                    np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                jt = _java(leaf_type(node[1], t))
                vals = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False)).astype(_NUMPY[jt])
                cache[node[1]] = (vals, ok)
            v, ok = cache[node[1]]
            return v, ok, _java(leaf_type(node[1], t))
        if kind == "const":
            jt = str(node[2])
            return np.full(n, node[1], dtype=_NUMPY[jt]), np.ones(n, dtype=bool), jt
        if kind == "neg":
            v, ok, jt = ev(node[1])
            jt = _promote(jt, "int")
            with np.errstate(over="ignore"):
                return -v.astype(_NUMPY[jt]), ok, jt
        a, aok, at = ev(node[2])
        b, bok, bt = ev(node[3])
        op = node[1]
        jt = "double" if op == "/" else _promote(at, bt)
        x, y = a.astype(_NUMPY[jt]), b.astype(_NUMPY[jt])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            r: Any = x + y if op == "+" else x - y if op == "-" else x * y if op == "*" else x / y
        return np.asarray(r, dtype=_NUMPY[jt]), aok & bok, jt

    v, ok, jt = ev(tree)
    return pa.array(v, mask=None if ok.all() else ~ok, type=_ARROW[jt])


def window_median(x: np.ndarray, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median of the valid x[lo:hi+1] of each window (the mean of the two middle values of an even
    count; NaN when the window holds a NaN, as Deephaven), and whether the window has a value."""
    size = np.maximum(hi - lo + 1, 0)
    total = int(size.sum())
    cnt = window_count(valid, lo, hi)
    out = np.zeros(lo.size, dtype=np.float64)
    if total == 0:
        return out, cnt > 0
    wid = np.repeat(np.arange(lo.size), size)
    idx = np.repeat(lo - (np.cumsum(size) - size), size) + np.arange(total)
    keep = valid[idx]
    wid, vals = wid[keep], x[idx[keep]].astype(np.float64)
    order = np.lexsort((vals, wid))
    vals = vals[order]
    start = np.concatenate(([0], np.cumsum(cnt)[:-1]))
    has = cnt > 0
    a = vals[np.where(has, start + (cnt - 1) // 2, 0)] if vals.size else out
    b = vals[np.where(has, start + cnt // 2, 0)] if vals.size else out
    out = np.where(has, (a + b) / 2.0, 0.0)
    nan = window_count(valid & np.isnan(x.astype(np.float64)), lo, hi) > 0
    return np.where(nan, np.nan, out), has
