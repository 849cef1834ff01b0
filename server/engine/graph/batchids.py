"""Which batch ids a source table has accepted, in bounded memory for numbered batches.

A batch id is any hashable. Ids of the form `(scope..., n)` with an integer `n` last (as Spark
sinks use: ("spark", query id, batch number)) are numbered batches of a scope whose numbers grow,
as a streaming query's do: per scope the last `keep` numbers are kept exactly, and numbers at or
below the highest one forgotten count as accepted (a query never replays a batch that old). Other
ids are kept as they are.
"""
from __future__ import annotations

from typing import Any, Hashable, Optional

__all__ = ["BatchIds"]


class BatchIds:
    def __init__(self, keep: int = 1024):
        self.keep = int(keep)
        self._plain: set[Hashable] = set()
        self._scopes: dict[tuple[Hashable, ...], tuple[int, set[int]]] = {}  # scope -> (floor, recent numbers)

    @staticmethod
    def _split(batch_id: Hashable) -> tuple[Optional[tuple[Hashable, ...]], Optional[int]]:
        if isinstance(batch_id, tuple) and batch_id and isinstance(batch_id[-1], int) \
                and not isinstance(batch_id[-1], bool):
            return batch_id[:-1], batch_id[-1]
        return None, None

    def __contains__(self, batch_id: Hashable) -> bool:
        scope, n = self._split(batch_id)
        if scope is None:
            return batch_id in self._plain
        assert n is not None  # a scope comes with its number
        entry = self._scopes.get(scope)
        return entry is not None and (n <= entry[0] or n in entry[1])

    def add(self, batch_id: Hashable) -> None:
        scope, n = self._split(batch_id)
        if scope is None:
            self._plain.add(batch_id)
            return
        assert n is not None  # a scope comes with its number
        entry = self._scopes.get(scope)
        floor, recent = entry if entry is not None else (-(1 << 63), set())
        recent.add(n)
        if len(recent) > 2 * self.keep:  # forget the oldest half: they count as accepted
            ordered = sorted(recent)
            cut = len(ordered) - self.keep
            floor = max(floor, ordered[cut - 1])
            recent = set(ordered[cut:])
        self._scopes[scope] = (floor, recent)

    def discard(self, batch_id: Hashable) -> None:
        """Forgets an id (one accepted but never applied). A numbered id at or below its scope's
        floor cannot be forgotten; the floor only covers numbers far behind the newest."""
        scope, n = self._split(batch_id)
        if scope is None:
            self._plain.discard(batch_id)
            return
        assert n is not None  # a scope comes with its number
        entry = self._scopes.get(scope)
        if entry is not None:
            entry[1].discard(n)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: {"plain": [ids], "scopes": [[scope, floor, [numbers]]]}."""
        return {"plain": list(self._plain),
                "scopes": [[list(scope), floor, sorted(recent)] for scope, (floor, recent) in self._scopes.items()]}

    @classmethod
    def from_state(cls, state: dict[str, Any], keep: int = 1024) -> "BatchIds":
        """The memory `state()` described; ids come back as tuples where they were lists."""
        out = cls(keep)
        for b in state.get("plain", ()):
            out._plain.add(_tuples(b))
        for scope, floor, recent in state.get("scopes", ()):
            out._scopes[tuple(_tuples(x) for x in scope)] = (int(floor), {int(n) for n in recent})
        return out

    def __len__(self) -> int:
        """How many ids are held (not how many were accepted)."""
        return len(self._plain) + sum(len(r) for _, r in self._scopes.values())


def _tuples(value: Any) -> Hashable:
    """JSON gives lists where batch ids had tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    scalar: Hashable = value  # a JSON string, number, bool or null
    return scalar
