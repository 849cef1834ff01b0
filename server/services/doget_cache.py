"""DoGets of a table that has not changed share one encoding.

A DoGet's FlightData depend only on the table's content (and the step written in the first
message's metadata, which clients do not act on for a DoGet). `DogetCache` keeps, per table, the
payloads of its last DoGet with the table's version (DogetSnapshot.table_version: the step of its
last update, -1 for a static table): a DoGet of a table whose version has not moved reads them
instead of gathering and encoding again, and DoGets that arrive while the payloads are still
being produced follow the same production as it goes. The production runs as a task of its own,
so a client that leaves does not stop it for the others.

Bounded: only tables whose estimated size is at most a quarter of `max_bytes` are shared (a
larger DoGet, such as a history's, streams by itself as before); finished encodings are kept
least recently used first out, within `max_bytes` in all.

Use from one event loop (one cache per loop: see FlightService). This module must not touch the
engine's lock or its tables' state: versions are read through DogetSnapshot.table_version.
"""
from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any, AsyncIterator, Callable, Optional

import pyarrow as pa

__all__ = ["DogetCache", "estimated_bytes"]


def estimated_bytes(schema: pa.Schema, rows: int) -> int:
    """About what `rows` rows of `schema` take on the wire (32 bytes for a value of variable width)."""
    per_row = 0
    for f in schema:
        try:
            per_row += max(1, f.type.bit_width // 8)
        except ValueError:  # no fixed width
            per_row += 32
    return per_row * rows


class _Entry:
    def __init__(self, table: Any, version: int):
        self.table = weakref.ref(table)
        self.payloads: list[bytes] = []
        self.nbytes = 0
        self.done = False
        self.error: Optional[BaseException] = None
        # "version": the table's, as looked up, then as the production read it with the rows; and
        # what else the production learns: "rows", "step"
        self.figures: dict[str, Any] = {"version": version}
        self._changed = asyncio.Event()

    def add(self, payload: bytes) -> None:
        self.payloads.append(payload)
        self.nbytes += len(payload)
        self._wake()

    def finish(self, error: Optional[BaseException] = None) -> None:
        self.done = True
        self.error = error
        self._wake()

    def _wake(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    async def follow(self) -> AsyncIterator[bytes]:
        i = 0
        while True:
            while i < len(self.payloads):
                yield self.payloads[i]
                i += 1
            if self.done:
                if self.error is not None:
                    raise self.error
                return
            await self._changed.wait()


class DogetCache:
    """Encoded DoGets of unchanged tables, shared (see the module's docstring)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self._entries: "collections.OrderedDict[int, _Entry]" = collections.OrderedDict()
        self._tasks: set[asyncio.Task] = set()  # productions under way (kept from the collector)

    def _bytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def lookup(self, table: Any, version: int) -> Optional[_Entry]:
        """The entry of `table` at `version` (finished or being produced), or None."""
        e = self._entries.get(id(table))
        if e is None or e.table() is not table or e.figures["version"] != version or (e.done and e.error is not None):
            return None
        self._entries.move_to_end(id(table))
        return e

    def shareable(self, schema: pa.Schema, rows: int) -> bool:
        return self.max_bytes > 0 and estimated_bytes(schema, rows) <= self.max_bytes // 4

    def produce(self, table: Any, version: int, payloads: Callable[[dict], AsyncIterator[bytes]]) -> _Entry:
        """A new entry for `table` at `version`, filled from `payloads(entry.figures)` by a task of
        its own (which sets the figures' "version" to the one it read the rows at)."""
        e = _Entry(table, version)
        self._entries[id(table)] = e
        self._entries.move_to_end(id(table))

        async def run() -> None:
            try:
                async for p in payloads(e.figures):
                    e.add(p)
            except BaseException as exc:  # noqa: BLE001 - every follower gets it; cancellation too
                e.finish(exc)
                if self._entries.get(id(table)) is e:
                    del self._entries[id(table)]
                if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
                    raise
                return
            e.finish()
            self._trim()

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return e

    def _trim(self) -> None:
        """Drops finished entries, least recently used first, past `max_bytes`; and entries of
        tables that are gone."""
        for key, e in list(self._entries.items()):
            if e.table() is None and e.done:
                del self._entries[key]
        total = self._bytes()
        for key, e in list(self._entries.items()):
            if total <= self.max_bytes:
                break
            if e.done:
                total -= e.nbytes
                del self._entries[key]
