"""Group ids of a table grouped by key values whose output row keys follow from its group ids
(agg_by: a group's id is its row key; head_by/tail_by: a block of row keys per group), given to
new keys and given again once many groups have emptied.

A group that empties keeps its id (and so its row key) for a while: should its key come back soon
it is the same group at the same row key, as in Deephaven. Once `minimum` groups (or an eighth of
the live ones) have emptied, in a cycle after the one that emptied them (that cycle's update has
gone out, so no subscriber can take a new group for an old one), the ones still empty leave the
key index and their ids go to new keys, lowest first. So a table of groups that come and go (open
orders by id) holds memory for its live groups, not for every key it has seen.

Touches only the key index and key store it is given; the caller resets its own per-group state
(counts, running sums) when a group empties or when it makes one.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, forget_groups
from tickwire.server.engine.graph.keyindex import KeyIndex

__all__ = ["GroupIds", "REUSE_MIN"]

REUSE_MIN = 1024  # emptied groups are given again once this many (or an eighth of the live ones) are

_EMPTY = np.zeros(0, dtype=np.int64)


class GroupIds:
    """Ids for new groups (`take`), emptied ones recorded (`emptied`) and freed at the start of a
    later cycle (`release`). With `reuse` false (no key columns, groups kept when empty) ids are
    never given again."""

    def __init__(self, index: KeyIndex, store: ColumnStore, keys: Sequence[str], reuse: bool = True,
                 minimum: Optional[int] = None):
        self.index = index
        self.store = store
        self.keys = list(keys)
        self.reuse = bool(reuse) and bool(self.keys)
        # read when made, not when this module was imported: bench_keyed_churn --no-reuse sets it
        self.minimum = int(REUSE_MIN if minimum is None else minimum)
        self.made = 0               # ids ever made: every id is below this
        self.reused = 0             # ids given again (for tests and metrics)
        self._free = _EMPTY         # ids free for new keys, ascending
        self._emptied: list[np.ndarray] = []

    @property
    def free(self) -> int:
        return int(self._free.size)

    def take(self, m: int) -> np.ndarray:
        """Ids for m new groups: freed ones first (lowest first), then new ones."""
        reused, self._free = self._free[:m], self._free[m:]
        fresh = np.arange(self.made, self.made + m - reused.size, dtype=np.int64)
        self.made += fresh.size
        self.reused += reused.size
        return np.concatenate((reused, fresh)) if reused.size else fresh

    def emptied(self, gids: np.ndarray) -> None:
        """Groups that emptied (their rows left the output) in this cycle."""
        if self.reuse and gids.size:
            self._emptied.append(np.asarray(gids, dtype=np.int64))

    @property
    def pending(self) -> int:
        """Emptied groups not yet released (counted once per time they emptied)."""
        return sum(a.size for a in self._emptied)

    def release(self, still_empty: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """At the start of a cycle, before any group is made: once many groups have emptied in
        earlier cycles, those still empty (`still_empty(gids)` -> mask) leave the key index and
        their ids become free. Returns the ids freed (the caller resets what it keeps of them)."""
        if not self._emptied or self.pending < max(self.minimum, (self.made - self._free.size) // 8):
            return _EMPTY
        emptied = unique(np.concatenate(self._emptied))
        self._emptied = []
        dead: np.ndarray = emptied[still_empty(emptied)]
        if dead.size:
            forget_groups(self.index, self.store, self.keys, dead)
            self._free = np.union1d(self._free, dead)
        return dead
