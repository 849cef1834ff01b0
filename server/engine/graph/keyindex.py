"""The graph's one hash table: 64-bit hashes to int64 values, held in numpy arrays and used in bulk.

Open addressing with linear probing over a power-of-two table. Each entry holds a value (-1 empty,
-2 deleted) and the 64-bit hash it was inserted with, so probing compares hashes only; entries
whose hash matches are then checked against the real key values in one bulk call supplied by the
caller (none when equal hashes mean equal keys, as for int64 keys hashed by the bijection `mix`).
An entry's place is found from `mix` of its hash, so any hash spreads well over the table.
Lookups, inserts and deletes of m keys cost O(m) numpy work (one vectorised step per probe
round); the table is rebuilt, at O(live entries), only when it passes half full (including
deleted entries), which is amortised over at least as many inserts or deletes.

`KeyIndex` maps key hashes to row keys (source tables, groups of last_by, replicas); `KeyMap`
(keymap.py) maps sparse int64 keys to values through it.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

__all__ = ["KeyIndex", "mix"]

EMPTY = -1
DELETED = -2
_MAX_LOAD = 0.5
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# verify(query_indices, values) -> bool array: does the stored entry have the query's key?
Verifier = Callable[[np.ndarray, np.ndarray], np.ndarray]


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on a copy as uint64 (arithmetic wraps). A bijection of
    the 64-bit values: distinct int64 keys get distinct hashes."""
    x = np.asarray(x).astype(np.uint64)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


class KeyIndex:
    def __init__(self, capacity: int = 1024):
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self.values = np.full(cap, EMPTY, dtype=np.int64)
        self.hashes = np.zeros(cap, dtype=np.uint64)
        self.live = 0
        self.deleted = 0

    @property
    def capacity(self) -> int:
        return self.values.size

    def __len__(self) -> int:
        return self.live

    def _home(self, h: np.ndarray) -> np.ndarray:
        home: np.ndarray = (mix(h) & np.uint64(self.values.size - 1)).astype(np.int64)
        return home

    def lookup(self, h: np.ndarray, verify: Optional[Verifier] = None) -> tuple[np.ndarray, np.ndarray]:
        """Value of each query hash (-1 when absent) and its entry position (-1 when absent).
        `verify` checks entries whose hash matches; without it a matching hash is a match."""
        h = np.asarray(h, dtype=np.uint64)
        n = h.size
        found = np.full(n, -1, dtype=np.int64)
        where = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.live == 0:
            return found, where
        values, hashes, mask = self.values, self.hashes, self.values.size - 1
        idx = np.arange(n)
        p = self._home(h)
        while idx.size:
            e = values[p]
            done = e == EMPTY
            cand = np.flatnonzero((e >= 0) & (hashes[p] == h[idx]))
            if cand.size:
                if verify is not None:
                    # a hash equal to another key's (vanishingly rare): keep probing past it
                    cand = cand[np.asarray(verify(idx[cand], e[cand]), dtype=bool)]
                found[idx[cand]] = e[cand]
                where[idx[cand]] = p[cand]
                done[cand] = True
            go = ~done
            idx, p = idx[go], (p[go] + 1) & mask
        return found, where

    def insert(self, h: np.ndarray, values: np.ndarray) -> None:
        """Adds keys known to be absent, with their values (>= 0)."""
        h = np.asarray(h, dtype=np.uint64)
        m = h.size
        if m == 0:
            return
        if (self.live + self.deleted + m) > _MAX_LOAD * self.values.size:
            self._rebuild(self.live + m)
        self._place(h, np.asarray(values, dtype=np.int64))
        self.live += m

    def _place(self, h: np.ndarray, values: np.ndarray) -> None:
        table, mask = self.values, self.values.size - 1
        pos = self._home(h)
        pending = np.arange(h.size)
        while pending.size:
            p = pos[pending]
            free = table[p] < 0
            placed = np.zeros(pending.size, dtype=bool)
            if free.any():
                fi = np.flatnonzero(free)
                # several keys may want one free entry: the first of each wins, the others go on
                uniq, first = np.unique(p[fi], return_index=True)
                winners = pending[fi[first]]
                self.deleted -= int(np.count_nonzero(table[uniq] == DELETED))
                table[uniq] = values[winners]
                self.hashes[uniq] = h[winners]
                placed[fi[first]] = True
            pending = pending[~placed]
            pos[pending] = (pos[pending] + 1) & mask

    def replace(self, where: np.ndarray, values: np.ndarray) -> None:
        """Sets the values of the entries at positions returned by `lookup`."""
        self.values[where] = values

    def delete(self, where: np.ndarray) -> None:
        """Removes the entries at positions returned by `lookup`."""
        where = where[where >= 0]
        if where.size == 0:
            return
        self.values[where] = DELETED
        self.live -= where.size
        self.deleted += where.size

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(hash, value) of every entry, in table order."""
        live = np.flatnonzero(self.values >= 0)
        return self.hashes[live], self.values[live]

    def would_rebuild(self, m: int) -> bool:
        """Whether inserting m more keys rebuilds the table."""
        return (self.live + self.deleted + m) > _MAX_LOAD * self.values.size

    def _rebuild(self, need: int) -> None:
        cap = 16
        while need > _MAX_LOAD * cap / 1.5:
            cap *= 2
        h, v = self.entries()
        self.values = np.full(cap, EMPTY, dtype=np.int64)
        self.hashes = np.zeros(cap, dtype=np.uint64)
        self.deleted = 0
        if v.size:
            self._place(h, v)
