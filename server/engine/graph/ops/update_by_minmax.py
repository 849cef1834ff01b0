"""rolling_min / rolling_max of floats as Deephaven 42.7's operator answers them, vectorised.

Deephaven's operator walks a bucket's rows from where a computation starts, keeping a current
value: values entering the window replace it when strictly smaller (min; larger for max), a value
leaving the window that equals it asks for a re-evaluation of the whole window (unless a new
extreme entered in the same step), and a window without values makes it null. A NaN never
compares, so a NaN that becomes the current value (the first value after a null state, or a
re-evaluation over a window holding one) stays until a window without values; rolling_min starts
at MAX_VALUE (not null), and its re-evaluation's identity is MAX_VALUE, so a window of +inf only
answers MAX_VALUE unless +inf came as the first value after a null state.

That walk is a finite automaton over four states per row, whose transitions depend only on the
row's window (not on the state's value, which in the NORMAL state is the window's extreme):

    NULL     no current value (a window without values; rolling_max's start)
    NORMAL   the window's extreme (its sign of zero from the step that set it)
    CLAMPED  MAX_VALUE (rolling_min's start, and a re-evaluation over +inf only)
    STICKY   NaN

Each row's transition is a map of the four states; a run's states are the prefix compositions of
those maps (a doubling scan). Nothing here reads tables.
"""
from __future__ import annotations

import numpy as np

from tickwire.server.engine.graph.ops.update_by_kernels import positions, window_count, window_reduce

NULL, NORMAL, CLAMPED, STICKY = 0, 1, 2, 3


def _compose_runs(T: np.ndarray, pos: np.ndarray) -> None:
    """In place: each row's transition map `T[k]` (states before -> after) becomes the composition
    of the maps of its run up to it (`pos`: each row's position in its run), by doubling."""
    d = 1
    top = int(pos.max())
    while d <= top:
        i = np.flatnonzero(pos >= d)
        T[i] = np.take_along_axis(T[i], T[i - d].astype(np.int64), axis=1)
        d *= 2


def _next_index(flag: np.ndarray) -> np.ndarray:
    """For each i (and len), the smallest index >= i whose flag is set (len when none)."""
    n = flag.size
    idx = np.where(flag, np.arange(n), n)
    out = np.minimum.accumulate(idx[::-1])[::-1] if n else idx
    return np.concatenate((out, [n])).astype(np.int64)


def float_extreme(is_min: bool, x: np.ndarray, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  has: np.ndarray, runs: np.ndarray, max_value: float) -> tuple[np.ndarray, np.ndarray]:
    """(values, not null) of rolling_min (`is_min`) or rolling_max over the windows [lo, hi] of
    the rows x (`valid`: not null and in windows), for output rows in order; `has`: the rows with
    a window; `runs`: each output row's bucket (a bucket's first output row starts the walk)."""
    out = np.zeros(lo.size, dtype=np.float64)
    ok = np.zeros(lo.size, dtype=bool)
    q = np.flatnonzero(has)
    if q.size == 0:
        return out, ok
    isn = valid & np.isnan(x)
    real = valid & ~isn
    uf = np.minimum if is_min else np.maximum
    far = np.inf if is_min else -np.inf
    xr = np.where(real, x, far)
    L, H, R = lo[q], hi[q], runs[q]
    first = np.ones(q.size, dtype=bool)
    first[1:] = R[1:] != R[:-1]
    cnt = window_count(valid, L, H)
    nnan = window_count(isn, L, H)
    m = window_reduce(uf, xr, L, H, far)
    # what left and what entered the window since the row before (a bucket's first row: all entered)
    pa_, pb = np.zeros(q.size, dtype=np.int64), np.zeros(q.size, dtype=np.int64)
    ca, cb = L.copy(), H.copy()
    if q.size > 1:
        pa_[1:] = L[:-1]
        pb[1:] = np.minimum(L[1:], H[:-1] + 1) - 1
        ca[1:] = np.maximum(H[:-1] + 1, L[1:])
    pb[first] = pa_[first] - 1
    ca[first] = L[first]
    popped = window_reduce(uf, xr, pa_, pb, far)
    pushed = window_reduce(uf, xr, ca, cb, far)
    m_prev = np.concatenate(([far], m[:-1]))
    better = (pushed < m_prev) if is_min else (pushed > m_prev)
    evaluate = ~first & (window_count(real, pa_, pb) > 0) & (popped == m_prev) & ~better
    nv = _next_index(valid)
    f = nv[np.minimum(L, nv.size - 1)]
    first_nan = (f <= H) & isn[np.minimum(f, x.size - 1)] if x.size else np.zeros(q.size, dtype=bool)
    below_max = window_count(real & (x < max_value), ca, cb) > 0  # a value that replaces MAX_VALUE
    # each row's transition: T[k, s] = state after row k from state s before it
    T = np.empty((q.size, 4), dtype=np.int8)
    T[:, NULL] = np.where(first_nan, STICKY, NORMAL)
    after_eval = np.where(nnan > 0, STICKY, np.where(is_min & np.isposinf(m), CLAMPED, NORMAL))
    T[:, NORMAL] = np.where(evaluate, after_eval, NORMAL)
    T[:, CLAMPED] = np.where(below_max, NORMAL, CLAMPED)
    T[:, STICKY] = STICKY
    T[cnt == 0, :] = NULL
    # the walk: states are the prefix compositions within each run, from its start state
    pos = positions(np.cumsum(first) - 1)
    _compose_runs(T, pos)
    state = T[:, CLAMPED if is_min else NULL]
    # the sign of a zero extreme: from the step that last set the value
    prev_state = np.concatenate(([NULL], state[:-1]))
    normal = state == NORMAL
    set_here = normal & (first | (prev_state != NORMAL) | evaluate | better)
    zero = real & (x == 0)
    if is_min:
        eval_sign = window_count(zero & np.signbit(x), L, H) > 0  # Math.min(0.0, -0.0) is -0.0
    else:
        eval_sign = ~(window_count(zero & ~np.signbit(x), L, H) > 0)  # Math.max(-0.0, 0.0) is 0.0
    nz = _next_index(zero)
    fz = nz[np.minimum(np.where(first | (prev_state == NULL), L, ca), nz.size - 1)]
    push_sign = np.signbit(x[np.minimum(fz, x.size - 1)]) if x.size else np.zeros(q.size, dtype=bool)
    sign_at = np.where(evaluate & (prev_state == NORMAL), eval_sign, push_sign)
    last = np.maximum.accumulate(np.where(set_here, np.arange(q.size), 0))
    neg = sign_at[last]
    val = np.where(m == 0, np.where(neg, -0.0, 0.0), m)
    res = np.where(state == STICKY, np.nan, np.where(state == CLAMPED, max_value, val))
    out[q] = res
    ok[q] = state != NULL
    return out, ok


# em_min / em_max with a decay of 0: alpha is 0 and Deephaven takes min/max(0.0 * previous, x) row by
# row, so what a row reads of the previous value is one of three: 0.0, -0.0 or NaN (0 * an infinity
# or NaN). A finite automaton over those three classes again, composed by a doubling scan.
PZERO, NZERO, NOTHING = 0, 1, 2
_CLASS_VALUE = np.array([0.0, -0.0, np.nan])


def java_extreme(is_min: bool, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Java's Math.min / Math.max, element-wise: NaN when either is NaN, and -0.0 below 0.0."""
    with np.errstate(invalid="ignore"):
        pick_a = (a < b) if is_min else (a > b)
        tie = np.where(np.signbit(a) == is_min, a, b)  # equal: zeros of two signs, or the same value
        out = np.where(pick_a, a, np.where(a == b, tie, b))
    out = np.where(np.isnan(a) | np.isnan(b), np.nan, out)
    return np.asarray(out, dtype=np.float64)


def _zero_class(y: np.ndarray) -> np.ndarray:
    """The class of 0.0 * y."""
    return np.where(~np.isfinite(y), NOTHING, np.where(np.signbit(y), NZERO, PZERO)).astype(np.int8)


def zero_decay_extreme(is_min: bool, x: np.ndarray, a: np.ndarray, start: np.ndarray, step: np.ndarray,
                       pos: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """em_min (`is_min`) or em_max where every step's alpha is 0 or NaN: y = x at a fresh start,
    min/max(alpha * y before, x) at a step, y unchanged on other rows; per chain (`pos`: each row's
    position in its chain), from the chain's `seed` value (per row) before its first row."""
    n = x.size
    if n == 0:
        return np.zeros(0)
    nan_a = step & np.isnan(a)
    T = np.tile(np.arange(3, dtype=np.int8), (n, 1))  # rows that are neither: the class stays
    for k in range(3):
        yk = java_extreme(is_min, np.full(n, _CLASS_VALUE[k]), x)
        T[step, k] = _zero_class(yk)[step]
    T[nan_a, :] = NOTHING
    T[start, :] = _zero_class(x)[start][:, None]
    _compose_runs(T, pos)
    first = _zero_class(seed)
    before = np.where(pos > 0, T[np.maximum(np.arange(n) - 1, 0), first], first).astype(np.int64)
    before = np.where(nan_a, NOTHING, before)
    y = np.where(start, x, java_extreme(is_min, _CLASS_VALUE[before], x))
    # rows that are neither keep the value of the chain's last row that was
    touched = start | step
    last = np.maximum.accumulate(np.where(touched, np.arange(n), -1))
    chain_start = np.maximum.accumulate(np.where(pos == 0, np.arange(n), 0))
    # a row before its chain's first touched row reads the seed, not an earlier chain's row
    out: np.ndarray = np.where(last >= chain_start, y[np.maximum(last, 0)], seed)
    return out
