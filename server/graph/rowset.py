"""Ordered sets of non-negative int64 row keys, and row-key shifts (Deephaven's update model).

`RowSet` is a pyroaring `BitMap64` with a fast path for one contiguous range: append-only tables
stay a single range forever, and rank/select/slicing on it are arithmetic. Row sets are exchanged
as numpy arrays (keys, or (n, 2) closed ranges as `tickwire.protocol.rowset` uses), never as Python
lists. Queries over many keys or positions (`find`, `select`) cost one C call per queried element,
so they follow the size of the change, not of the table.
"""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np
from pyroaring import BitMap64

from tickwire.protocol.rowset import EMPTY_RANGES, keys_to_ranges, ranges_to_keys

__all__ = ["RowSet", "RowSetShiftData"]

_EMPTY_KEYS = np.zeros(0, dtype=np.int64)


class RowSet:
    """An immutable ordered set of row keys. Operations return new RowSets."""

    __slots__ = ("_lo", "_hi", "_bm")

    def __init__(self, lo: int = 0, hi: int = -1, bm: Optional[BitMap64] = None):
        # single range [lo, hi] when bm is None (empty when hi < lo)
        self._lo, self._hi, self._bm = lo, hi, bm

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def empty(cls) -> "RowSet":
        return cls()

    @classmethod
    def range(cls, first: int, last: int) -> "RowSet":
        """Keys first..last inclusive (empty when last < first)."""
        if first < 0:
            raise ValueError(f"row keys must be non-negative, got {first}")
        return cls(int(first), int(last)) if last >= first else cls()

    @classmethod
    def from_keys(cls, keys) -> "RowSet":
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            return cls()
        if k.min() < 0:
            raise ValueError("row keys must be non-negative")
        k = np.unique(k)
        if int(k[-1]) - int(k[0]) + 1 == k.size:
            return cls(int(k[0]), int(k[-1]))
        return cls._from_bitmap(BitMap64(k.astype(np.uint64)))

    @classmethod
    def from_ranges(cls, ranges) -> "RowSet":
        r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        if r.shape[0] == 0:
            return cls()
        if r.shape[0] == 1:
            return cls.range(int(r[0, 0]), int(r[0, 1]))
        bm = BitMap64()
        for s, e in r.tolist():  # one C call per range
            bm.add_range(s, e + 1)
        return cls._from_bitmap(bm)

    @classmethod
    def _from_bitmap(cls, bm: BitMap64) -> "RowSet":
        n = len(bm)
        if n == 0:
            return cls()
        lo, hi = bm.min(), bm.max()
        if hi - lo + 1 == n:
            return cls(lo, hi)
        return cls(0, -1, bm)

    def _bitmap(self) -> BitMap64:
        if self._bm is not None:
            return self._bm
        bm = BitMap64()
        if self._hi >= self._lo:
            bm.add_range(self._lo, self._hi + 1)
        return bm

    # -- basic properties -----------------------------------------------------------------------
    @property
    def is_single_range(self) -> bool:
        return self._bm is None

    def __len__(self) -> int:
        return len(self._bm) if self._bm is not None else max(0, self._hi - self._lo + 1)

    @property
    def size(self) -> int:
        return len(self)

    def is_empty(self) -> bool:
        return len(self) == 0

    def first(self) -> int:
        if self.is_empty():
            raise ValueError("empty row set")
        return self._bm.min() if self._bm is not None else self._lo

    def last(self) -> int:
        if self.is_empty():
            raise ValueError("empty row set")
        return self._bm.max() if self._bm is not None else self._hi

    def __eq__(self, other) -> bool:
        if not isinstance(other, RowSet):
            return NotImplemented
        if self._bm is None and other._bm is None:
            return (self.is_empty() and other.is_empty()) or (self._lo, self._hi) == (other._lo, other._hi)
        return len(self) == len(other) and self._bitmap() == other._bitmap()

    def __hash__(self):
        raise TypeError("RowSet is not hashable")

    def __repr__(self) -> str:
        r = self.ranges()
        body = ", ".join(f"{s}" if s == e else f"{s}-{e}" for s, e in r[:6].tolist())
        more = f", … ({r.shape[0]} ranges)" if r.shape[0] > 6 else ""
        return f"RowSet{{{body}{more}}}"

    def __contains__(self, key: int) -> bool:
        if self._bm is not None:
            return int(key) in self._bm
        return self._lo <= key <= self._hi

    # -- conversion -----------------------------------------------------------------------------
    def keys(self) -> np.ndarray:
        if self._bm is not None:
            return np.frombuffer(self._bm.to_array(), dtype=np.uint64).astype(np.int64)
        if self._hi < self._lo:
            return _EMPTY_KEYS.copy()
        return np.arange(self._lo, self._hi + 1, dtype=np.int64)

    def ranges(self) -> np.ndarray:
        """Maximal closed ranges, shape (n, 2)."""
        if self._bm is None:
            return EMPTY_RANGES.copy() if self._hi < self._lo else np.array([[self._lo, self._hi]], dtype=np.int64)
        return keys_to_ranges(self.keys())

    def iter_ranges(self) -> Iterable[tuple[int, int]]:
        return map(tuple, self.ranges().tolist())

    # -- set algebra ----------------------------------------------------------------------------
    def union(self, other: "RowSet") -> "RowSet":
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        if self._bm is None and other._bm is None and other._lo <= self._hi + 1 and self._lo <= other._hi + 1:
            return RowSet(min(self._lo, other._lo), max(self._hi, other._hi))
        return RowSet._from_bitmap(self._bitmap() | other._bitmap())

    def intersect(self, other: "RowSet") -> "RowSet":
        if self.is_empty() or other.is_empty():
            return RowSet()
        if self._bm is None and other._bm is None:
            return RowSet.range(max(self._lo, other._lo), min(self._hi, other._hi))
        if other._bm is None:
            return self.subset_by_key_range(other._lo, other._hi)
        if self._bm is None:
            return other.subset_by_key_range(self._lo, self._hi)
        return RowSet._from_bitmap(self._bm & other._bm)

    def minus(self, other: "RowSet") -> "RowSet":
        if self.is_empty() or other.is_empty():
            return self
        if self._bm is None and other._bm is None:
            if other._lo > self._hi or other._hi < self._lo:
                return self
            if other._lo <= self._lo and other._hi >= self._hi:
                return RowSet()
            if other._lo <= self._lo:
                return RowSet(other._hi + 1, self._hi)
            if other._hi >= self._hi:
                return RowSet(self._lo, other._lo - 1)
        return RowSet._from_bitmap(self._bitmap() - other._bitmap())

    __or__, __and__, __sub__ = union, intersect, minus

    def is_subset_of(self, other: "RowSet") -> bool:
        if self.is_empty():
            return True
        if other._bm is None:
            return other._lo <= self.first() and self.last() <= other._hi
        return self._bitmap() <= other._bm

    def overlaps(self, other: "RowSet") -> bool:
        return not self.intersect(other).is_empty()

    def subset_by_key_range(self, first: int, last: int) -> "RowSet":
        """Keys k of this set with first <= k <= last."""
        if last < first or self.is_empty():
            return RowSet()
        if self._bm is None:
            return RowSet.range(max(self._lo, first), min(self._hi, last))
        bm = self._bm
        first, last = max(first, bm.min()), min(last, bm.max())
        if last < first:
            return RowSet()
        if (last - first) // 65536 > len(bm):
            # a sparse set under a wide window: cheaper to cut its keys than to build the window
            k = self.keys()
            return RowSet.from_keys(k[np.searchsorted(k, first):np.searchsorted(k, last, side="right")])
        window = BitMap64()
        window.add_range(first, last + 1)
        return RowSet._from_bitmap(bm & window)

    # -- positions ------------------------------------------------------------------------------
    def select(self, positions) -> np.ndarray:
        """Keys at the given positions (0-based); positions must be < len(self)."""
        p = np.asarray(positions, dtype=np.int64).ravel()
        if p.size == 0:
            return _EMPTY_KEYS.copy()
        n = len(self)
        if p.min() < 0 or p.max() >= n:
            raise IndexError(f"position out of range for a row set of {n}")
        if self._bm is None:
            return p + self._lo
        bm = self._bm
        return np.fromiter(map(bm.__getitem__, p.tolist()), dtype=np.int64, count=p.size)

    def subset_by_positions(self, first: int, last: int) -> "RowSet":
        """The keys at positions first..last (clipped to the set)."""
        n = len(self)
        first, last = max(0, first), min(last, n - 1)
        if last < first:
            return RowSet()
        if self._bm is None:
            return RowSet(self._lo + first, self._lo + last)
        return self.subset_by_key_range(self._bm[first], self._bm[last])

    def subset_by_position_ranges(self, ranges) -> "RowSet":
        out = RowSet()
        for s, e in np.asarray(ranges, dtype=np.int64).reshape(-1, 2).tolist():
            out = out.union(self.subset_by_positions(s, e))
        return out

    def find(self, keys) -> np.ndarray:
        """Position of each key (keys must be in the set; -1 for keys that are not)."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            return _EMPTY_KEYS.copy()
        if self._bm is None:
            pos = k - self._lo
            pos[(k < self._lo) | (k > self._hi)] = -1
            return pos
        bm = self._bm
        ranks = np.fromiter(map(bm.rank, k.tolist()), dtype=np.int64, count=k.size)
        member = np.fromiter(map(bm.__contains__, k.tolist()), dtype=bool, count=k.size)
        return np.where(member, ranks - 1, -1)

    def rank_of(self, keys) -> np.ndarray:
        """Number of keys in the set that are <= each given key."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if self._bm is None:
            return np.clip(k - self._lo + 1, 0, len(self))
        return np.fromiter(map(self._bm.rank, k.tolist()), dtype=np.int64, count=k.size)

    def shift(self, delta: int) -> "RowSet":
        if self.is_empty() or delta == 0:
            return self
        if self.first() + delta < 0:
            raise ValueError("shift would make a row key negative")
        if self._bm is None:
            return RowSet(self._lo + delta, self._hi + delta)
        return RowSet._from_bitmap(BitMap64((self.keys() + delta).astype(np.uint64)))


class RowSetShiftData:
    """Row-key shifts: each (start, end, delta) moves the existing keys in [start, end] by delta.

    Normalised form: delta != 0, ranges ascending and non-overlapping, destinations
    order-preserving, adjacent ranges with equal delta merged.
    """

    __slots__ = ("starts", "ends", "deltas")

    def __init__(self, starts=(), ends=(), deltas=()):
        self.starts = np.asarray(starts, dtype=np.int64).ravel()
        self.ends = np.asarray(ends, dtype=np.int64).ravel()
        self.deltas = np.asarray(deltas, dtype=np.int64).ravel()
        if not (self.starts.size == self.ends.size == self.deltas.size):
            raise ValueError("shift arrays differ in length")

    @classmethod
    def empty(cls) -> "RowSetShiftData":
        return cls()

    @classmethod
    def build(cls, starts, ends, deltas) -> "RowSetShiftData":
        """Normalises: drops zero deltas and merges adjacent ranges with equal delta."""
        s = np.asarray(starts, dtype=np.int64).ravel()
        e = np.asarray(ends, dtype=np.int64).ravel()
        d = np.asarray(deltas, dtype=np.int64).ravel()
        keep = d != 0
        s, e, d = s[keep], e[keep], d[keep]
        if s.size > 1:
            order = np.argsort(s, kind="stable")
            s, e, d = s[order], e[order], d[order]
            join = (s[1:] == e[:-1] + 1) & (d[1:] == d[:-1])
            if join.any():
                starts_keep = np.concatenate(([True], ~join))
                ends_keep = np.concatenate((~join, [True]))
                s, e, d = s[starts_keep], e[ends_keep], d[starts_keep]
        out = cls(s, e, d)
        out.validate()
        return out

    def __len__(self) -> int:
        return int(self.starts.size)

    def is_empty(self) -> bool:
        return self.starts.size == 0

    def __eq__(self, other) -> bool:
        return isinstance(other, RowSetShiftData) and np.array_equal(self.starts, other.starts) \
            and np.array_equal(self.ends, other.ends) and np.array_equal(self.deltas, other.deltas)

    def __repr__(self) -> str:
        items = ", ".join(f"[{s},{e}]{d:+d}" for s, e, d in zip(self.starts.tolist(), self.ends.tolist(),
                                                              self.deltas.tolist()))
        return f"RowSetShiftData({items})"

    def validate(self) -> None:
        s, e, d = self.starts, self.ends, self.deltas
        if s.size == 0:
            return
        if np.any(d == 0):
            raise ValueError("shift with delta 0")
        if np.any(e < s):
            raise ValueError("shift range with end before start")
        if np.any(s[1:] <= e[:-1]):
            raise ValueError("shift ranges overlap or are not ascending")
        if np.any(s + d < 0):
            raise ValueError("shift moves a key below 0")
        if np.any(s[1:] + d[1:] <= e[:-1] + d[:-1]):
            raise ValueError("shift destinations overlap or change the order of rows")

    def to_wire(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, ends, dests) as `tickwire.protocol.rowset.encode_shifts` takes them."""
        return self.starts, self.ends, self.starts + self.deltas

    @classmethod
    def from_wire(cls, starts, ends, dests) -> "RowSetShiftData":
        s = np.asarray(starts, dtype=np.int64)
        return cls(s, ends, np.asarray(dests, dtype=np.int64) - s)

    def apply_to_keys(self, keys) -> np.ndarray:
        """Maps pre-shift keys (sorted) to post-shift keys."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if self.is_empty() or k.size == 0:
            return k.copy()
        i = np.searchsorted(self.starts, k, side="right") - 1
        inside = (i >= 0)
        inside[inside] = k[inside] <= self.ends[i[inside]]
        out = k.copy()
        out[inside] += self.deltas[i[inside]]
        return out

    def unapply_keys(self, keys) -> np.ndarray:
        """Maps post-shift keys back to pre-shift keys."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        if self.is_empty() or k.size == 0:
            return k.copy()
        ds, de = self.starts + self.deltas, self.ends + self.deltas
        i = np.searchsorted(ds, k, side="right") - 1
        inside = (i >= 0)
        inside[inside] = k[inside] <= de[i[inside]]
        out = k.copy()
        out[inside] -= self.deltas[i[inside]]
        return out

    def apply(self, rowset: RowSet) -> RowSet:
        """The row set after the shifts (keys outside every shift range stay)."""
        if self.is_empty() or rowset.is_empty():
            return rowset
        moved = RowSet()
        stay = rowset
        for s, e, d in zip(self.starts.tolist(), self.ends.tolist(), self.deltas.tolist()):
            part = rowset.subset_by_key_range(s, e)
            if part.is_empty():
                continue
            stay = stay.minus(part)
            moved = moved.union(part.shift(d))
        if stay.overlaps(moved):
            raise ValueError("shift moves rows onto existing rows")
        return stay.union(moved)

    def unapply(self, rowset: RowSet) -> RowSet:
        inverse = RowSetShiftData(self.starts + self.deltas, self.ends + self.deltas, -self.deltas)
        return inverse.apply(rowset)
