"""The update graph: one thread runs cycles; each cycle applies every source's pending input and
delivers one consistent update per changed table to its listeners.

The step counter is the logical clock: each cycle increments it, and each table records the step
of its last change. Everything a cycle does happens under the graph's lock, so a reader holding
`shared_lock()` (or calling `snapshot`) sees the tables as they were at a cycle boundary.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from contextlib import contextmanager
from typing import Optional, Sequence

import pyarrow as pa

from tickwire.server.graph.tables import (
    AppendOnlyTable,
    BlinkTable,
    KeyedTable,
    RingTable,
    StaticTable,
    Table,
)
from tickwire.server.graph.update import TableUpdate

__all__ = ["UpdateGraph", "ListenerError"]

log = logging.getLogger("tickwire.graph")


class ListenerError:
    __slots__ = ("step", "table", "error")

    def __init__(self, step: int, table: str, error: BaseException):
        self.step, self.table, self.error = step, table, error

    def __repr__(self) -> str:
        return f"ListenerError(step={self.step}, table={self.table!r}, error={self.error!r})"


class UpdateGraph:
    def __init__(self, interval_ms: float = 100.0):
        self.interval = interval_ms / 1000.0
        self.step = 0
        self.tables: dict[str, Table] = {}
        self.errors: collections.deque[ListenerError] = collections.deque(maxlen=1000)
        self._lock = threading.RLock()
        self._intake_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._cycle_listeners: list = []
        self.cycle_seconds: collections.deque[float] = collections.deque(maxlen=1000)

    # -- tables ---------------------------------------------------------------------------------
    def _register(self, table: Table) -> Table:
        with self._lock:
            if table.name in self.tables:
                raise ValueError(f"a table named {table.name!r} already exists")
            self.tables[table.name] = table
        return table

    def append_table(self, name: str, schema: pa.Schema) -> AppendOnlyTable:
        return self._register(AppendOnlyTable(self, name, schema))

    def keyed_table(self, name: str, schema: pa.Schema, keys: Sequence[str]) -> KeyedTable:
        return self._register(KeyedTable(self, name, schema, keys))

    def blink_table(self, name: str, schema: pa.Schema) -> BlinkTable:
        return self._register(BlinkTable(self, name, schema))

    def ring_table(self, name: str, schema: pa.Schema, capacity: int) -> RingTable:
        return self._register(RingTable(self, name, schema, capacity))

    def static_table(self, name: str, data: pa.Table) -> StaticTable:
        return self._register(StaticTable(self, name, data))

    def remove_table(self, name: str) -> None:
        with self._lock:
            self.tables.pop(name, None)

    def get(self, name: str) -> Table:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"no table named {name!r}") from None

    # -- reading --------------------------------------------------------------------------------
    @contextmanager
    def shared_lock(self):
        """Hold while reading several things that must be consistent with each other."""
        with self._lock:
            yield self

    def snapshot(self, table: Table | str, columns: Optional[Sequence[str]] = None) -> tuple[int, pa.Table]:
        """(step, contents) of a table at a cycle boundary."""
        t = self.get(table) if isinstance(table, str) else table
        with self._lock:
            return self.step, t.gather(columns)

    def add_cycle_listener(self, fn) -> None:
        """`fn(step)` runs at the end of every cycle, still under the lock (for publishers)."""
        with self._lock:
            self._cycle_listeners.append(fn)

    def remove_cycle_listener(self, fn) -> None:
        with self._lock:
            if fn in self._cycle_listeners:
                self._cycle_listeners.remove(fn)

    # -- cycles ---------------------------------------------------------------------------------
    def run_cycle(self) -> dict[str, TableUpdate]:
        """Runs one cycle now; returns the updates by table name."""
        t0 = time.perf_counter()
        with self._lock:
            step = self.step + 1
            changed: list[tuple[Table, TableUpdate]] = []
            with self._intake_lock:
                taken = [(table, table._take_pending()) for table in list(self.tables.values())]
            for table, ops in taken:
                try:
                    update = table._apply_pending(step, ops)
                except Exception as exc:  # a source that fails leaves the others running
                    log.exception("table %r failed to apply its input at step %d", table.name, step)
                    self.errors.append(ListenerError(step, table.name, exc))
                    continue
                if update is not None:
                    table.last_step = step
                    changed.append((table, update))
            self.step = step
            for table, update in changed:
                for fn in list(table.listeners):
                    try:
                        fn(table, update, step)
                    except Exception as exc:
                        log.exception("listener of table %r failed at step %d", table.name, step)
                        self.errors.append(ListenerError(step, table.name, exc))
            for fn in list(self._cycle_listeners):
                try:
                    fn(step)
                except Exception as exc:
                    log.exception("cycle listener failed at step %d", step)
                    self.errors.append(ListenerError(step, "<cycle>", exc))
            for table, _ in changed:
                table._end_cycle()
        self.cycle_seconds.append(time.perf_counter() - t0)
        return {table.name: update for table, update in changed}

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> "UpdateGraph":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tickwire-update-graph", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now < next_at:
                self._stop.wait(next_at - now)
                if self._stop.is_set():
                    break
            next_at = max(next_at + self.interval, time.monotonic())
            try:
                self.run_cycle()
            except Exception:  # never let the cycle thread die
                log.exception("update graph cycle failed")
