"""A map from non-negative int64 keys to int64 values, read and written in bulk with numpy.

Dense keys (row keys of source tables, of sorted tables, positions) live in one array indexed by
``key - base``, grown by doubling. When the keys spread over much more room than their count
(a ring table's ever-growing keys, or keys far apart), the map switches to open addressing with
linear probing: one vectorised probe round per step, tombstones for deletions, rebuilt when it
passes half full. Every operation costs O(number of keys asked about), amortised.
"""
from __future__ import annotations

import numpy as np

__all__ = ["KeyMap"]

_EMPTY = -1
_DEAD = -2
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _hash(keys: np.ndarray) -> np.ndarray:
    x = keys.astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


class KeyMap:
    """int64 keys (>= 0) -> int64 values; a missing key reads as -1. Keys given to one call must
    be distinct."""

    sparse_factor = 4      # direct mode while the key span is at most this many times the count
    min_direct = 1 << 16   # ... or at most this many keys wide

    def __init__(self):
        self._direct = True
        self._base = 0
        self._arr = np.full(0, -1, dtype=np.int64)
        self._n = 0
        # hash mode
        self._hk = np.zeros(0, dtype=np.int64)
        self._hv = np.zeros(0, dtype=np.int64)
        self._dead = 0

    def __len__(self) -> int:
        return self._n

    # -- reading --------------------------------------------------------------------------------
    def get(self, keys) -> np.ndarray:
        k = np.asarray(keys, dtype=np.int64).ravel()
        if self._direct:
            out = np.full(k.size, -1, dtype=np.int64)
            rel = k - self._base
            ok = (rel >= 0) & (rel < self._arr.size)
            out[ok] = self._arr[rel[ok]]
            return out
        return self._hash_find(k)[0]

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (key, value), keys ascending."""
        if self._direct:
            rel = np.flatnonzero(self._arr >= 0)
            return rel + self._base, self._arr[rel]
        live = np.flatnonzero(self._hk >= 0)
        keys, vals = self._hk[live], self._hv[live]
        order = np.argsort(keys, kind="stable")
        return keys[order], vals[order]

    # -- writing --------------------------------------------------------------------------------
    def set(self, keys, values) -> None:
        """Inserts or overwrites; values must be >= 0."""
        k = np.asarray(keys, dtype=np.int64).ravel()
        v = np.broadcast_to(np.asarray(values, dtype=np.int64), k.shape).ravel()
        if k.size == 0:
            return
        if self._direct:
            lo, hi = int(k.min()), int(k.max())
            if lo < self._base or hi >= self._base + self._arr.size:
                if not self._grow_direct(lo, hi, self._n + k.size):
                    self._to_hash(self._n + k.size)
                    self._hash_set(k, v)
                    return
            rel = k - self._base
            self._n += int(np.count_nonzero(self._arr[rel] < 0))
            self._arr[rel] = v
            return
        self._hash_set(k, v)

    def delete(self, keys) -> None:
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            return
        if self._direct:
            rel = k - self._base
            rel = rel[(rel >= 0) & (rel < self._arr.size)]
            self._n -= int(np.count_nonzero(self._arr[rel] >= 0))
            self._arr[rel] = -1
            return
        _, where = self._hash_find(k)
        where = where[where >= 0]
        self._hk[where] = _DEAD
        self._n -= where.size
        self._dead += where.size

    def remap(self, old_keys, new_keys) -> None:
        """Moves the values of `old_keys` to `new_keys` (pairs in order; keys may overlap)."""
        old = np.asarray(old_keys, dtype=np.int64).ravel()
        if old.size == 0:
            return
        vals = self.get(old)
        self.delete(old)
        self.set(new_keys, vals)

    def clear(self) -> None:
        self.__init__()

    # -- direct mode ----------------------------------------------------------------------------
    def _grow_direct(self, lo: int, hi: int, count: int) -> bool:
        if self._arr.size:
            lo = min(lo, self._base)
            hi = max(hi, self._base + self._arr.size - 1)
        span = hi - lo + 1
        if span > max(self.min_direct, self.sparse_factor * count):
            return False
        size = max(1024, span + span // 2)
        arr = np.full(size, -1, dtype=np.int64)
        # room on both sides: a quarter of the slack below, the rest above
        new_base = max(0, lo - (size - span) // 4)
        if self._arr.size:
            off = self._base - new_base
            arr[off:off + self._arr.size] = self._arr
        self._arr, self._base = arr, new_base
        return True

    def _to_hash(self, count: int) -> None:
        keys, vals = self.items() if self._n else (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._direct = False
        self._arr = np.full(0, -1, dtype=np.int64)
        self._alloc_hash(count)
        self._n = 0
        self._hash_insert(keys, vals)

    # -- hash mode ------------------------------------------------------------------------------
    def _alloc_hash(self, count: int) -> None:
        cap = 1024
        while cap < 3 * count:
            cap *= 2
        self._hk = np.full(cap, _EMPTY, dtype=np.int64)
        self._hv = np.zeros(cap, dtype=np.int64)
        self._dead = 0

    def _hash_find(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = k.size
        vals = np.full(n, -1, dtype=np.int64)
        where = np.full(n, -1, dtype=np.int64)
        if n == 0 or self._n == 0:
            return vals, where
        hk, mask = self._hk, self._hk.size - 1
        pos = (_hash(k) & np.uint64(mask)).astype(np.int64)
        idx = np.arange(n)
        while idx.size:
            e = hk[pos]
            hit = e == k[idx]
            if hit.any():
                hi = idx[hit]
                where[hi] = pos[hit]
                vals[hi] = self._hv[pos[hit]]
            go = ~(hit | (e == _EMPTY))
            idx, pos = idx[go], (pos[go] + 1) & mask
        return vals, where

    def _hash_insert(self, k: np.ndarray, v: np.ndarray) -> None:
        """Adds keys known to be absent."""
        if k.size == 0:
            return
        if self._n + self._dead + k.size > self._hk.size // 2:
            self._rebuild(self._n + k.size)
            if self._direct:
                self.set(k, v)
                return
        hk, mask = self._hk, self._hk.size - 1
        pos = (_hash(k) & np.uint64(mask)).astype(np.int64)
        pending = np.arange(k.size)
        while pending.size:
            p = pos[pending]
            free = hk[p] < 0
            placed = np.zeros(pending.size, dtype=bool)
            if free.any():
                fi = np.flatnonzero(free)
                uniq, first = np.unique(p[fi], return_index=True)
                win = fi[first]
                self._dead -= int(np.count_nonzero(hk[uniq] == _DEAD))
                hk[uniq] = k[pending[win]]
                self._hv[uniq] = v[pending[win]]
                placed[win] = True
            pending = pending[~placed]
            pos[pending] = (pos[pending] + 1) & mask
        self._n += k.size

    def _hash_set(self, k: np.ndarray, v: np.ndarray) -> None:
        _, where = self._hash_find(k)
        present = where >= 0
        if present.any():
            self._hv[where[present]] = v[present]
        if not present.all():
            self._hash_insert(k[~present], v[~present])

    def _rebuild(self, count: int) -> None:
        live = np.flatnonzero(self._hk >= 0)
        keys, vals = self._hk[live], self._hv[live]
        if keys.size and int(keys.max()) - int(keys.min()) + 1 <= max(self.min_direct, 2 * max(count, 1)):
            # dense again: back to one array
            self._direct = True
            self._hk = np.zeros(0, dtype=np.int64)
            self._hv = np.zeros(0, dtype=np.int64)
            self._dead = 0
            self._arr = np.full(0, -1, dtype=np.int64)
            self._base = 0
            self._n = 0
            self.set(keys, vals)
            return
        self._alloc_hash(count)
        self._n = 0
        self._hash_insert(keys, vals)
