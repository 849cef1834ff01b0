"""The update graph: one thread runs cycles; a cycle applies every source's queued input and
delivers one consistent update per changed table to its listeners, in dependency order.

The step counter is the logical clock: each cycle increments it, and each changed table records
it as its `last_step`. A cycle runs entirely under the graph's lock (`graph.lock`), so a reader
holding it (or calling `snapshot`) sees every table as it was at a cycle boundary. Producers never
wait for a cycle: queuing input only takes the short intake lock (`intake_lock`).

The graph is the engine's own: nothing outside `tickwire.server.engine` names it, its lock or its
intake lock (the engine's `reading()` and `writing()` are the one boundary). Tables are made
through the engine's catalog; a table registers itself here when constructed (`add_table`).

Cycle order: (1) take every source's queued input at once; (2) apply it to each source; (3) walk
the tables in dependency order (parents before the tables derived from them): a derived table
follows its parents' updates, then each changed table's listeners run; (4) cycle listeners run;
(5) the per-cycle state (previous values and row sets) is dropped. A source whose input fails to
apply, or a listener that raises, is logged with the table's name and recorded in `errors`; the
other tables still update.

A derived table whose computation raises (a formula that overflows, a cast that fails, ...) is
*failed*, as Deephaven fails a table whose listener raises: its `failure` records the step, the
table whose computation raised and the error; it stops updating and stays failed, and its contents
are no longer served, since its state is no longer known to be right. Every table derived from it
fails with it in the same cycle, and a table can no longer be derived from it (`TableFailedError`).
Its parents and the other tables keep updating. A view computes its columns when read, so a view's
formula fails it (`fail`) when a read raises, in a cycle or between cycles. Listeners that have an
`on_failure(table, failure)` method (see `TableListener`) are told once; reading a failed table
with `snapshot` raises `TableFailedError`.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Hashable, Iterable, Optional, Protocol, Sequence, runtime_checkable

import pyarrow as pa

from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.errors import TickwireError
from tickwire.server.engine.errors import CatalogError, OperationError
from tickwire.server.engine.graph.sources import SourceTable
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.graph.tables import Listener, Table

__all__ = ["UpdateGraph", "CycleHooks", "CycleErrorRecord", "TableFailure", "TableFailedError", "TableListener"]

log = logging.getLogger(__name__)


@runtime_checkable
class CycleHooks(Protocol):
    """What the graph calls on each table in a cycle, under its lock (every Table has them; a
    source overrides `take_pending`/`apply_pending`, a derived table `follow_parents`):

    1. `take_pending()`, with the intake lock held, for every source: the input queued since the
       last cycle;
    2. `apply_pending(step, ops)` for each source: applies it, returns the update or None;
    3. `follow_parents(step, updates)` for a derived table whose parents changed: its update;
    4. `end_cycle()` for every changed (or failed) table: drops the cycle's previous state."""

    def take_pending(self) -> list[Any]: ...

    def apply_pending(self, step: int, ops: list[Any]) -> Optional[TableUpdate]: ...

    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]: ...

    def end_cycle(self) -> None: ...


class InputJournal(Protocol):
    """What `UpdateGraph.set_input_journal` takes: `record(step, {table: (ops, batch_ids)})` makes
    a cycle's input durable and returns the tables whose input it could not."""

    def record(self, step: int, inputs: dict[SourceTable, tuple[list[Any], list[Hashable]]]
               ) -> Iterable[SourceTable]: ...


class CycleErrorRecord:
    """The record (not an exception) of a failure during a cycle: the step, the table's name ('<cycle>' for
    cycle listeners) and the error raised."""

    __slots__ = ("step", "table", "error")

    def __init__(self, step: int, table: str, error: BaseException):
        self.step, self.table, self.error = step, table, error

    def __repr__(self) -> str:
        return f"CycleErrorRecord(step={self.step}, table={self.table!r}, error={self.error!r})"


class TableFailure:
    """Why a table failed: at `step`, the computation of table `origin` (this table itself, or a
    table it is derived from) raised `error` while `what`. `message` names both tables and the error."""

    __slots__ = ("step", "table", "origin", "what", "error", "message")

    def __init__(self, step: int, table: str, origin: str, what: str, error: BaseException):
        self.step, self.table, self.origin, self.what, self.error = step, table, origin, what, error
        cause = f"{type(error).__name__}: {error}"
        if origin == table:
            self.message = f"table {table!r} failed at step {step} {what}: {cause}"
        else:
            self.message = (f"table {table!r} failed at step {step}: table {origin!r}, which it is derived "
                            f"from, failed {what}: {cause}")

    def derived(self, table: str) -> "TableFailure":
        """The failure of a table derived from this one."""
        return TableFailure(self.step, table, self.origin, self.what, self.error)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"TableFailure({self.message!r})"


class TableFailedError(TickwireError, ValueError):
    """A failed table was read or derived from; `failure` says why it failed. `code` is the gRPC
    status a server answers with."""

    code = "FAILED_PRECONDITION"

    def __init__(self, failure: TableFailure):
        super().__init__(failure.message)
        self.failure = failure


class TableListener:
    """A table listener that also hears of the table's failure: `on_update(table, update, step)`
    after each cycle that changed the table, `on_failure(table, failure)` once when it fails."""

    __slots__ = ("on_update", "on_failure")

    def __init__(self, on_update: Listener, on_failure: Callable[[Table, TableFailure], None]):
        self.on_update, self.on_failure = on_update, on_failure

    def __call__(self, table: Table, update: TableUpdate, step: int) -> None:
        self.on_update(table, update, step)


class UpdateGraph:
    """Runs cycles every `interval_ms` of `clock` on one daemon thread (`start`/`stop`), sooner
    when kicked (`kick`), or on demand with `run_cycle()` (deterministic stepping for tests)."""

    def __init__(self, interval_ms: float = 100.0, max_errors: int = 1000, clock: Clock = SYSTEM_CLOCK):
        if not interval_ms > 0:
            raise ValueError(f"interval_ms must be positive, got {interval_ms}")
        self.clock = clock
        self.interval_ms = float(interval_ms)
        self.step = 0
        self.tables: dict[str, Table] = {}
        self.errors: collections.deque[CycleErrorRecord] = collections.deque(maxlen=max_errors)
        self.lock = threading.RLock()
        self.intake_lock = threading.Lock()
        self._input_journal: Optional[InputJournal] = None
        self._order: list[Table] = []
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by kick() and stop(): the cycle thread stops waiting
        self._thread: Optional[threading.Thread] = None
        self._cycle_listeners: list[Callable[[int], None]] = []
        self.cycle_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        # what the cycle listeners may read about the cycle that calls them: when it started
        # (the clock's now()), each changed table's update, and the seconds each changed table took
        # (applying its input or following its parents, then its listeners)
        self.cycle_started = 0.0
        self.cycle_perf_started = 0.0
        self.cycle_updates: dict[str, TableUpdate] = {}
        self.cycle_work: dict[str, float] = {}

    @property
    def interval(self) -> float:
        """The cycle interval in seconds."""
        return self.interval_ms / 1000.0

    # -- tables ---------------------------------------------------------------------------------
    def add_table(self, table: Table) -> None:
        """Registers a table being constructed (`Table.__init__` calls it)."""
        with self.lock:
            if table.name in self.tables:
                raise CatalogError(f"a table named {table.name!r} already exists", "ALREADY_EXISTS")
            for p in table.parents:
                if self.tables.get(p.name) is not p:
                    raise OperationError(f"table {table.name!r}: parent {p.name!r} is not a table of this graph")
                if p.failure is not None:
                    raise TableFailedError(p.failure)
            self.tables[table.name] = table
            # stable sort: by depth, then registration order
            self._order = sorted(self.tables.values(), key=lambda t: t.depth)

    def remove_table(self, name: str) -> None:
        with self.lock:
            t = self.tables.get(name)
            if t is None:
                return
            children = [c.name for c in self.tables.values() if t in c.parents]
            if children:
                raise CatalogError(f"table {name!r} has derived tables {children}; remove them first",
                                   "FAILED_PRECONDITION")
            del self.tables[name]
            self._order = [x for x in self._order if x is not t]

    def get(self, name: str) -> Table:
        try:
            return self.tables[name]
        except KeyError:
            raise KeyError(f"no table named {name!r}") from None

    # -- reading --------------------------------------------------------------------------------
    def snapshot(self, table: Table | str, columns: Optional[Sequence[str]] = None) -> tuple[int, pa.Table]:
        """(step, contents) of a table at a cycle boundary."""
        t = self.get(table) if isinstance(table, str) else table
        with self.lock:
            if t.failure is not None:
                raise TableFailedError(t.failure)
            return self.step, t.gather(columns)

    def add_cycle_listener(self, fn: Callable[[int], None]) -> None:
        """`fn(step)` runs at the end of every cycle, under the lock, after the tables' listeners
        (and before the changed tables drop their previous state); `cycle_updates`, `cycle_work`
        and `cycle_started` describe that cycle while it runs."""
        with self.lock:
            self._cycle_listeners.append(fn)

    def remove_cycle_listener(self, fn: Callable[[int], None]) -> None:
        with self.lock:
            if fn in self._cycle_listeners:
                self._cycle_listeners.remove(fn)

    # -- cycles ---------------------------------------------------------------------------------
    def _report(self, step: int, name: str, exc: BaseException, what: str) -> None:
        log.error("%s of table %r failed at step %d: %r", what, name, step, exc, exc_info=exc)
        self.errors.append(CycleErrorRecord(step, name, exc))

    def fail(self, table: Table, what: str, error: BaseException) -> TableFailure:
        """Fails a derived table whose values cannot be computed when read (a view's formula
        raising), with every table derived from it; returns its failure (the first one when it
        had already failed)."""
        with self.lock:
            if table.failure is not None:
                return table.failure
            if not table.parents:
                raise OperationError(f"table {table.name!r} is a source; only derived tables fail")
            step = self.step
            self._report(step, table.name, error, what)
            failure = TableFailure(step, table.name, table.name, what, error)
            self._fail(step, table, failure)
            for t in list(self._order):  # parents before the tables derived from them
                if t.failure is None and t.parents:
                    broken = next((p.failure for p in t.parents if p.failure is not None), None)
                    if broken is not None:
                        self._fail(step, t, broken.derived(t.name))
            return failure

    def _fail(self, step: int, table: Table, failure: TableFailure) -> None:
        """Marks a derived table failed and tells its listeners that have an `on_failure`."""
        table.failure = failure
        table.end_cycle()
        if failure.origin != table.name:
            log.error("table %r failed at step %d with table %r it is derived from", table.name, step, failure.origin)
        for fn in list(table.listeners):
            on_failure = getattr(fn, "on_failure", None)
            if on_failure is None:
                continue
            try:
                on_failure(table, failure)
            except Exception as exc:  # noqa: BLE001 - a listener's bug is reported, the others still hear
                self._report(step, table.name, exc, "a listener's failure callback")

    def set_input_journal(self, journal: Optional[InputJournal]) -> None:
        """`journal.record(step, {table: (ops, batch_ids)})` is called in every cycle, before the
        input of the tables flagged `journaled` is applied, and returns the tables whose input it
        could not make durable: their input of that cycle is dropped (its batch ids forgotten, so
        a producer may send it again) rather than applied without being on disk."""
        with self.lock:
            self._input_journal = journal

    def _journal_inputs(self, step: int, order: list[Table], taken: dict[str, list[Any]]) -> None:
        inputs = {t: (taken[t.name], t.taken_batches) for t in order
                  if not t.parents and isinstance(t, SourceTable) and t.journaled
                  and (taken.get(t.name) or t.taken_batches)}
        if not inputs:
            return
        journal = self._input_journal
        assert journal is not None  # run_cycle journals only with a journal set
        try:
            refused: Iterable[SourceTable] = journal.record(step, inputs)
        except Exception as exc:  # noqa: BLE001 - the journal itself broke: nothing it was given is durable
            self._report(step, "<journal>", exc, "journaling the input")
            refused = set(inputs)
        for t in refused:
            t.forget_batches(t.taken_batches)
            taken[t.name] = []

    def run_cycle(self) -> dict[str, TableUpdate]:
        """Runs one cycle now; returns the updates by table name."""
        t0 = time.perf_counter()
        clock = time.perf_counter
        with self.lock:
            self.cycle_started = self.clock.now()
            self.cycle_perf_started = t0  # for the measured duration so far (cycle listeners)
            work: dict[str, float] = {}
            step = self.step + 1
            order = list(self._order)
            with self.intake_lock:
                taken = {t.name: t.take_pending() for t in order if not t.parents}
            if self._input_journal is not None:
                self._journal_inputs(step, order, taken)
            updates: dict[str, TableUpdate] = {}
            for table in order:
                if table.parents:
                    continue
                ops = taken.get(table.name) or []
                t1 = clock()
                try:
                    update = table.apply_pending(step, ops)
                except Exception as exc:  # noqa: BLE001 - one failing source leaves the others running
                    self._report(step, table.name, exc, "applying the input")
                    table.end_cycle()
                    continue
                if update is not None:
                    updates[table.name] = update
                    work[table.name] = clock() - t1
            self.step = step
            changed: list[Table] = []
            for table in order:
                if table.failure is not None:
                    continue  # failed in an earlier cycle: it no longer updates
                if table.parents:
                    broken = next((p.failure for p in table.parents if p.failure is not None), None)
                    if broken is not None:  # failed this cycle (parents come first in `order`)
                        self._fail(step, table, broken.derived(table.name))
                        continue
                t1 = clock()
                if table.parents and any(p.name in updates for p in table.parents):
                    try:
                        update = table.follow_parents(step, updates)
                    except TableFailedError as exc:  # reading a parent failed it (a view's formula)
                        if table.failure is None:
                            self._fail(step, table, exc.failure.derived(table.name))
                        continue
                    except Exception as exc:  # noqa: BLE001 - recorded as the table's failure
                        # its state may be half changed: the table fails rather than go on without
                        # the rows of this cycle
                        self._report(step, table.name, exc, "following the parents")
                        self._fail(step, table, TableFailure(step, table.name, table.name,
                                                             "following its parents", exc))
                        continue
                    if update is not None:
                        updates[table.name] = update
                update = updates.get(table.name)
                if update is None:
                    continue
                table.last_step = step
                changed.append(table)
                for fn in list(table.listeners):
                    try:
                        fn(table, update, step)
                    except Exception as exc:  # noqa: BLE001 - a listener's bug is reported, the others still hear
                        self._report(step, table.name, exc, "a listener")
                work[table.name] = work.get(table.name, 0.0) + clock() - t1
            self.cycle_updates, self.cycle_work = updates, work
            for cycle_fn in list(self._cycle_listeners):
                try:
                    cycle_fn(step)
                except Exception as exc:  # noqa: BLE001 - a cycle listener's bug is reported, the cycle goes on
                    self._report(step, "<cycle>", exc, "a cycle listener")
            self.cycle_updates, self.cycle_work = {}, {}
            for table in changed:
                table.end_cycle()
        self.cycle_seconds.append(time.perf_counter() - t0)
        return updates

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def kick(self) -> None:
        """Runs the next cycle now instead of at its time (a write that should not wait)."""
        self._wake.set()

    def start(self) -> "UpdateGraph":
        if not self.running:
            self._stop.clear()
            self._wake.clear()
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
        clock = self.clock
        next_at = clock.monotonic()
        while not self._stop.is_set():
            now = clock.monotonic()
            if now < next_at:
                clock.wait(self._wake, next_at - now)  # the cycle's time, a kick or stop
                if self._stop.is_set():
                    break
            self._wake.clear()
            next_at = max(next_at + self.interval, clock.monotonic())
            try:
                self.run_cycle()
            except Exception:  # the cycle thread never dies
                log.exception("update graph cycle failed")

    def __enter__(self) -> "UpdateGraph":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
