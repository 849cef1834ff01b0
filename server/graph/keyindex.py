"""A hash index from key values to row keys, held in numpy arrays and used in bulk.

Open addressing with linear probing over a power-of-two table of row keys (-1 empty, -2 deleted).
Each row's 64-bit key hash is kept per row key, so probing compares hashes only; rows whose hash
matches are then checked against the real key values in one bulk call supplied by the caller.
Lookups, inserts and deletes of m keys cost O(m) numpy work (one vectorised step per probe
round); the table is rebuilt, at O(live keys), only when it passes half full (including deleted
entries), which is amortised over at least as many inserts or deletes.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["KeyIndex"]

EMPTY = -1
DELETED = -2
_MAX_LOAD = 0.5

# verify(query_indices, row_keys) -> bool array: does the stored row have the query's key?
Verifier = Callable[[np.ndarray, np.ndarray], np.ndarray]


class KeyIndex:
    def __init__(self, capacity: int = 1024):
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self.table = np.full(cap, EMPTY, dtype=np.int64)
        self.row_hash = np.zeros(1024, dtype=np.uint64)
        self.live = 0
        self.deleted = 0

    @property
    def capacity(self) -> int:
        return self.table.size

    def __len__(self) -> int:
        return self.live

    def _probe(self, h: np.ndarray, pos: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advances `active` queries from `pos` until an empty entry or an entry with an equal
        hash; returns (entry position, row key or -1) per active query."""
        table, mask = self.table, self.table.size - 1
        out_pos = np.full(active.size, -1, dtype=np.int64)
        out_row = np.full(active.size, -1, dtype=np.int64)
        idx = np.arange(active.size)
        p = pos[active].copy()
        hq = h[active]
        while idx.size:
            e = table[p]
            stop = e == EMPTY
            cand = e >= 0
            if cand.any():
                ci = np.flatnonzero(cand)
                hit = self.row_hash[e[ci]] == hq[ci]
                stop[ci[hit]] = True
                out_row[idx[ci[hit]]] = e[ci[hit]]
            out_pos[idx[stop]] = p[stop]
            go = ~stop
            idx, p, hq = idx[go], (p[go] + 1) & mask, hq[go]
        return out_pos, out_row

    def lookup(self, h: np.ndarray, verify: Verifier) -> tuple[np.ndarray, np.ndarray]:
        """Row key of each query hash (-1 when absent) and its entry position (-1 when absent)."""
        n = h.size
        rows = np.full(n, -1, dtype=np.int64)
        where = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.live == 0:
            return rows, where
        mask = self.table.size - 1
        pos = (h & np.uint64(mask)).astype(np.int64)
        active = np.arange(n)
        while active.size:
            p, r = self._probe(h, pos, active)
            hit = r >= 0
            if not hit.any():
                break
            qi, ri, pi = active[hit], r[hit], p[hit]
            ok = np.asarray(verify(qi, ri), dtype=bool)
            rows[qi[ok]], where[qi[ok]] = ri[ok], pi[ok]
            # a hash equal to another key's (vanishingly rare): keep probing past it
            active = qi[~ok]
            pos[active] = (pi[~ok] + 1) & mask
        return rows, where

    def _ensure_rows(self, max_row: int) -> None:
        if max_row < self.row_hash.size:
            return
        size = self.row_hash.size
        while size <= max_row:
            size *= 2
        grown = np.zeros(size, dtype=np.uint64)
        grown[: self.row_hash.size] = self.row_hash
        self.row_hash = grown

    def insert(self, h: np.ndarray, rows: np.ndarray) -> None:
        """Adds keys known to be absent, with their row keys."""
        m = h.size
        if m == 0:
            return
        self._ensure_rows(int(rows.max()))
        self.row_hash[rows] = h
        if (self.live + self.deleted + m) > _MAX_LOAD * self.table.size:
            self._rebuild(self.live + m)
        self._place(h, rows)
        self.live += m

    def _place(self, h: np.ndarray, rows: np.ndarray) -> None:
        table, mask = self.table, self.table.size - 1
        pos = (h & np.uint64(mask)).astype(np.int64)
        pending = np.arange(h.size)
        while pending.size:
            p = pos[pending]
            free = table[p] < 0
            placed = np.zeros(pending.size, dtype=bool)
            if free.any():
                fi = np.flatnonzero(free)
                # several keys may want one free entry: the first of each wins, the others go on
                uniq, first = np.unique(p[fi], return_index=True)
                winners = fi[first]
                self.deleted -= int(np.count_nonzero(table[uniq] == DELETED))
                table[uniq] = rows[pending[winners]]
                placed[winners] = True
            pending = pending[~placed]
            pos[pending] = (pos[pending] + 1) & mask

    def delete(self, where: np.ndarray) -> None:
        """Removes the entries at positions returned by `lookup`."""
        where = where[where >= 0]
        if where.size == 0:
            return
        self.table[where] = DELETED
        self.live -= where.size
        self.deleted += where.size

    def _rebuild(self, need: int) -> None:
        cap = 16
        while need > _MAX_LOAD * cap / 1.5:
            cap *= 2
        rows = self.table[self.table >= 0]
        self.table = np.full(cap, EMPTY, dtype=np.int64)
        self.deleted = 0
        if rows.size:
            self._place(self.row_hash[rows], rows)
