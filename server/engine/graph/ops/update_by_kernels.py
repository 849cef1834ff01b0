"""Vectorised kernels of update_by: scans and windows over many buckets at once.

The rows handed to a kernel are *segments*: the rows of one bucket (or its recomputed tail) in row
order, segments one after another; `pos` is each row's position within its segment (0 at its
start). Scans (cumulative and exponential operations) run as a Hillis–Steele prefix scan over the
flat arrays (log2 of the longest segment passes, each a few numpy operations over the rows), so a
thousand one-row tails cost what one thousand-row tail costs. Windows (rolling operations) are
index ranges [lo, hi] of the flat arrays, reduced with `ufunc.reduceat` (the work is the total
window length), counts with prefix sums.

This module knows nothing of tables: arrays in, arrays out.
"""
from __future__ import annotations

import numpy as np

__all__ = ["positions", "seg_accumulate", "linear_scan", "last_index", "window_reduce", "window_count",
           "tick_windows", "time_windows"]


def positions(seg: np.ndarray) -> np.ndarray:
    """Position of each row within its segment (`seg`: non-decreasing segment ids)."""
    n = seg.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    start = np.ones(n, dtype=bool)
    start[1:] = seg[1:] != seg[:-1]
    idx = np.arange(n, dtype=np.int64)
    first = np.maximum.accumulate(np.where(start, idx, 0))
    out: np.ndarray = idx - first
    return out


def seg_accumulate(ufunc: np.ufunc, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """`ufunc.accumulate` within each segment."""
    y: np.ndarray = np.array(x, copy=True)
    if x.size == 0 or pos.size == 1 or not pos[1:].any():
        return y
    if np.all(pos == np.arange(pos.size)):  # one segment
        out: np.ndarray = ufunc.accumulate(x)
        return out
    d = 1
    top = int(pos.max())
    while d <= top:
        i = np.flatnonzero(pos >= d)
        y[i] = ufunc(y[i - d], y[i])
        d *= 2
    return y


def linear_scan(a: np.ndarray, b: np.ndarray, pos: np.ndarray, fresh: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For y[i] = a[i] * y[i-1] + b[i] within each segment: (A, B, F) with y[i] = B[i] where F (a
    fresh start at or before i in its segment) and y[i] = A[i] * y0 + B[i] elsewhere, y0 being the
    value before the segment's first row. `fresh`: the rows that start afresh (y[i] = b[i] whatever
    came before, even an infinity or NaN); a row whose a is 0 and that is not fresh multiplies what
    came before by 0 literally (0 * inf = NaN)."""
    A, B = a.astype(np.float64, copy=True), b.astype(np.float64, copy=True)
    F = fresh.astype(bool, copy=True)
    if A.size == 0:
        return A, B, F
    d = 1
    top = int(pos.max())
    with np.errstate(invalid="ignore", over="ignore"):
        while d <= top:
            i = np.flatnonzero(pos >= d)
            ai, bi, ap, bp, keep, fp = A[i], B[i], A[i - d], B[i - d], F[i], F[i - d]
            A[i] = np.where(keep, ai, ap * ai)
            B[i] = np.where(keep, bi, ai * bp + bi)
            F[i] = keep | fp
            d *= 2
    return A, B, F


def last_index(flag: np.ndarray, pos: np.ndarray, inclusive: bool = True) -> np.ndarray:
    """Index of the last row at or before (inclusive) or strictly before each row, within its
    segment, whose flag is set; -1 when none."""
    n = flag.size
    idx = np.arange(n, dtype=np.int64)
    cand = np.where(flag, idx, -1)
    if not inclusive:
        cand = np.concatenate(([-1], cand[:-1])) if n else cand
        cand = np.where(pos == 0, -1, cand)
    best = np.maximum.accumulate(cand) if n else cand
    seg_start = idx - pos
    out: np.ndarray = np.where(best >= seg_start, best, -1)
    return out


def tick_windows(pos: np.ndarray, seg_len: np.ndarray, rev: int, fwd: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat [lo, hi] of each row's window: rows rev - 1 before it to fwd after it, within its
    segment (lo > hi: empty). `seg_len`: the length of each row's segment."""
    idx = np.arange(pos.size, dtype=np.int64)
    start = idx - pos
    lo = np.maximum(idx - (rev - 1), start)
    hi = np.minimum(idx + fwd, start + seg_len - 1)
    return lo, hi


def time_windows(seg: np.ndarray, ts: np.ndarray, ts_ok: np.ndarray, rev: int, fwd: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Flat [lo, hi] of each row's window: the rows of its segment whose stamp lies in
    [ts - rev, ts + fwd] (stamps non-decreasing within a segment among rows that have one; rows
    without a stamp are in no window and have an empty one)."""
    n = ts.size
    lo = np.zeros(n, dtype=np.int64)
    hi = np.full(n, -1, dtype=np.int64)
    have = np.flatnonzero(ts_ok)
    if have.size == 0:
        return lo, hi
    s, t = seg[have], ts[have].astype(np.int64)
    uniq = np.unique(t)
    width = uniq.size + 2
    comp = s * width + np.searchsorted(uniq, t) + 1
    # bounds as ranks: the first rank >= ts - rev and the last rank <= ts + fwd
    with np.errstate(over="ignore"):
        low = t - np.int64(rev)
        high = t + np.int64(fwd)
    low_rank = np.searchsorted(uniq, low, side="left") + 1
    high_rank = np.searchsorted(uniq, high, side="right")  # rank of the last value <= high (1-based)
    a = np.searchsorted(comp, s * width + low_rank, side="left")
    b = np.searchsorted(comp, s * width + high_rank, side="right") - 1
    lo[have] = have[np.minimum(a, have.size - 1)]
    hi[have] = np.where(b >= 0, have[np.maximum(b, 0)], -1)
    empty = a > b
    lo[have[empty]] = 1
    hi[have[empty]] = 0
    return lo, hi


def window_reduce(ufunc: np.ufunc, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, identity: float | int) -> np.ndarray:
    """ufunc-reduction of x[lo:hi+1] for each window (identity for an empty one)."""
    n = lo.size
    out = np.full(n, identity, dtype=x.dtype)
    ok = hi >= lo
    if not ok.any() or x.size == 0:
        return out
    L, H = lo[ok], hi[ok] + 1
    ext = np.concatenate((x, np.full(1, identity, dtype=x.dtype)))
    idx = np.empty(2 * L.size, dtype=np.int64)
    idx[0::2] = L
    idx[1::2] = H
    with np.errstate(invalid="ignore", over="ignore"):
        red = ufunc.reduceat(ext, idx)[0::2]
    out[ok] = red
    return out


def window_count(flag: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Number of flagged rows in each window."""
    c = np.concatenate(([0], np.cumsum(flag.astype(np.int64))))
    ok = hi >= lo
    out = np.zeros(lo.size, dtype=np.int64)
    out[ok] = c[hi[ok] + 1] - c[lo[ok]]
    return out

