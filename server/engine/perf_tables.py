"""Live performance tables: the server's own activity as ticking system tables any client can read.

Three ring tables (the last `capacity` rows each), made in the engine's catalog as system tables
(`TableSpec.system`): resolvable by name (`s/<name>` tickets, subscriptions, DoGet) by any
authenticated client, listed only by a server started with --show-system-tables.

- `tickwire.update_performance`: one row per table per cycle in which the table changed: the step,
  the cycle's start and the time of the record, the cycle's duration so far, the table's name and
  kind, the nanoseconds the table took (applying its input or following its parents, then its
  listeners), the rows added, removed, modified and shifted, and the table's size after the cycle.
  (Deephaven's UpdatePerformanceLog: EvaluationNumber, IntervalStartTime, IntervalEndTime,
  EntryIntervalUsage, EntryIntervalAdded/Removed/Modified/Shifted.)
- `tickwire.barrage_performance`: one row per subscription per interval (`barrage_interval_s`) in
  which it had something to do (messages queued for it, changes coalesced because it was slow,
  messages still waiting for its client), and one when it ends: the messages, bytes and rows
  queued for it in the interval, its queued messages now, the cycles coalesced and the snapshot
  messages in the interval.
- `tickwire.snapshot_performance`: one row per DoGet, snapshot request and snapshot built for
  subscribers: the table, rows, columns, bytes, messages, the nanoseconds spent reading the table
  (`SnapshotNanos`) and encoding and handing it to the transport (`WriteNanos`; null for
  subscriptions, whose writers run per subscriber), and the step it is at (-1 for static tables).

Nothing about the performance tables themselves is recorded (their changes, their subscriptions,
their snapshots), so an idle server's performance tables stay still: a row is only ever caused by
another table's work or a client's call. Recording happens once per cycle, per subscription per
interval and per call, from small Python lists, never per row of data. The rows recorded per cycle
and per snapshot are kept (the newest `capacity` of each) and written every `flush_interval_s` of
the engine's clock, one batch a table, which the next cycle applies: a write costs a few hundred
microseconds whatever its rows, so at a 10 ms cycle a write a cycle cost more than a small table's
cycle it described. Subscriptions' rows are written every `barrage_interval_s`.

One `PerfTables` per engine (`Engine.perf`, made from `EngineConfig.perf_tables`); each server on
the engine attaches its publisher registry (`attach`) and its Flight service records its calls
(`snapshot`). Times come from the engine's clock.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import pyarrow as pa

from tickwire.errors import TickwireError
from tickwire.server.engine.catalog import TableSpec, is_system, kind_of
from tickwire.server.engine.config import PerfTablesConfig
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.graph.tables import Table

if TYPE_CHECKING:
    from tickwire.server.engine.core import Engine
    from tickwire.server.engine.publishing import PublisherRegistry, Subscriber

# a row of a performance table, its columns in the table's schema order
_Row = tuple[Any, ...]

__all__ = ["PerfTablesConfig", "PerfTables", "rows_shifted", "UPDATE_PERFORMANCE",
           "BARRAGE_PERFORMANCE", "SNAPSHOT_PERFORMANCE", "NAMES", "UPDATE_SCHEMA", "BARRAGE_SCHEMA",
           "SNAPSHOT_SCHEMA"]

log = logging.getLogger(__name__)

UPDATE_PERFORMANCE = "tickwire.update_performance"
BARRAGE_PERFORMANCE = "tickwire.barrage_performance"
SNAPSHOT_PERFORMANCE = "tickwire.snapshot_performance"
NAMES = (UPDATE_PERFORMANCE, BARRAGE_PERFORMANCE, SNAPSHOT_PERFORMANCE)

_TIME = pa.timestamp("ns", tz="UTC")
_I64 = pa.int64()

UPDATE_SCHEMA = pa.schema([
    ("Step", _I64), ("IntervalStartTime", _TIME), ("IntervalEndTime", _TIME), ("IntervalDurationNanos", _I64),
    ("TableName", pa.string()), ("TableKind", pa.string()), ("UsageNanos", _I64), ("RowsAdded", _I64),
    ("RowsRemoved", _I64), ("RowsModified", _I64), ("RowsShifted", _I64), ("TableSize", _I64),
])
BARRAGE_SCHEMA = pa.schema([
    ("Time", _TIME), ("IntervalNanos", _I64), ("SubscriptionId", _I64), ("TableName", pa.string()),
    ("Kind", pa.string()), ("Messages", _I64), ("Bytes", _I64), ("Rows", _I64), ("QueuedMessages", _I64),
    ("Coalesced", _I64), ("SnapshotMessages", _I64), ("Growing", pa.bool_()), ("Ended", pa.bool_()),
])
SNAPSHOT_SCHEMA = pa.schema([
    ("Time", _TIME), ("Step", _I64), ("TableName", pa.string()), ("Kind", pa.string()), ("Rows", _I64),
    ("Columns", _I64), ("Bytes", _I64), ("Messages", _I64), ("SnapshotNanos", _I64), ("WriteNanos", _I64),
])
_SCHEMAS = {UPDATE_PERFORMANCE: UPDATE_SCHEMA, BARRAGE_PERFORMANCE: BARRAGE_SCHEMA,
            SNAPSHOT_PERFORMANCE: SNAPSHOT_SCHEMA}
_MAX_KEY = np.iinfo(np.int64).max


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def rows_shifted(update: TableUpdate, rows: RowSet) -> int:
    """Rows a cycle's shifts moved: in each shift's destination range, the table's rows less the
    added ones (destinations hold no row that stayed). Two binary searches per shift in each of
    `rows` and `update.added`: the cost follows the shifts, not the table."""
    shifted = update.shifted
    if shifted.is_empty():
        return 0
    d = shifted.deltas
    lo = shifted.starts + d
    # the end of each destination range, exclusive; clamped where it would pass the largest key
    # (only a shift up can: the bound is computed with the upward part of the delta, so it never overflows)
    hi = np.where(shifted.ends >= _MAX_KEY - 1 - np.maximum(d, 0), _MAX_KEY, shifted.ends + d + 1)
    added = update.added
    return int((rows.rank(hi) - rows.rank(lo)).sum() - (added.rank(hi) - added.rank(lo)).sum())


class _Seen:
    """A subscription's counts when last recorded."""

    __slots__ = ("messages", "bytes", "rows", "coalesced", "snapshots")

    def __init__(self) -> None:
        self.messages = self.bytes = self.rows = self.coalesced = self.snapshots = 0


class PerfTables:
    """The performance tables of one engine and their recording (see the module's text)."""

    def __init__(self, engine: "Engine", config: Optional[PerfTablesConfig] = None):
        self.engine = engine
        self.graph = engine.graph
        self.clock = engine.clock
        self.config = config or PerfTablesConfig()
        self.tables: dict[str, Table] = {}
        self._lock = threading.Lock()
        self._snapshots: collections.deque[_Row] = collections.deque(maxlen=self.config.capacity)
        self._updates: collections.deque[_Row] = collections.deque(maxlen=self.config.capacity)  # cycle thread only
        self._flushed = self.clock.monotonic()
        self._registries: list[PublisherRegistry] = []
        self._seen: dict[Subscriber, _Seen] = {}  # for the subscriptions recorded so far
        self._sampled = self.clock.monotonic()
        self._listening = False

    # -- lifecycle -------------------------------------------------------------------------------------
    def open(self) -> "PerfTables":
        """Makes the tables (once); a name already taken by another kind of table is logged and
        that table is not recorded."""
        for name, schema in _SCHEMAS.items():
            if name in self.tables:
                continue
            spec = TableSpec(name, "ring", schema, capacity=self.config.capacity, system=True, durable=False)
            try:
                table, _created = self.engine.get_or_create(spec)
            except TickwireError as exc:
                log.warning("performance table %r not recorded: %s", name, exc)
                continue
            self.tables[name] = table
        return self

    def attach(self, registry: "PublisherRegistry") -> None:
        """Records the subscriptions of `registry` (a PublisherRegistry) and the snapshots built for
        them; the first attach starts listening to the graph's cycles."""
        self.open()
        with self.engine.reading():  # no cycle runs meanwhile
            if registry not in self._registries:
                self._registries.append(registry)
                registry.on_snapshot = self._subscription_snapshot
            if not self._listening:
                self._listening = True
                self._sampled = self._flushed = self.clock.monotonic()
                self.graph.add_cycle_listener(self._on_cycle)

    def detach(self, registry: "PublisherRegistry") -> None:
        with self.engine.reading():  # no cycle runs meanwhile
            if registry in self._registries:
                self._registries.remove(registry)
                if registry.on_snapshot == self._subscription_snapshot:
                    registry.on_snapshot = None
            if not self._registries and self._listening:
                self._listening = False
                self.graph.remove_cycle_listener(self._on_cycle)
                self._seen.clear()
                self._flush()  # what the last interval recorded, for a reader of the tables after

    # -- snapshots (any thread) ------------------------------------------------------------------------
    def snapshot(self, table: Table, kind: str, *, rows: int, columns: int, nbytes: int, messages: int,
                 snapshot_s: float, write_s: Optional[float], step: int) -> None:
        """Records one snapshot of `table` (kind "doget", "snapshot" or "subscription"); the next
        cycle writes it."""
        if is_system(table) or SNAPSHOT_PERFORMANCE not in self.tables:
            return
        row = (self.clock.now_ns(), int(step), table.name, kind, int(rows), int(columns), int(nbytes), int(messages),
               _ns(snapshot_s), None if write_s is None else _ns(write_s))
        with self._lock:
            self._snapshots.append(row)

    def record_snapshot(self, table: Table, kind: str, **figures: Any) -> None:
        """`snapshot`, for callers whose answer must not depend on it: a failure is only logged."""
        try:
            self.snapshot(table, kind, **figures)
        except Exception:  # noqa: BLE001 - recording never changes the call's answer
            log.debug("recording a snapshot", exc_info=True)

    def _subscription_snapshot(self, table: Table, rows: int, columns: int, nbytes: int, seconds: float, step: int,
                               messages: int) -> None:
        self.snapshot(table, "subscription", rows=rows, columns=columns, nbytes=nbytes, messages=messages,
                      snapshot_s=seconds, write_s=None, step=step)

    # -- the cycle listener (under the graph's lock) ---------------------------------------------------
    def _on_cycle(self, step: int) -> None:
        self._updates.extend(self._update_rows(step))
        now = self.clock.monotonic()
        if now - self._flushed >= self.config.flush_interval_s:
            self._flushed = now
            self._flush()
        if now - self._sampled >= self.config.barrage_interval_s:
            rows = self._barrage_rows(now - self._sampled)
            self._sampled = now
            self._write(BARRAGE_PERFORMANCE, BARRAGE_SCHEMA, rows)

    def _flush(self) -> None:
        """Writes the cycles' and the snapshots' rows kept since the last flush."""
        self._write(UPDATE_PERFORMANCE, UPDATE_SCHEMA, list(self._updates))
        self._updates.clear()
        with self._lock:
            snaps = list(self._snapshots)
            self._snapshots.clear()
        self._write(SNAPSHOT_PERFORMANCE, SNAPSHOT_SCHEMA, snaps)

    def _update_rows(self, step: int) -> list[_Row]:
        g = self.graph
        updates, work = g.cycle_updates, g.cycle_work
        if not updates:
            return []
        # the cycle's start by the clock, its duration so far measured (as the tables' usage is)
        took = _ns(time.perf_counter() - g.cycle_perf_started)
        start_ns = _ns(g.cycle_started)
        end_ns = start_ns + took
        out = []
        for name, update in updates.items():
            table = self.engine.resolve(name, hidden=True)
            if table is None or is_system(table):
                continue
            rows = table.rowset
            out.append((step, start_ns, end_ns, took, name, kind_of(table), _ns(work.get(name, 0.0)),
                        len(update.added), len(update.removed), len(update.modified),
                        rows_shifted(update, rows), len(rows)))
        return out

    def _barrage_rows(self, interval: float) -> list[_Row]:
        now_ns, interval_ns = self.clock.now_ns(), _ns(interval)
        live: dict[Subscriber, None] = {}
        for registry in self._registries:
            for sub in registry.subscriptions:
                if not is_system(sub.publisher.table):
                    live[sub] = None
        out = []
        for sub in list(self._seen):
            if sub not in live:  # ended since the last record: what it did meanwhile, marked ended
                ended = self._barrage_row(sub, now_ns, interval_ns, ended=True)
                assert ended is not None  # an ended subscription always gets its row
                out.append(ended)
                del self._seen[sub]
        for sub in live:
            row = self._barrage_row(sub, now_ns, interval_ns, ended=False)
            if row is not None:
                out.append(row)
        return out

    def _barrage_row(self, sub: "Subscriber", now_ns: int, interval_ns: int, *, ended: bool) -> Optional[_Row]:
        seen = self._seen.get(sub)
        if seen is None:
            seen = self._seen[sub] = _Seen()
        messages, nbytes, rows = sub.messages, sub.bytes, sub.rows
        coalesced, snaps = sub.coalesced, sub.snapshot_messages
        queued = 0 if ended else sub.pending()
        d_messages = messages - seen.messages
        d_coalesced = coalesced - seen.coalesced
        if not (ended or d_messages or d_coalesced or queued):
            return None  # nothing to say about an idle subscription
        row = (now_ns, interval_ns, sub.id, sub.publisher.table.name, _kind(sub), d_messages, nbytes - seen.bytes,
               rows - seen.rows, queued, d_coalesced, snaps - seen.snapshots, sub.growing, ended)
        seen.messages, seen.bytes, seen.rows, seen.coalesced, seen.snapshots = messages, nbytes, rows, coalesced, snaps
        return row

    def _write(self, name: str, schema: pa.Schema, rows: list[_Row]) -> None:
        table = self.tables.get(name)
        if not rows or table is None:
            return
        columns = list(zip(*rows))
        data = pa.Table.from_arrays([_array(c, f.type) for c, f in zip(columns, schema)], schema=schema)
        try:
            self.engine.write(table, data, wait=False)
        except TickwireError:
            log.debug("performance table %r refused a write", name, exc_info=True)


def _array(values: tuple[Any, ...], t: pa.DataType) -> pa.Array:
    """A column of recorded values; times (integers of nanoseconds) are made as int64 and viewed as
    their type, which skips pyarrow's time-zone lookups (a dozen environment reads a column)."""
    if pa.types.is_timestamp(t):
        return pa.array(values, type=_I64).view(t)
    return pa.array(values, type=t)


def _kind(sub: "Subscriber") -> str:
    view = sub.view if sub.view is not None else sub.requested
    return "full" if view is None or view.is_full else "viewport"

