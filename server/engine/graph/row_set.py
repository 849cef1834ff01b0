"""Ordered sets of non-negative int64 row keys, and row-key shifts (Deephaven's table update model).

`RowSet` is immutable. Underneath it is either one closed range ``[lo, hi]`` (the fast path:
append-only tables stay one range forever and rank, select and slicing on it are arithmetic) or a
pyroaring ``BitMap64``. Row sets are exchanged as numpy arrays: keys as 1-D int64 arrays, ranges as
``(n, 2)`` int64 arrays of closed ranges, the form `tickwire.protocol.rowset` encodes.

Costs: set algebra costs what roaring containers cost (not one step per key). Bulk position and
key queries (`select`, `find`, `rank`) choose per call between one C call per queried element and
one pass over the set's keys, whichever is cheaper, so a query about a few rows of a huge set
stays cheap and a query about most of a set stays linear.
"""
from __future__ import annotations

import array
from typing import Iterator, Optional, SupportsInt

import numpy as np
import numpy.typing as npt
from pyroaring import BitMap64

from tickwire.protocol.rowset import EMPTY_RANGES, keys_to_ranges, ranges_to_keys
from tickwire.server.engine.graph.arrays import intersect_sorted, union_sorted, unique

__all__ = ["RowSet", "RowSetShiftData", "RowSetShiftDataBuilder"]

_EMPTY_KEYS = np.zeros(0, dtype=np.int64)
# ranges at least this long go into a bitmap with add_range; shorter ones are expanded to keys
_LONG_RANGE = 64
# a per-element C call costs about as much as this many keys of a full pass over the set
_PER_CALL_KEYS = 1500
# RowSet.from_keys keeps up to this many keys as a sorted array until a bitmap is needed
_LAZY_KEYS = 1 << 16


def keys_to_bitmap(keys: np.ndarray) -> BitMap64:
    """Builds a bitmap from int64 keys (pyroaring reads an array.array much faster than numpy)."""
    buf = array.array("Q")
    buf.frombytes(np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64).tobytes())
    return BitMap64(buf)


def _bitmap_keys(bm: BitMap64) -> np.ndarray:
    return np.frombuffer(bm.to_array(), dtype=np.uint64).view(np.int64)


_WINDOW = 1 << 16


def _find_sorted(all_keys: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Position of each of `k` in the sorted `all_keys`, or -1."""
    pos = np.searchsorted(all_keys, k, side="left")
    hit = pos < all_keys.size
    hit[hit] = all_keys[pos[hit]] == k[hit]
    return np.where(hit, pos, -1).astype(np.int64)


#: a set made from at most this many ranges keeps them (RowSet._r)
_KEPT_RANGES = 4096


def _merge_ranges(r: np.ndarray) -> np.ndarray:
    """Closed ranges (any order, overlapping or touching) as maximal ascending ones."""
    r = r[np.argsort(r[:, 0], kind="stable")]
    ends = np.maximum.accumulate(r[:, 1])
    starts_new = np.ones(r.shape[0], dtype=bool)
    starts_new[1:] = r[1:, 0] > ends[:-1] + 1
    first = np.flatnonzero(starts_new)
    last = np.concatenate((first[1:] - 1, [r.shape[0] - 1]))
    return np.stack((r[first, 0], ends[last]), axis=1).astype(np.int64)


def _bitmap_ranges(bm: BitMap64) -> np.ndarray:
    """Maximal ranges of a bitmap. Fragmented stretches are expanded window by window (cost per
    key); a window that is one run is extended by galloping over positions (cost per range), so
    a few long ranges never expand to their keys."""
    n = len(bm)
    if n <= _WINDOW:
        return keys_to_ranges(_bitmap_keys(bm))
    out: list[np.ndarray] = []
    p = 0
    while p < n:
        first = bm[p]
        q = min(p + _WINDOW, n) - 1
        if bm[q] - first == q - p:  # positions p..q are one run: find where it ends
            lo, step = q, _WINDOW
            while lo + step < n and bm[lo + step] - first == lo + step - p:
                lo += step
                step *= 2
            hi = min(lo + step, n)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if bm[mid] - first == mid - p:
                    lo = mid
                else:
                    hi = mid
            out.append(np.array([[first, first + lo - p]], dtype=np.int64))
            p = lo + 1
            continue
        chunk = _bitmap_keys(bm[p:q + 1])
        r = keys_to_ranges(chunk)
        if q + 1 < n:
            # the window's last range may go on past it: leave it for the next window
            last = r[-1]
            r = r[:-1]
            p += chunk.size - int(last[1] - last[0] + 1)
        else:
            p = n
        out.append(r)
    return np.concatenate(out) if out else EMPTY_RANGES.copy()


class RowSet:
    """An immutable ordered set of non-negative row keys. Every operation returns a new RowSet."""

    __slots__ = ("_lo", "_hi", "_b", "_k", "_r")

    def __init__(self, lo: int = 0, hi: int = -1, bm: Optional[BitMap64] = None, keys: Optional[np.ndarray] = None):
        # one range [lo, hi] when there is neither a bitmap nor keys (empty when hi < lo); otherwise
        # the bitmap, or the keys (sorted, unique, not one range) from which it is built on first use
        self._lo, self._hi, self._b, self._k = lo, hi, bm, keys
        # a set made from ranges keeps them (maximal, ascending, shape (n, 2)) beside its bitmap:
        # positions and ranges of a few long ranges are then found by search, not by the bitmap's
        # select (whose cost grows with the keys: a history table's billion rows)
        self._r: Optional[np.ndarray] = None

    @property
    def _bm(self) -> Optional[BitMap64]:
        """The bitmap, None for a single range. A set made from keys builds it on first use (and
        keeps the keys, so concurrent readers of an update's row sets never see them go)."""
        b = self._b
        if b is None:
            k = self._k
            if k is not None:
                b = self._b = keys_to_bitmap(k)
        return b

    @property
    def _multi(self) -> BitMap64:
        """The bitmap of a set that is not one range (for which `_bm` is never None)."""
        b = self._bm
        assert b is not None, "a single-range RowSet has no bitmap"
        return b

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> "RowSet":
        return cls()

    @classmethod
    def range(cls, first: int, last: int) -> "RowSet":
        """Keys first..last inclusive (empty when last < first)."""
        first, last = int(first), int(last)
        if last < first:
            return cls()
        if first < 0:
            raise ValueError(f"row keys must be non-negative, got {first}")
        return cls(first, last)

    @classmethod
    def from_keys(cls, keys: npt.ArrayLike) -> "RowSet":
        """Any int64 keys (unsorted, repeated keys allowed)."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            return cls()
        if k.size > 1 and np.any(k[1:] <= k[:-1]):
            k = unique(k)
        elif k.size <= _LAZY_KEYS:
            k = k.copy()  # kept below: the caller's array may change afterwards
        if k[0] < 0:
            raise ValueError(f"row keys must be non-negative, got {int(k[0])}")
        if int(k[-1]) - int(k[0]) + 1 == k.size:
            return cls(int(k[0]), int(k[-1]))
        if k.size > _LAZY_KEYS:  # big sets (snapshots, builds) go straight into a bitmap
            return cls(0, -1, keys_to_bitmap(k))
        # a change-sized set keeps its keys: many are only counted, encoded or gathered, and a
        # bitmap of keys spread over a large key space costs per container touched
        return cls(0, -1, None, k)

    @classmethod
    def from_ranges(cls, ranges: npt.ArrayLike) -> "RowSet":
        """Closed ranges, shape (n, 2), in any order; they may overlap or touch."""
        r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        n = r.shape[0]
        if n == 0:
            return cls()
        if np.any(r[:, 1] < r[:, 0]):
            raise ValueError("a range ends before it starts")
        if r[:, 0].min() < 0:
            raise ValueError(f"row keys must be non-negative, got {int(r[:, 0].min())}")
        if n == 1:
            return cls(int(r[0, 0]), int(r[0, 1]))
        lengths = r[:, 1] - r[:, 0] + 1
        long_ = lengths >= _LONG_RANGE
        short = r[~long_]
        bm = keys_to_bitmap(ranges_to_keys(short)) if short.shape[0] else BitMap64()
        for s, e in r[long_].tolist():  # one C call per long range
            bm.add_range(s, e + 1)
        out = cls.from_bitmap(bm)
        if not out.is_single_range and n <= _KEPT_RANGES:
            out._r = _merge_ranges(r)
        return out

    @classmethod
    def from_bitmap(cls, bm: BitMap64) -> "RowSet":
        n = len(bm)
        if n == 0:
            return cls()
        lo, hi = bm.min(), bm.max()
        if hi - lo + 1 == n:
            return cls(lo, hi)
        return cls(0, -1, bm)

    def bitmap(self) -> BitMap64:
        if self._bm is not None:
            return self._bm
        bm = BitMap64()
        if self._hi >= self._lo:
            bm.add_range(self._lo, self._hi + 1)
        return bm

    # -- basic properties -----------------------------------------------------------------------
    @property
    def is_single_range(self) -> bool:
        """True when the set is one contiguous range (or empty)."""
        return self._b is None and self._k is None

    def __len__(self) -> int:
        if self._k is not None:
            return self._k.size
        return len(self._b) if self._b is not None else max(0, self._hi - self._lo + 1)

    @property
    def size(self) -> int:
        return len(self)

    def is_empty(self) -> bool:
        return self._b is None and self._k is None and self._hi < self._lo

    def __bool__(self) -> bool:
        return not self.is_empty()

    def first(self) -> int:
        if self.is_empty():
            raise ValueError("empty row set has no first key")
        if self._k is not None:
            return int(self._k[0])
        return self._multi.min() if not self.is_single_range else self._lo

    def last(self) -> int:
        if self.is_empty():
            raise ValueError("empty row set has no last key")
        if self._k is not None:
            return int(self._k[-1])
        return self._multi.max() if not self.is_single_range else self._hi

    def __eq__(self, other: object) -> bool:
        if other is self:  # e.g. the client keys subscribers that shared a message hold in common
            return True
        if not isinstance(other, RowSet):
            return NotImplemented
        if self.is_single_range and other.is_single_range:
            if self.is_empty() or other.is_empty():
                return self.is_empty() and other.is_empty()
            return self._lo == other._lo and self._hi == other._hi
        if len(self) != len(other):
            return False
        if self._k is not None and other._k is not None:
            return bool(np.array_equal(self._k, other._k))
        return self.bitmap() == other.bitmap()

    # mutable-looking value type: not hashable (typeshed's object.__hash__ has no None)
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        r = self.ranges()
        body = ", ".join(f"{s}" if s == e else f"{s}-{e}" for s, e in r[:6].tolist())
        more = f", ... ({r.shape[0]} ranges)" if r.shape[0] > 6 else ""
        return f"RowSet{{{body}{more}}}"

    def __contains__(self, key: SupportsInt) -> bool:
        key = int(key)
        if self._k is not None:
            i = int(np.searchsorted(self._k, key))
            return i < self._k.size and int(self._k[i]) == key
        if not self.is_single_range:
            return key >= 0 and key in self._multi
        return self._lo <= key <= self._hi

    def contains(self, keys: npt.ArrayLike) -> np.ndarray:
        """Membership of each key, as a bool array."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if self.is_single_range:
            return (k >= self._lo) & (k <= self._hi)
        return self.find(k) >= 0

    # -- conversion -----------------------------------------------------------------------------
    def keys(self) -> np.ndarray:
        """Every key, ascending, as an int64 array."""
        if self._k is not None:
            keys: np.ndarray = self._k.copy()
            return keys
        if not self.is_single_range:
            return _bitmap_keys(self._multi)
        if self._hi < self._lo:
            empty: np.ndarray = _EMPTY_KEYS.copy()
            return empty
        return np.arange(self._lo, self._hi + 1, dtype=np.int64)

    def ranges(self) -> np.ndarray:
        """Maximal closed ranges, shape (n, 2), int64."""
        if self._r is not None:
            kept: np.ndarray = self._r.copy()
            return kept
        if self._k is not None:
            return keys_to_ranges(self._k)
        if self.is_single_range:
            return EMPTY_RANGES.copy() if self._hi < self._lo else np.array([[self._lo, self._hi]], dtype=np.int64)
        return _bitmap_ranges(self._multi)

    def iter_ranges(self) -> Iterator[tuple[int, int]]:
        """(first, last) of each maximal range, ascending."""
        return map(tuple, self.ranges().tolist())

    def range_count(self) -> int:
        return int(self.ranges().shape[0]) if not self.is_single_range else (0 if self.is_empty() else 1)

    # -- set algebra ----------------------------------------------------------------------------
    def union(self, other: "RowSet") -> "RowSet":
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        if self._k is not None and other._k is not None:  # both kept keys: per key, no bitmaps
            return RowSet.from_keys(union_sorted(self._k, other._k))
        if self.is_single_range and other.is_single_range and other._lo <= self._hi + 1 and self._lo <= other._hi + 1:
            return RowSet(min(self._lo, other._lo), max(self._hi, other._hi))
        return RowSet.from_bitmap(self.bitmap() | other.bitmap())

    def intersect(self, other: "RowSet") -> "RowSet":
        if self.is_empty() or other.is_empty():
            return RowSet()
        if self._k is not None and other._k is not None:  # both kept keys: per key, no bitmaps
            return RowSet.from_keys(intersect_sorted(self._k, other._k))
        if other.is_single_range:
            return self.subset_by_key_range(other._lo, other._hi)
        if self.is_single_range:
            return other.subset_by_key_range(self._lo, self._hi)
        return RowSet.from_bitmap(self._multi & other._multi)

    def minus(self, other: "RowSet") -> "RowSet":
        if self.is_empty() or other.is_empty():
            return self
        if self._k is not None and other._k is not None:  # both kept keys: per key, no bitmaps
            return RowSet.from_keys(np.setdiff1d(self._k, other._k, assume_unique=True))
        if other.is_single_range:
            if other._lo > self.last() or other._hi < self.first():
                return self
            if self.is_single_range:
                if other._lo <= self._lo and other._hi >= self._hi:
                    return RowSet()
                if other._lo <= self._lo:
                    return RowSet(other._hi + 1, self._hi)
                if other._hi >= self._hi:
                    return RowSet(self._lo, other._lo - 1)
            bm = self.bitmap().copy() if not self.is_single_range else self.bitmap()
            bm.remove_range(other._lo, other._hi + 1)
            return RowSet.from_bitmap(bm)
        return RowSet.from_bitmap(self.bitmap() - other._multi)

    __or__, __and__, __sub__ = union, intersect, minus

    def is_subset_of(self, other: "RowSet") -> bool:
        if self.is_empty():
            return True
        if other.is_empty():
            return False
        if other.is_single_range:
            return other._lo <= self.first() and self.last() <= other._hi
        if self.is_single_range:
            return other._multi.contains_range(self._lo, self._hi + 1)
        return self._multi.issubset(other._multi)

    is_subset = is_subset_of

    def overlaps(self, other: "RowSet") -> bool:
        if self.is_empty() or other.is_empty():
            return False
        if self.is_single_range and other.is_single_range:
            return self._lo <= other._hi and other._lo <= self._hi
        if self.last() < other.first() or other.last() < self.first():
            return False
        return not self.bitmap().isdisjoint(other.bitmap())

    def subset_by_key_range(self, first: int, last: int) -> "RowSet":
        """The keys k of this set with first <= k <= last."""
        if last < first or self.is_empty():
            return RowSet()
        if self.is_single_range:
            lo, hi = max(self._lo, first), min(self._hi, last)
            return RowSet(lo, hi) if hi >= lo else RowSet()
        if self._k is not None:
            k = self._k
            return RowSet.from_keys(k[np.searchsorted(k, first, "left"):np.searchsorted(k, last, "right")])
        bm = self._multi
        first, last = max(int(first), bm.min()), min(int(last), bm.max())
        if last < first:
            return RowSet()
        # positions of the window's ends, then a positional slice: cost follows the result
        lo_pos = bm.rank(first - 1) if first > 0 else 0
        hi_pos = bm.rank(last)
        if hi_pos <= lo_pos:
            return RowSet()
        return RowSet.from_bitmap(bm[lo_pos:hi_pos])

    # -- positions ------------------------------------------------------------------------------
    def select(self, positions: npt.ArrayLike) -> np.ndarray:
        """Keys at the given 0-based positions (each must be < len(self))."""
        p = np.asarray(positions, dtype=np.int64).ravel()
        if p.size == 0:
            empty: np.ndarray = _EMPTY_KEYS.copy()
            return empty
        n = len(self)
        if p.min() < 0 or p.max() >= n:
            raise IndexError(f"position out of range for a row set of {n} keys")
        if self._k is not None:
            return self._k[p]
        if self.is_single_range:
            return p + self._lo
        if self._r is not None:
            r, starts = self._r, self._range_positions()
            i = np.searchsorted(starts, p, side="right") - 1
            out: np.ndarray = r[i, 0] + (p - starts[i])
            return out
        bm = self._multi
        if p.size * _PER_CALL_KEYS < n:
            return np.fromiter(map(bm.__getitem__, p.tolist()), dtype=np.int64, count=p.size)
        return _bitmap_keys(bm)[p]

    get_keys_at_positions = select

    def rank(self, keys: npt.ArrayLike) -> np.ndarray:
        """For each key, how many keys of the set are smaller (its position if it is in the set)."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            empty: np.ndarray = _EMPTY_KEYS.copy()
            return empty
        if self._k is not None:
            return np.searchsorted(self._k, k, side="left").astype(np.int64)
        if self.is_single_range:
            return np.clip(k - self._lo, 0, len(self))
        if self._r is not None:
            r, starts = self._r, self._range_positions()
            i = np.searchsorted(r[:, 0], k, side="right") - 1
            j = np.maximum(i, 0)
            within = np.clip(k - r[j, 0], 0, r[j, 1] - r[j, 0] + 1)
            ranked: np.ndarray = np.where(i >= 0, starts[j] + within, 0).astype(np.int64)
            return ranked
        bm = self._multi
        if k.size * _PER_CALL_KEYS < len(bm):
            # pyroaring's rank counts keys <= k; k - 1 gives keys < k (k = 0 has none)
            out = np.fromiter(map(bm.rank, np.maximum(k - 1, 0).tolist()), dtype=np.int64, count=k.size)
            out[k <= 0] = 0
            return out
        return np.searchsorted(_bitmap_keys(bm), k, side="left").astype(np.int64)

    def find(self, keys: npt.ArrayLike) -> np.ndarray:
        """Position of each key in the set, or -1 for keys that are not in it."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            empty: np.ndarray = _EMPTY_KEYS.copy()
            return empty
        if self.is_single_range:
            pos = k - self._lo
            pos[(k < self._lo) | (k > self._hi)] = -1
            return pos
        if self._k is not None:
            return _find_sorted(self._k, k)
        if self._r is not None:
            r = self._r
            i = np.searchsorted(r[:, 0], k, side="right") - 1
            j = np.maximum(i, 0)
            inside = (i >= 0) & (k <= r[j, 1])
            return np.where(inside, self.rank(k), -1)
        bm = self._multi
        if k.size * _PER_CALL_KEYS < len(bm):
            kl = np.maximum(k, 0).tolist()
            ranks = np.fromiter(map(bm.rank, kl), dtype=np.int64, count=k.size)
            member = np.fromiter(map(bm.__contains__, kl), dtype=np.bool_, count=k.size) & (k >= 0)
            return np.where(member, ranks - 1, -1)
        return _find_sorted(_bitmap_keys(bm), k)

    def positions_of(self, keys: "RowSet") -> "RowSet":
        """The positions (as a RowSet) of the keys of `keys` that are in this set."""
        if keys.is_empty() or self.is_empty():
            return RowSet()
        if self.is_single_range:
            inside = keys.subset_by_key_range(self._lo, self._hi)
            if inside.is_empty():
                return RowSet()
            if inside.is_single_range:
                return RowSet(inside._lo - self._lo, inside._hi - self._lo)
            return RowSet.from_bitmap(inside._multi.shift(-self._lo))
        pos = self.find(keys.keys())
        return RowSet.from_keys(pos[pos >= 0])

    def subset_by_positions(self, first: int, last: int) -> "RowSet":
        """The keys at positions first..last inclusive (clipped to the set)."""
        n = len(self)
        first, last = max(0, int(first)), min(int(last), n - 1)
        if last < first:
            return RowSet()
        if self.is_single_range:
            return RowSet(self._lo + first, self._lo + last)
        if self._k is not None:
            return RowSet.from_keys(self._k[first:last + 1])
        if self._r is not None:
            return RowSet.from_ranges(self._position_slice(first, last))
        return RowSet.from_bitmap(self._multi[first:last + 1])

    def _range_positions(self) -> np.ndarray:
        """The position of each kept range's first key."""
        assert self._r is not None
        lengths = self._r[:, 1] - self._r[:, 0] + 1
        out: np.ndarray = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        return out

    def _position_slice(self, first: int, last: int) -> np.ndarray:
        """The key ranges of positions first..last (within the set) of a set that keeps ranges."""
        assert self._r is not None
        r, starts = self._r, self._range_positions()
        a = int(np.searchsorted(starts, first, side="right") - 1)
        b = int(np.searchsorted(starts, last, side="right") - 1)
        out: np.ndarray = r[a:b + 1].copy()
        out[0, 0] = r[a, 0] + (first - starts[a])
        out[-1, 1] = r[b, 0] + (last - starts[b])
        return out

    def subset_by_position_ranges(self, ranges: npt.ArrayLike) -> "RowSet":
        """The keys at the positions of closed position ranges (n, 2) (e.g. a viewport)."""
        r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        if r.shape[0] == 0 or self.is_empty():
            return RowSet()
        if r.shape[0] == 1:
            return self.subset_by_positions(int(r[0, 0]), int(r[0, 1]))
        n = len(self)
        r = r[(r[:, 0] < n) & (r[:, 1] >= 0)]
        if self.is_single_range:
            return RowSet.from_ranges(np.clip(r, 0, n - 1) + self._lo)
        if self._r is not None:
            parts = [self._position_slice(max(s, 0), min(e, n - 1)) for s, e in r.tolist()]
            return RowSet.from_ranges(np.concatenate(parts)) if parts else RowSet()
        out = BitMap64()
        for s, e in r.tolist():  # one positional slice per range
            out |= self._multi[max(s, 0):min(e, n - 1) + 1]
        return RowSet.from_bitmap(out)

    # -- moving ---------------------------------------------------------------------------------
    def shift(self, delta: int) -> "RowSet":
        """Every key plus `delta`."""
        delta = int(delta)
        if self.is_empty() or delta == 0:
            return self
        if self.first() + delta < 0:
            raise ValueError(f"shifting by {delta} would make key {self.first()} negative")
        if self.is_single_range:
            return RowSet(self._lo + delta, self._hi + delta)
        if self._k is not None:
            return RowSet(0, -1, None, self._k + delta)
        return RowSet(0, -1, self._multi.shift(delta))


# A shift range of at least this many keys may be clipped out of a copy of the set instead of
# sliced by position (see RowSetShiftData.apply); below it, slicing costs little either way.
_SLICE_LIMIT = 1 << 16
_KEY_END = (1 << 64) - 1  # remove_range's exclusive end covering every 63-bit key


class RowSetShiftData:
    """Row-key shifts: shift i moves every existing key in [starts[i], ends[i]] by deltas[i].

    Normalised form (checked by `validate`): deltas non-zero, ranges ascending and non-overlapping,
    no destination below 0, destinations ascending and non-overlapping (order-preserving), and
    adjacent ranges with equal delta merged. The ranges may cover keys that do not exist.
    """

    __slots__ = ("starts", "ends", "deltas")

    def __init__(self, starts: npt.ArrayLike = (), ends: npt.ArrayLike = (), deltas: npt.ArrayLike = ()) -> None:
        self.starts = np.asarray(starts, dtype=np.int64).ravel()
        self.ends = np.asarray(ends, dtype=np.int64).ravel()
        self.deltas = np.asarray(deltas, dtype=np.int64).ravel()
        if not (self.starts.size == self.ends.size == self.deltas.size):
            raise ValueError(f"shift arrays differ in length ({self.starts.size} starts, {self.ends.size} ends, "
                             f"{self.deltas.size} deltas)")

    @classmethod
    def empty(cls) -> "RowSetShiftData":
        return cls()

    @classmethod
    def build(cls, starts: npt.ArrayLike, ends: npt.ArrayLike, deltas: npt.ArrayLike) -> "RowSetShiftData":
        """Normalises and validates: drops zero deltas, clamps a negative shift so that no
        destination is below 0, sorts by start and merges adjacent ranges with equal delta."""
        s = np.asarray(starts, dtype=np.int64).ravel().copy()
        e = np.asarray(ends, dtype=np.int64).ravel()
        d = np.asarray(deltas, dtype=np.int64).ravel()
        if not (s.size == e.size == d.size):
            raise ValueError("shift arrays differ in length")
        s = np.maximum(s, -np.minimum(d, 0))
        keep = (d != 0) & (e >= s)
        s, e, d = s[keep], e[keep], d[keep]
        if s.size > 1:
            order = np.argsort(s, kind="stable")
            s, e, d = s[order], e[order], d[order]
            join = (s[1:] == e[:-1] + 1) & (d[1:] == d[:-1])
            if join.any():
                s, e, d = s[np.concatenate(([True], ~join))], e[np.concatenate((~join, [True]))], \
                    d[np.concatenate(([True], ~join))]
        out = cls(s, e, d)
        out.validate()
        return out

    @classmethod
    def builder(cls) -> "RowSetShiftDataBuilder":
        return RowSetShiftDataBuilder()

    def __len__(self) -> int:
        return int(self.starts.size)

    def is_empty(self) -> bool:
        return self.starts.size == 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RowSetShiftData) and np.array_equal(self.starts, other.starts) \
            and np.array_equal(self.ends, other.ends) and np.array_equal(self.deltas, other.deltas)

    __hash__ = None  # type: ignore[assignment]  # not hashable; typeshed's object.__hash__ has no None

    def __repr__(self) -> str:
        items = ", ".join(f"[{s},{e}]{d:+d}" for s, e, d in zip(self.starts[:8].tolist(), self.ends[:8].tolist(),
                                                              self.deltas[:8].tolist()))
        more = f", ... ({len(self)} shifts)" if len(self) > 8 else ""
        return f"RowSetShiftData({items}{more})"

    def validate(self) -> None:
        """Raises ValueError when the shifts are not in normalised form."""
        s, e, d = self.starts, self.ends, self.deltas
        if s.size == 0:
            return
        if np.any(d == 0):
            raise ValueError(f"shift {int(np.flatnonzero(d == 0)[0])} has delta 0")
        if np.any(e < s):
            raise ValueError(f"shift {int(np.flatnonzero(e < s)[0])} ends before it starts")
        if np.any(s + d < 0):
            raise ValueError(f"shift {int(np.flatnonzero(s + d < 0)[0])} moves keys below 0")
        if np.any(s[1:] <= e[:-1]):
            raise ValueError(f"shift {int(np.flatnonzero(s[1:] <= e[:-1])[0]) + 1} overlaps the previous one "
                             f"or is not in ascending order")
        if np.any(s[1:] + d[1:] <= e[:-1] + d[:-1]):
            raise ValueError(f"shift {int(np.flatnonzero(s[1:] + d[1:] <= e[:-1] + d[:-1])[0]) + 1} lands on or "
                             f"before the previous shift's destination (order not preserved)")
        if np.any((s[1:] == e[:-1] + 1) & (d[1:] == d[:-1])):
            raise ValueError("adjacent shifts with equal delta are not merged")

    # -- wire form ------------------------------------------------------------------------------
    def to_wire(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, dests) as `tickwire.protocol.rowset.encode_shifts` takes them."""
        return self.starts, self.ends, self.starts + self.deltas

    @classmethod
    def from_wire(cls, starts: npt.ArrayLike, ends: npt.ArrayLike, dests: npt.ArrayLike) -> "RowSetShiftData":
        """From decoded (starts, ends, dests); normalised and validated."""
        s = np.asarray(starts, dtype=np.int64).ravel()
        return cls.build(s, ends, np.asarray(dests, dtype=np.int64).ravel() - s)

    # -- application ----------------------------------------------------------------------------
    def _shift_index(self, k: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i = np.searchsorted(starts, k, side="right") - 1
        inside = i >= 0
        inside[inside] = k[inside] <= ends[i[inside]]
        return i, inside

    def apply_to_keys(self, keys: npt.ArrayLike) -> np.ndarray:
        """Maps pre-shift keys to post-shift keys (keys outside every range stay)."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        out: np.ndarray = k.copy()
        if self.is_empty() or k.size == 0:
            return out
        i, inside = self._shift_index(k, self.starts, self.ends)
        out[inside] += self.deltas[i[inside]]
        return out

    def unapply_keys(self, keys: npt.ArrayLike) -> np.ndarray:
        """Maps post-shift keys back to pre-shift keys (keys outside every destination stay)."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        out: np.ndarray = k.copy()
        if self.is_empty() or k.size == 0:
            return out
        i, inside = self._shift_index(k, self.starts + self.deltas, self.ends + self.deltas)
        out[inside] -= self.deltas[i[inside]]
        return out

    def inverse(self) -> "RowSetShiftData":
        """The shifts that map post-shift keys back to pre-shift keys."""
        return RowSetShiftData(self.starts + self.deltas, self.ends + self.deltas, -self.deltas)

    def apply(self, rowset: RowSet) -> RowSet:
        """The row set after the shifts. Raises ValueError when a moved key lands on a key
        that stays (the update model forbids it)."""
        if self.is_empty() or rowset.is_empty():
            return rowset
        lo, hi = rowset.first(), rowset.last()
        touch = (self.ends >= lo) & (self.starts <= hi)
        if not touch.any():
            return rowset
        s, e, d = self.starts[touch], self.ends[touch], self.deltas[touch]
        if rowset.is_single_range and s.size == 1 and s[0] <= lo and e[0] >= hi:
            return rowset.shift(int(d[0]))
        src = rowset.bitmap()
        stay = src.copy()
        moved = BitMap64()
        containers = None
        for a, b, delta in zip(s.tolist(), e.tolist(), d.tolist()):  # one roaring step per shift range
            count = src.range_cardinality(a, b + 1)
            if count == 0:
                continue
            stay.remove_range(a, b + 1)
            if count >= _SLICE_LIMIT and containers is None:
                containers = src.get_statistics()["n_containers"]
            if count >= _SLICE_LIMIT and containers is not None and count >= 64 * containers:
                # many keys per container: clip a copy of the set (cost per container) rather
                # than slice it by position (cost per key)
                part = src.copy()
                if a > 0:
                    part.remove_range(0, a)
                part.remove_range(b + 1, _KEY_END)
                moved |= part.shift(delta)
            else:
                moved |= RowSet.from_bitmap(src).subset_by_key_range(a, b).shift(delta).bitmap()
        if not stay.isdisjoint(moved):
            raise ValueError("a shift moves keys onto keys that do not move")
        return RowSet.from_bitmap(stay | moved)

    def unapply(self, rowset: RowSet) -> RowSet:
        """The row set before the shifts, given the row set after them."""
        return self.inverse().apply(rowset)


class RowSetShiftDataBuilder:
    """Collects shifts in ascending order of start; merges adjacent ranges with equal delta."""

    def __init__(self) -> None:
        self._s: list[int] = []
        self._e: list[int] = []
        self._d: list[int] = []

    def shift_range(self, start: int, end: int, delta: int) -> "RowSetShiftDataBuilder":
        start, end, delta = int(start), int(end), int(delta)
        if delta == 0:
            return self
        if delta < 0 and start < -delta:
            start = -delta
        if end < start:
            return self
        if self._s and start <= self._e[-1]:
            raise ValueError(f"shift [{start},{end}] does not follow the previous one ending at {self._e[-1]}")
        if self._s and start == self._e[-1] + 1 and delta == self._d[-1]:
            self._e[-1] = end
        else:
            self._s.append(start)
            self._e.append(end)
            self._d.append(delta)
        return self

    def build(self) -> RowSetShiftData:
        out = RowSetShiftData(self._s, self._e, self._d)
        out.validate()
        return out
