"""update_by recomputed from scratch, in plain Python, for the tests that check tickwire's
incremental update_by (tests/convergence.py's updateby-* configurations).

`update_by(rows, ops, by)` takes a table's rows (dicts, in row order) and returns, for each
output column of `ops` (`Op`s), its value on every row. Rows are bucketed by the `by` columns
(nulls a bucket of their own), and each operation runs over each bucket's rows in row order with
Deephaven's definitions (its UpdateBy operators, 42.x):

- cumulative: cum_sum / cum_prod (nulls skipped; null until the first value; integers in 64-bit
  arithmetic that wraps), cum_min / cum_max (nulls skipped; a NaN is never below or above
  anything, so it is kept only when it is the first value), forward_fill (the last non-null value;
  NaN is a value), delta (this value minus the previous row's; a null on either side gives null,
  except that on the bucket's first row or after a null `value_dominates` gives the value and
  `zero_dominates` 0).
- exponential, over ticks (a = exp(-1/ticks)) or a time column (a = exp(-dt/decay), dt the
  time since the last value taken): null and NaN values are skipped (the output stays), as are
  rows without a time; the first value starts (ema, ems, em_min, em_max: the value, null before
  it; em_std: NaN, and NaN before it too); then ema = a*prev + (1-a)*x, ems = a*prev + x,
  em_min = min(a*prev, x), em_max = max(a*prev, x), and em_std = sqrt(var) with
  var = a*(var + (1-a)*(x - ema)**2) and the ema moving as above. With a time column a value at
  the same time as the last one taken (dt = 0) is skipped, except by em_std and for integer inputs,
  where it applies with a = 1 (so that a tie on em_std's second value gives 0.0, after an infinity
  0 * inf gives NaN, and ems of integers adds the value).
- rolling, over a window of the bucket's rows: by ticks the `rev`-1 rows before the row to `fwd`
  rows after it; by time the rows whose stamp is in [t - rev, t + fwd] (rows without a stamp are
  in no window and get null). rolling_sum and rolling_prod (null when the window holds no
  value), rolling_avg (the sum over the count of values; null without one), rolling_min and
  rolling_max (null without a value), rolling_count (the values that are not null), rolling_std
  (the sample deviation; NaN with one value, null with none, NaN when a value is NaN or
  infinite or the sum of squares is; 0 when the spread is within one ulp of the sum of squares).

Time columns are read as int64 nanoseconds. `close(got, want)` compares two results: nulls,
NaN and infinities exactly, integers exactly, other floats within a relative 1e-9.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

__all__ = ["Op", "update_by", "close", "REL_TOL", "CUMULATIVE", "EXPONENTIAL", "ROLLING"]

REL_TOL = 1e-9
CUMULATIVE = ("cum_sum", "cum_prod", "cum_min", "cum_max", "forward_fill", "delta")
EXPONENTIAL = ("ema", "ems", "em_min", "em_max", "em_std")
ROLLING = ("rolling_sum", "rolling_prod", "rolling_avg", "rolling_min", "rolling_max", "rolling_count",
           "rolling_std")


@dataclass(frozen=True)
class Op:
    """One operation: `kind` (CUMULATIVE, EXPONENTIAL or ROLLING) over `pairs` ((output, input)
    columns). Exponential kinds decay over `ticks` rows, or `decay` nanoseconds of `time_col`;
    rolling kinds look `rev` back and `fwd` ahead, in ticks or (with `time_col`) nanoseconds.
    `delta`: null_dominates, value_dominates or zero_dominates."""

    kind: str
    pairs: tuple[tuple[str, str], ...]
    ticks: float = 0.0
    decay: int = 0
    time_col: Optional[str] = None
    rev: int = 0
    fwd: int = 0
    delta: str = "null_dominates"


def _wrap(v: int) -> int:
    """A 64-bit signed integer's value after overflow (Java's long arithmetic)."""
    return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def _bad(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


# -- cumulative ---------------------------------------------------------------------------------------------

def _cumulative(kind: str, xs: list, delta: str) -> list:
    out: list = []
    cur: Any = None
    last: Any = None  # delta: the previous row's value
    for x in xs:
        if kind == "cum_sum" or kind == "cum_prod":
            if x is not None:
                if cur is None:
                    cur = x
                elif kind == "cum_sum":
                    cur = _wrap(cur + x) if isinstance(x, int) else cur + x
                else:
                    cur = _wrap(cur * x) if isinstance(x, int) else cur * x
        elif kind == "cum_min" or kind == "cum_max":
            if cur is None:
                cur = x
            elif x is not None and ((kind == "cum_max" and x > cur) or (kind == "cum_min" and x < cur)):
                cur = x
        elif kind == "forward_fill":
            if x is not None:
                cur = x
        elif kind == "delta":
            if x is None:
                cur = None
            elif last is None:
                zero = 0 if isinstance(x, int) else 0.0
                cur = None if delta == "null_dominates" else (zero if delta == "zero_dominates" else x)
            else:
                cur = _wrap(x - last) if isinstance(x, int) else x - last
            last = x
        else:
            raise ValueError(f"not a cumulative kind: {kind}")
        out.append(cur)
    return out


# -- exponential --------------------------------------------------------------------------------------------

def _exponential(op: Op, xs: list, ts: Optional[list]) -> list:
    out: list = []
    cur: Optional[float] = math.nan if op.kind == "em_std" else None  # the output (em_std: the deviation)
    ema: Optional[float] = None  # em_std's moving average
    var = 0.0
    last_t: Optional[int] = None
    tick_a = math.exp(-1.0 / op.ticks) if ts is None else 0.0
    for i, x in enumerate(xs):
        if _bad(x) or (ts is not None and ts[i] is None):
            out.append(cur)
            continue
        integral = isinstance(x, int)
        x = float(x)
        started = (ema if op.kind == "em_std" else cur) is not None
        if not started:
            if op.kind == "em_std":
                ema, var, cur = x, 0.0, math.nan
            else:
                cur = x
            last_t = ts[i] if ts is not None else None
            out.append(cur)
            continue
        if ts is None:
            a = tick_a
        else:
            assert last_t is not None
            dt = ts[i] - last_t
            if dt < 0:
                raise ValueError(f"time goes back from {last_t} to {ts[i]}")
            if dt == 0 and op.kind != "em_std" and not integral:
                out.append(cur)
                continue
            a = math.exp(-dt / op.decay)
            last_t = ts[i]
        assert cur is not None
        if op.kind == "ema":
            cur = cur * a + (1.0 - a) * x
        elif op.kind == "ems":
            cur = cur * a + x
        elif op.kind == "em_min":
            cur = _java_min(cur * a, x)
        elif op.kind == "em_max":
            cur = _java_max(cur * a, x)
        elif op.kind == "em_std":
            assert ema is not None
            var = a * (var + (1.0 - a) * (x - ema) ** 2)
            ema = ema * a + (1.0 - a) * x
            cur = math.sqrt(var) if not math.isnan(var) else math.nan
        else:
            raise ValueError(f"not an exponential kind: {op.kind}")
        out.append(cur)
    return out


def _java_min(a: float, b: float) -> float:
    """Math.min: NaN when either is NaN."""
    return math.nan if math.isnan(a) or math.isnan(b) else min(a, b)


def _java_max(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


# -- rolling ------------------------------------------------------------------------------------------------

def _window_value(kind: str, vals: list) -> Any:
    """The rolling `kind` of the values of one window (nulls included, as they come)."""
    have = [v for v in vals if v is not None]
    if kind == "rolling_count":
        return len(have)
    if not have:
        return None
    ints = all(isinstance(v, int) for v in have)
    if kind == "rolling_sum":
        return _wrap(sum(have)) if ints else math.fsum(have) if all(math.isfinite(v) for v in have) else sum(have)
    if kind == "rolling_prod":
        p: Any = 1 if ints else 1.0
        for v in have:
            p = _wrap(p * v) if ints else p * v
        return p
    if kind == "rolling_avg":
        total = sum(have) if ints else (math.fsum(have) if all(math.isfinite(v) for v in have) else sum(have))
        return total / len(have)
    if kind == "rolling_min" or kind == "rolling_max":
        return min(have) if kind == "rolling_min" else max(have)
    if kind == "rolling_std":
        if len(have) == 1:
            return math.nan
        f = [float(v) for v in have]
        if not all(math.isfinite(v) for v in f):
            return math.nan
        squares = [v * v for v in f]
        s2 = math.fsum(squares) if all(math.isfinite(v) for v in squares) else math.inf
        if not math.isfinite(s2):
            return math.nan  # as Deephaven: a sum of squares too large for a double
        mean = math.fsum(f) / len(f)
        delta = math.fsum((v - mean) ** 2 for v in f)
        if delta <= math.ulp(s2):
            return 0.0  # as Deephaven: a spread within the rounding of the sum of squares is none
        return math.sqrt(delta / (len(f) - 1))
    raise ValueError(f"not a rolling kind: {kind}")


def _rolling(op: Op, xs: list, ts: Optional[list]) -> list:
    n = len(xs)
    out: list = []
    if ts is None:
        for i in range(n):
            lo, hi = max(0, i - op.rev + 1), min(n, i + op.fwd + 1)
            out.append(_window_value(op.kind, xs[lo:hi]) if lo < hi else
                       (0 if op.kind == "rolling_count" else None))
        return out
    stamped = [i for i in range(n) if ts[i] is not None]
    stamps = [ts[i] for i in stamped]
    if any(b < a for a, b in zip(stamps, stamps[1:])):
        raise ValueError("time goes back within a bucket")
    for i in range(n):
        if ts[i] is None:
            out.append(None)
            continue
        lo = bisect.bisect_left(stamps, ts[i] - op.rev)
        hi = bisect.bisect_right(stamps, ts[i] + op.fwd)
        vals = [xs[stamped[j]] for j in range(lo, hi)]
        out.append(_window_value(op.kind, vals) if vals else (0 if op.kind == "rolling_count" else None))
    return out


# -- the table ----------------------------------------------------------------------------------------------

def _key(v: Any) -> Any:
    """A bucket key part: NaN equal to NaN, -0.0 to 0.0."""
    if isinstance(v, float):
        return "NaN" if math.isnan(v) else v + 0.0
    return v


def update_by(rows: Sequence[dict], ops: Sequence[Op], by: Sequence[str] = ()) -> dict[str, list]:
    """Every output column of `ops` over `rows` (dicts in row order) bucketed by `by`: the column's
    value on each row, in row order."""
    buckets: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        buckets.setdefault(tuple(_key(r[c]) for c in by), []).append(i)
    out: dict[str, list] = {}
    for op in ops:
        for name, _col in op.pairs:
            out[name] = [None] * len(rows)
        for idx in buckets.values():
            ts = [rows[i][op.time_col] for i in idx] if op.time_col is not None else None
            for name, col in op.pairs:
                xs = [rows[i][col] for i in idx]
                if op.kind in CUMULATIVE:
                    res = _cumulative(op.kind, xs, op.delta)
                elif op.kind in EXPONENTIAL:
                    res = _exponential(op, xs, ts)
                elif op.kind in ROLLING:
                    res = _rolling(op, xs, ts)
                else:
                    raise ValueError(f"unknown kind {op.kind!r}")
                col_out = out[name]
                for i, v in zip(idx, res):
                    col_out[i] = v
    return out


def close(got: Any, want: Any, abs_tol: float = 0.0) -> bool:
    """The same result: nulls, NaN, infinities and integers exactly, other floats within REL_TOL
    (or `abs_tol`: for a result that cancels to zero, such as em_std of equal values, where the
    order of roundings leaves a few ulps of the values)."""
    if got is None or want is None:
        return got is None and want is None
    if isinstance(got, bool) or isinstance(want, bool) or isinstance(got, str) or isinstance(want, str):
        return bool(got == want) and type(got) is type(want)
    if isinstance(got, int) and isinstance(want, int):
        return got == want
    g, w = float(got), float(want)
    if math.isnan(g) or math.isnan(w):
        return math.isnan(g) and math.isnan(w)
    if math.isinf(g) or math.isinf(w):
        return g == w
    return math.isclose(g, w, rel_tol=REL_TOL, abs_tol=abs_tol)
