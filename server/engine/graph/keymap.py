"""A map from non-negative int64 keys to int64 values, read and written in bulk with numpy.

Dense keys (row keys of source tables, of sorted tables, positions) live in one array indexed by
``key - base``, grown by doubling. When the keys spread over much more room than their count
(a ring table's ever-growing keys, or keys far apart), the map switches to open addressing with
linear probing: one vectorised probe round per step, tombstones for deletions, rebuilt when it
passes half full (the graph's one hash table, `KeyIndex`, with each key as its own hash). Every
operation costs O(number of keys asked about), amortised.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tickwire.server.engine.graph.keyindex import KeyIndex

__all__ = ["KeyMap"]


def _as_hash(keys: np.ndarray) -> np.ndarray:
    """A key as its own hash in the KeyIndex (equal hashes are equal keys; the index spreads them)."""
    return keys.view(np.uint64)


class KeyMap:
    """int64 keys (>= 0) -> int64 values; a missing key reads as -1. Keys given to one call must
    be distinct."""

    sparse_factor = 4      # direct mode while the key span is at most this many times the count
    min_direct = 1 << 16   # ... or at most this many keys wide

    def __init__(self) -> None:
        self._direct = True
        self._base = 0
        self._arr = np.full(0, -1, dtype=np.int64)
        self._n = 0
        self._index: KeyIndex | None = None  # hash mode

    def __len__(self) -> int:
        return self._n

    @property
    def _hash(self) -> KeyIndex:
        """The index of hash mode."""
        assert self._index is not None, "a KeyMap in direct mode has no index"
        return self._index

    # -- reading --------------------------------------------------------------------------------
    def get(self, keys: npt.ArrayLike) -> np.ndarray:
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
        h, vals = self._hash.entries()
        keys = h.view(np.int64)
        order = np.argsort(keys, kind="stable")
        return keys[order], vals[order]

    # -- writing --------------------------------------------------------------------------------
    def set(self, keys: npt.ArrayLike, values: npt.ArrayLike) -> None:
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

    def delete(self, keys: npt.ArrayLike) -> None:
        k = np.asarray(keys, dtype=np.int64).ravel()
        if k.size == 0:
            return
        if self._direct:
            rel = k - self._base
            rel = rel[(rel >= 0) & (rel < self._arr.size)]
            self._n -= int(np.count_nonzero(self._arr[rel] >= 0))
            self._arr[rel] = -1
            return
        _, where = self._hash.lookup(_as_hash(k))
        self._hash.delete(where)
        self._n -= int(np.count_nonzero(where >= 0))

    def remap(self, old_keys: npt.ArrayLike, new_keys: npt.ArrayLike) -> None:
        """Moves the values of `old_keys` to `new_keys` (pairs in order; keys may overlap)."""
        old = np.asarray(old_keys, dtype=np.int64).ravel()
        if old.size == 0:
            return
        vals = self.get(old)
        self.delete(old)
        self.set(new_keys, vals)

    def clear(self) -> None:
        KeyMap.__init__(self)

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
        self._index = KeyIndex(capacity=max(1024, 3 * count))
        self._n = 0
        self._hash_insert(keys, vals)

    # -- hash mode ------------------------------------------------------------------------------
    def _hash_find(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._hash.lookup(_as_hash(k))

    def _hash_insert(self, k: np.ndarray, v: np.ndarray) -> None:
        """Adds keys known to be absent."""
        if k.size == 0:
            return
        if self._hash.would_rebuild(k.size) and self._dense_again(self._n + k.size):
            self.set(k, v)
            return
        self._hash.insert(_as_hash(k), v)
        self._n += k.size

    def _hash_set(self, k: np.ndarray, v: np.ndarray) -> None:
        _, where = self._hash_find(k)
        present = where >= 0
        if present.any():
            self._hash.replace(where[present], v[present])
        if not present.all():
            self._hash_insert(k[~present], v[~present])

    def _dense_again(self, count: int) -> bool:
        """When the hash table is about to grow: back to one array if the keys are dense again."""
        keys, vals = self.items()
        if not keys.size or int(keys.max()) - int(keys.min()) + 1 > max(self.min_direct, 2 * max(count, 1)):
            return False
        self._direct = True
        self._index = None
        self._arr = np.full(0, -1, dtype=np.int64)
        self._base = 0
        self._n = 0
        self.set(keys, vals)
        return True
