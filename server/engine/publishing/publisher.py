"""Publishing a table to Barrage subscribers.

One `Publisher` per subscribed table follows the table's updates in the update graph's cycle
thread. Each `Subscriber` remembers what its client holds and the table's changes it has not
been sent yet, coalesced into one `TableUpdate` (`behind`). At the end of each cycle the
publisher turns that into at most one message per subscriber, reading the values of the rows the
message carries under the graph's lock (cost follows the change and the viewport, not the
table). Subscribers that are in step and want the same columns share one message object, so the
values are gathered once and the FlightData encoded once per set of options.

Memory per subscriber is bounded: its outbox holds at most `outbox` messages (ServerConfig); while it is full
(the client is not reading), new changes are only coalesced into `behind`, whose size is bounded
by the table's, and go out as one message once the client reads again. Other subscribers are
never held up by a slow one: the cycle thread never waits on a client.

When the table fails (see `UpdateGraph`), every subscription gets the failure: its writer sends
what is already in the outbox, then `take` raises `SubscriptionError` (FAILED_PRECONDITION, the
failure's message); new subscriptions and snapshots of a failed table are refused the same way.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import numpy as np

from tickwire.server.engine.config import EncodeLimits, PublishingConfig
from tickwire.server.engine.graph import ModifiedColumnSet, RowSet, RowSetShiftData, Table, TableUpdate
from tickwire.server.engine.graph.graph import TableFailedError, TableFailure, TableListener
from tickwire.server.engine.publishing.messages import (
    EncodeOptions,
    Message,
    RequestOptions,
    TableWire,
    metadata_bytes,
)
from tickwire.server.engine.publishing.views import (
    Plan,
    SubscriptionError,
    View,
    plan_full,
    plan_viewport,
    requested,
    window_keys,
)

if TYPE_CHECKING:
    from tickwire.server.engine.core import Engine

__all__ = ["DogetSnapshot", "Publisher", "Subscriber", "PublisherRegistry", "snapshot_message"]

log = logging.getLogger(__name__)

_EMPTY_SHIFTS = RowSetShiftData()
_SUBSCRIBER_IDS = itertools.count(1)

# a shared initial snapshot's key: (columns, columns_as_list)
_LogKey = tuple[tuple[int, ...], bool]
# one cycle's messages shared by subscribers asking the same thing: key -> (the pending update
# they were behind by, the client's keys before, after, the message)
_Shared = dict[tuple[Any, ...], tuple[Optional[TableUpdate], RowSet, RowSet, Message]]
# on_snapshot(table, rows, columns, bytes, seconds, step, messages)
SnapshotHook = Callable[[Table, int, int, int, float, int, int], None]


class Subscriber:
    """Server-side state of one subscriber (what its client holds, what it has not been sent);
    transports reach it through a SubscriptionHandle."""

    def __init__(self, publisher: "Publisher", view: View, options: RequestOptions, notify: Callable[[], None]):
        self.publisher = publisher
        self.id = next(_SUBSCRIBER_IDS)
        self.encode = EncodeOptions.of(options)
        interval_ms = int(getattr(options, "min_update_interval_ms", 0) or 0) if options is not None else 0
        self.interval = max(0, interval_ms) / 1000.0
        self.requested: Optional[View] = view  # a view not yet answered with a snapshot
        self.view: Optional[View] = None  # the view of the last snapshot sent
        self.client_keys = RowSet()  # full: unused; viewport: the window's keys the client holds
        self.behind: Optional[TableUpdate] = None
        self.behind_prev: Optional[RowSet] = None
        self.behind_first = 0
        self.behind_last = 0
        self.outbox: collections.deque[Message] = collections.deque()
        self.lock = threading.Lock()
        self.notify = notify
        self.closed = False
        self.last_sent = 0.0
        self.messages = 0
        self.coalesced = 0  # cycles folded into an earlier pending change because the client was slow
        self.bytes = 0  # of the messages queued (`Message.nbytes`)
        self.rows = 0  # carried by the messages queued (added and modified)
        self.snapshot_messages = 0  # messages of snapshots (an initial one may come in pieces)
        self.log: Optional[SnapshotLog] = None  # a shared initial snapshot this subscriber is replaying
        self.cursor = 0  # the next message of `log` to queue
        self.failure: Optional[TableFailure] = None  # the table failed: no more messages after the outbox

    def take(self, background: Optional[Callable[[Callable[[], None]], None]] = None) -> Optional[Message]:
        """The next message for the writer, or None. When this empties the outbox while changes
        are waiting (the client was slow), their message is built right away rather than at the
        next cycle: by `background(fn)` when given (take itself then never blocks, and the new
        message arrives with a notify), else here, which may take the graph's lock."""
        with self.lock:
            msg = self.outbox.popleft() if self.outbox else None
            drained = not self.outbox
        if msg is None and self.failure is not None:
            raise _failed(self.failure)
        if msg is not None and drained and not self.closed and self.failure is None \
                and (self.behind is not None or self.requested is not None or self.log is not None):
            if background is None:
                self.publisher.catch_up(self)
            else:
                self.publisher.catch_up_later(self, background)
        return msg

    @property
    def growing(self) -> bool:
        """True while the subscriber is still being sent its initial snapshot (in pieces)."""
        return self.log is not None

    def pending(self) -> int:
        with self.lock:
            return len(self.outbox)

    def push(self, msg: Message, snapshot: bool = False) -> None:
        with self.lock:
            self.outbox.append(msg)
        self.messages += 1
        self.bytes += msg.nbytes
        self.rows += msg.rows
        if snapshot:
            self.snapshot_messages += 1
        self.last_sent = self.publisher.clock.monotonic()
        held = self.publisher.held_notices
        if held is not None:
            held.append(self)  # the cycle tells every writer at once when it has queued them all
            return
        self.wake()

    def wake(self) -> None:
        try:
            self.notify()
        except Exception:  # a closed transport; the writer's end cleans up
            log.debug("notify failed", exc_info=True)

    def change(self, view: View) -> None:
        """A new view (viewport, columns, direction) asked for mid-stream."""
        self.publisher.change(self, view)

    def close(self) -> None:
        self.publisher.unsubscribe(self)

    def fail(self, failure: TableFailure) -> None:
        self.failure = failure
        self.behind = self.behind_prev = None
        try:
            self.notify()  # the writer wakes, sends the outbox and ends the call
        except Exception:
            log.debug("notify failed", exc_info=True)


class SnapshotLog:
    """The messages that take a new full subscriber from nothing to the table at `end_step`,
    shared by every subscriber that joins with the same columns.

    Subscribers that arrive while the log is usable replay its messages (references to the same
    Message objects, whose FlightData are encoded once) and then receive `since`, the table's
    changes after the log's end, as one ordinary update. So N subscribers that stop reading hold
    one copy of the initial snapshot, not N, however far apart they joined. A large table's log is
    built piece by piece, one piece per cycle, whether or not anybody reads it (the pieces are
    built under the graph's lock, each sized to a few milliseconds of reading)."""

    def __init__(self, view: View, growing: bool):
        self.view = view
        self.messages: list[Message] = []
        self.complete = not growing
        self.delivered = RowSet()  # while building: the keys the messages so far hold
        self.since: Optional[TableUpdate] = None  # changes after the last message (coalesced)
        self.since_prev: Optional[RowSet] = None
        self.since_first = 0
        self.since_last = 0
        self.readers = 0
        self.start_step = 0
        self.remeta: Optional[Callable[[int], bytes]] = None  # a one-message log's metadata at another step
        self.changed = 0  # rows touched by `since` (added + removed + modified), to know when to retire
        self.seconds = 0.0  # spent reading the snapshot's pieces

    def track(self, update: TableUpdate, prev: RowSet, step: int) -> None:
        if self.since is None:
            self.since, self.since_prev, self.since_first = update, prev, step
        else:
            assert self.since_prev is not None  # set with `since`
            self.since = self.since.coalesce(update, self.since_prev)
        self.since_last = step
        self.changed += len(update.added) + len(update.removed) + len(update.modified)


def _failed(failure: TableFailure) -> SubscriptionError:
    return SubscriptionError(failure.message, "FAILED_PRECONDITION")


class Publisher:
    """Follows one table and serves its subscriptions."""

    def __init__(self, registry: "PublisherRegistry", table: Table):
        self.registry = registry
        self.table = table
        self.graph = registry.engine.graph
        self.clock = registry.engine.clock
        self.wire = TableWire(table)
        self.subs: list[Subscriber] = []
        self._listener = TableListener(self._on_update, self._on_failure)
        self._attached = False
        self._shared_step = -1
        self._shared: _Shared = {}  # this step's messages, shared by subscribers asking the same thing
        self._logs: dict[_LogKey, SnapshotLog] = {}  # usable initial snapshots, by (columns, whole)
        self._replayed: list[SnapshotLog] = []  # logs that left `_logs` but still have readers
        # while a cycle or catch-up queues its messages, the subscribers to tell once they all are
        # (see _service_all)
        self.held_notices: Optional[list[Subscriber]] = None
        # subscribers whose writers emptied their outbox while changes wait, for one background job
        self._catching: dict[Subscriber, None] = {}
        self._catch_lock = threading.Lock()

    @property
    def kept_snapshots(self) -> int:
        """Initial snapshots kept for later joiners (at most the registry's shared_snapshots)."""
        return len(self._logs)

    def _shared_for(self, step: int) -> _Shared:
        if step != self._shared_step:
            self._shared_step, self._shared = step, {}
        return self._shared

    # -- membership (any thread) ------------------------------------------------------------------
    def subscribe(self, view: View, options: RequestOptions, notify: Callable[[], None]) -> Subscriber:
        self._check_view(view)
        sub = Subscriber(self, view, options, notify)
        with self.graph.lock:
            if self.table.failure is not None:
                raise _failed(self.table.failure)
            if not self._attached:
                self.table.add_listener(self._listener)
                self.graph.add_cycle_listener(self._on_cycle)
                self._attached = True
            self.subs.append(sub)
            self._service(sub, self.graph.step, self.clock.monotonic())
        return sub

    def change(self, sub: Subscriber, view: View) -> None:
        self._check_view(view)
        current = sub.requested or sub.view
        if current is not None and current.is_full != view.is_full:
            raise SubscriptionError("cannot change from full subscription to viewport or vice versa")
        with self.graph.lock:
            if sub.closed:
                return
            sub.requested = view
            self._service(sub, self.graph.step, self.clock.monotonic())

    def catch_up(self, sub: Subscriber) -> None:
        with self.graph.lock:
            step = self.graph.step
            self._service(sub, step, self.clock.monotonic(), self._shared_for(step))

    def catch_up_later(self, sub: Subscriber, background: Callable[[Callable[[], None]], None]) -> None:
        """`catch_up(sub)` by `background(fn)`, with every other subscriber asking meanwhile: one
        job a publisher at a time, which serves all of them under one hold of the graph's lock.
        A job a subscriber (as it was) let a thousand subscribers' writers queue thousands of jobs
        a second on the server's worker pool, each waiting for the graph's lock: with 100 full and
        1,000 viewport subscribers the pool's queue reached 11,000 jobs, 0.6 s of waiting at the
        median, and everything else the pool runs (subscribing, snapshots, DoGets) waited behind them."""
        with self._catch_lock:
            scheduled = bool(self._catching)  # a job is queued while anybody waits for one
            self._catching[sub] = None
        if scheduled:
            return
        try:
            background(self._catch_up_all)
        except BaseException:
            with self._catch_lock:
                self._catching.clear()  # no job will serve them (the pool is gone); the cycle still does
            raise

    def _catch_up_all(self) -> None:
        with self._catch_lock:
            subs, self._catching = list(self._catching), {}
        subs = [s for s in subs if not s.closed and s.failure is None]
        if not subs:
            return
        with self.graph.lock:
            step = self.graph.step
            self._service_all(subs, step, self.clock.monotonic(), self._shared_for(step))

    def _service_all(self, subs: list[Subscriber], step: int, now: float, shared: Optional[_Shared]) -> None:
        """`_service` for each of `subs`; one failing is logged and the others are still served.
        Their writers are told once every message is queued: a writer woken at the first one takes
        the interpreter lock from this thread for each of the rest (a hand-off of the lock per
        message, and a cycle or catch-up that finishes behind the sending it started)."""
        held: list[Subscriber] = []
        self.held_notices = held  # under the graph's lock, as every caller is
        try:
            for sub in subs:
                try:
                    self._service(sub, step, now, shared)
                except Exception:
                    log.exception("table %r: building a message for a subscriber failed", self.table.name)
        finally:
            self.held_notices = None
            for sub in held:
                sub.wake()

    def unsubscribe(self, sub: Subscriber) -> None:
        with self.graph.lock:
            sub.closed = True
            with sub.lock:
                sub.outbox.clear()
            sub.behind = sub.behind_prev = None
            self._leave_log(sub)
            if sub in self.subs:
                self.subs.remove(sub)
            if not self.subs and self._attached:
                self.table.remove_listener(self._listener)
                self.graph.remove_cycle_listener(self._on_cycle)
                self._attached = False
                self._logs.clear()
                self._replayed.clear()
                self.registry.drop(self)

    def _check_view(self, view: View) -> None:
        """A View made from a request (`views.requested`) was checked for this table already; one
        built by hand is checked here, by the same rules."""
        n = len(self.wire.names)
        if view.checked_for == n:
            return
        requested(view.columns, None if view.viewport is None else view.viewport.ranges(), view.reverse, ncols=n,
                  blink=bool(self.table.attributes.get("BlinkTable")), max_ranges=self.registry.max_viewport_ranges,
                  what="subscription columns", table=self.table.name)

    # -- the cycle thread ---------------------------------------------------------------------------
    def _on_update(self, table: Table, update: TableUpdate, step: int) -> None:
        prev = table.prev_rowset if table.prev_rowset is not None else self._prev_of(update, table.rowset)
        merged: dict[int, tuple[TableUpdate, TableUpdate]] = {}  # subscribers behind by the same change stay shared
        self._track_logs(update, prev, step)
        for sub in self.subs:
            if sub.view is None:
                continue  # its snapshot is still to come and will be taken from the new state
            if sub.behind is None:
                sub.behind, sub.behind_prev, sub.behind_first = update, prev, step
            else:
                hit = merged.get(id(sub.behind))
                assert sub.behind_prev is not None  # set with `behind`
                if hit is None or hit[0] is not sub.behind:
                    hit = merged[id(sub.behind)] = (sub.behind, sub.behind.coalesce(update, sub.behind_prev))
                sub.behind = hit[1]
                sub.coalesced += 1
            sub.behind_last = step

    def _on_failure(self, table: Table, failure: TableFailure) -> None:
        for sub in list(self.subs):
            sub.fail(failure)

    @staticmethod
    def _prev_of(update: TableUpdate, rows: RowSet) -> RowSet:
        return update.shifted.unapply(rows.minus(update.added)).union(update.removed)

    def _on_cycle(self, step: int) -> None:
        now = self.clock.monotonic()
        shared = self._shared_for(step)
        building = [lg for lg in (*self._logs.values(), *self._replayed) if not lg.complete]
        for lg in building:
            if self.table.failure is None:
                try:
                    self._build_log(lg, step)
                except Exception:
                    log.exception("table %r: building a shared snapshot failed", self.table.name)
                    self._retire(lg)
        self._service_all(list(self.subs), step, now, shared)

    def _service(self, sub: Subscriber, step: int, now: float, shared: Optional[_Shared] = None) -> None:
        """Queues the next message for `sub` if it has room and something to say. Reading a table
        whose computation raises (a view's formula) fails it, and its subscribers, `sub` among
        them, are told (`_on_failure`); that is the whole answer."""
        try:
            self._serve(sub, step, now, shared)
        except TableFailedError:
            pass  # the failure reached `sub` through `_on_failure`

    def _serve(self, sub: Subscriber, step: int, now: float, shared: Optional[_Shared]) -> None:
        if sub.closed or sub.failure is not None:
            return
        if sub.log is not None:
            self._replay(sub)
            return
        if sub.requested is not None:
            if sub.pending() >= self.registry.outbox:
                return
            self._snapshot(sub, step)
            return
        if sub.behind is None or sub.pending() or now - sub.last_sent < sub.interval:
            return
        self._delta(sub, step, shared)

    def _should_grow(self, sub: Subscriber, view: View) -> bool:
        """Large initial snapshots of refreshing tables arrive in pieces across cycles; the C++
        client (which asks for columns_as_list) takes its snapshot whole (docs/viewports.md#growing-snapshots)."""
        return (view.is_full and sub.view is None and self.table.is_refreshing and not sub.encode.columns_as_list
                and len(self.table.rowset) * max(1, len(view.columns)) > self.registry.piece_cells)

    # -- shared initial snapshots (the cycle thread, or any thread under the graph's lock) -----------
    @staticmethod
    def _log_key(sub: Subscriber, view: View) -> _LogKey:
        return (view.columns, bool(sub.encode.columns_as_list))

    def _track_logs(self, update: TableUpdate, prev: RowSet, step: int) -> None:
        size = max(1, len(self.table.rowset))
        for lg in list(self._logs.values()):
            lg.track(update, prev, step)
            if lg.complete and lg.changed > size // 4 + 1024:
                self._retire(lg)  # replaying it would now cost more than a fresh snapshot
        for lg in self._replayed:
            lg.track(update, prev, step)

    def _retire(self, lg: SnapshotLog) -> None:
        for key, other in list(self._logs.items()):
            if other is lg:
                del self._logs[key]
        if lg.readers > 0 and lg not in self._replayed:
            self._replayed.append(lg)

    def _keep(self, key: _LogKey, lg: SnapshotLog) -> None:
        """Keeps `lg` for later joiners; past `shared_snapshots` logs the oldest is let go (its
        readers finish it), so subscribers asking for ever other columns hold no more snapshots
        than are being read."""
        self._logs.pop(key, None)
        self._logs[key] = lg  # the newest, last: never the one let go below
        while len(self._logs) > self.registry.shared_snapshots:
            self._retire(next(iter(self._logs.values())))

    def _leave_log(self, sub: Subscriber) -> None:
        lg, sub.log = sub.log, None
        if lg is None:
            return
        lg.readers -= 1
        if lg.readers <= 0 and lg in self._replayed:
            self._replayed.remove(lg)

    def _start_log(self, sub: Subscriber, view: View, step: int) -> SnapshotLog:
        lg = SnapshotLog(view, growing=self._should_grow(sub, view))
        lg.start_step = step
        if lg.complete:
            rows = self.table.rowset
            plan = plan_full(None, rows, self.wire.names, view, snapshot=True)
            first = last = step if self.table.is_refreshing else -1  # docs/messages.md#sequence-numbers
            t0 = time.perf_counter()
            lg.messages.append(self._message(plan, view, last, first, snapshot=True))
            self._snapshot_done(len(rows), len(view.columns), lg.messages, time.perf_counter() - t0, last)
            if self.table.is_refreshing:
                lg.remeta = lambda at: self._metadata(plan, view, at, at, snapshot=True)
        else:
            self._build_log(lg, step)
        self._keep(self._log_key(sub, view), lg)
        return lg

    def _build_log(self, lg: SnapshotLog, step: int) -> None:
        """One step of a growing log: the changes to the rows it holds, then its next piece of rows
        in key order (`added_rows` = the whole table, `added_rows_included` = the piece;
        `effective_viewport` = positions delivered so far, absent in the final piece)."""
        rows = self.table.rowset
        view = lg.view
        if lg.since is not None:
            u = lg.since
            held = u.shifted.apply(lg.delivered.minus(u.removed))
            mods = u.modified.intersect(held)
            part = TableUpdate(removed=u.removed.intersect(lg.delivered), modified=mods, shifted=u.shifted,
                               modified_columns=ModifiedColumnSet(u.modified_columns if mods else ()))
            plan = plan_full(part, rows, self.wire.names, view)
            lg.messages.append(self._message(plan, view, lg.since_last, lg.since_first, snapshot=False))
            lg.delivered = held
            lg.since = lg.since_prev = None
            lg.changed = 0
        remaining = rows.minus(lg.delivered)
        n = max(1, self.registry.piece_cells // max(1, len(view.columns)))
        piece = remaining.subset_by_positions(0, n - 1)
        t0 = time.perf_counter()
        added = self.wire.gather(piece, view.columns)
        took = time.perf_counter() - t0
        lg.seconds += took
        self.registry.observe_piece(len(piece) * max(1, len(view.columns)), took)
        lg.delivered = lg.delivered.union(piece)
        done = len(lg.delivered) == len(rows)
        ncols = len(self.wire.names)
        md = metadata_bytes(first_seq=step, last_seq=step, is_snapshot=True,
                            effective_viewport=None if done else RowSet.range(0, len(lg.delivered) - 1),
                            effective_column_set=view.columns, added_rows=rows, removed_rows=RowSet(),
                            shift_data=_EMPTY_SHIFTS, added_rows_included=piece,
                            mod_column_nodes=[RowSet()] * ncols, table_size=len(rows))
        lg.messages.append(Message(md, self.wire.types, added, None, step=step, limits=self.registry.limits))
        if done:
            lg.complete = True
            lg.delivered = RowSet()
            self._snapshot_done(len(rows), len(view.columns), lg.messages, lg.seconds, step)

    def _restated(self, key: _LogKey, lg: SnapshotLog, step: int) -> Optional[SnapshotLog]:
        """A log usable by a subscriber joining at `step`, or None. Every message a subscriber gets
        is stated at a step no older than the one it joined at: a one-message log of a table that
        has not changed since is restated at `step` (same FlightData but the first); a static
        table's log is always current; anything else needs a fresh snapshot."""
        if not self.table.is_refreshing and lg.complete:
            return lg
        self._retire(lg)
        if not (lg.complete and lg.since is None and lg.remeta is not None and len(lg.messages) == 1):
            return None
        fresh = SnapshotLog(lg.view, growing=False)
        fresh.start_step = step
        fresh.remeta = lg.remeta
        fresh.messages.append(lg.messages[0].with_metadata(lg.remeta(step), step))
        self._keep(key, fresh)
        return fresh

    def _replay(self, sub: Subscriber) -> None:
        """Queues the subscriber's next messages of its log; at the end of a complete log it
        continues as an ordinary subscriber that is behind by the log's `since`."""
        lg = sub.log
        assert lg is not None  # called for a subscriber replaying a log
        while sub.cursor < len(lg.messages) and sub.pending() < self.registry.outbox:
            msg = lg.messages[sub.cursor]
            sub.cursor += 1
            sub.push(msg, snapshot=True)
        if sub.cursor < len(lg.messages) or not lg.complete:
            return
        sub.view = lg.view
        sub.client_keys = RowSet()
        sub.behind, sub.behind_prev = lg.since, lg.since_prev
        sub.behind_first, sub.behind_last = lg.since_first, lg.since_last
        self._leave_log(sub)

    def _snapshot(self, sub: Subscriber, step: int) -> None:
        view = sub.requested
        assert view is not None  # called for a subscriber with a view to answer
        rows = self.table.rowset
        names = self.wire.names
        if view.is_full and sub.view is None and sub.behind is None:
            key = self._log_key(sub, view)
            lg = self._logs.get(key)
            if lg is not None and lg.start_step != step:
                lg = self._restated(key, lg, step)
            if lg is None:
                lg = self._start_log(sub, view, step)
            sub.requested = None
            sub.log, sub.cursor = lg, 0
            lg.readers += 1
            self._replay(sub)
            return
        if view.is_full:
            plan = plan_full(None, rows, names, view, snapshot=True,
                             client_keys=sub.behind_prev if sub.behind is not None else
                             (rows if sub.view is not None else None))
        else:
            old = sub.view
            repaint = old is not None and (old.reverse != view.reverse or not set(view.columns) <= set(old.columns))
            plan = plan_viewport(sub.behind, sub.client_keys, rows, names, view, repaint_all=repaint, snapshot=True)
        first = sub.behind_first if sub.behind is not None else step
        if not self.table.is_refreshing:
            first = step = -1  # Deephaven reports -1 for static tables (docs/messages.md#sequence-numbers)
        t0 = time.perf_counter()
        msg = self._message(plan, view, step, first, snapshot=True)
        self._snapshot_done(msg.n_added, len(view.columns), [msg], time.perf_counter() - t0, step)
        sub.view, sub.requested = view, None
        sub.client_keys = plan.client_keys
        sub.behind = sub.behind_prev = None
        sub.push(msg, snapshot=True)

    def _snapshot_done(self, rows: int, columns: int, messages: list[Message], seconds: float, step: int) -> None:
        """Tells the registry's `on_snapshot` of a snapshot built for subscribers."""
        hook = self.registry.on_snapshot
        if hook is None:
            return
        try:
            hook(self.table, rows, columns, sum(m.nbytes for m in messages), seconds, step, len(messages))
        except Exception:  # recording never changes what is published
            log.debug("on_snapshot", exc_info=True)

    def _delta(self, sub: Subscriber, step: int, shared: Optional[_Shared]) -> None:
        """Subscribers in step with each other (same pending update) and asking for the same thing
        share one message: full subscriptions with the same columns, viewport subscriptions with
        the same window, direction and columns that hold the same rows."""
        view = sub.view
        assert view is not None  # a subscriber is behind only after its snapshot
        key: Optional[tuple[Any, ...]] = None
        if shared is not None:
            key = (id(sub.behind), view.columns) if view.viewport is None else \
                (id(sub.behind), view.columns, view.reverse, view.viewport)  # hashed and compared by its ranges' bytes
        hit = shared.get(key) if shared is not None and key is not None else None
        if hit is not None and hit[0] is not sub.behind:
            hit = None
        if hit is not None and (view.is_full or hit[1] == sub.client_keys):
            msg = hit[3]
            if not view.is_full:
                sub.client_keys = hit[2]
        else:
            rows = self.table.rowset
            before = sub.client_keys
            if view.is_full:
                plan = plan_full(sub.behind, rows, self.wire.names, view)
            else:
                plan = plan_viewport(sub.behind, sub.client_keys, rows, self.wire.names, view)
                sub.client_keys = plan.client_keys
            msg = self._message(plan, view, sub.behind_last, sub.behind_first, snapshot=False)
            if shared is not None and key is not None and hit is None:
                shared[key] = (sub.behind, before, sub.client_keys, msg)
        sub.behind = sub.behind_prev = None
        sub.push(msg)

    def _message(self, plan: Plan, view: View, step: int, first: int, *, snapshot: bool) -> Message:
        """`first`..`step` are the message's first_seq..last_seq."""
        md = self._metadata(plan, view, step, first, snapshot=snapshot)
        added = self.wire.gather(plan.add_keys, view.columns)
        modified = self.wire.gather(plan.mod_keys, plan.modified_columns) if plan.modified_columns else None
        return Message(md, self.wire.types, added, modified, step=step, limits=self.registry.limits)

    def _metadata(self, plan: Plan, view: View, step: int, first: int, *, snapshot: bool) -> bytes:
        ncols = len(self.wire.names)
        mods = [plan.modified_rows if i in plan.modified_columns else RowSet() for i in range(ncols)]
        return metadata_bytes(
            first_seq=first, last_seq=step, is_snapshot=snapshot,
            effective_viewport=view.viewport if snapshot and not view.is_full else None,
            effective_reverse_viewport=view.reverse,
            effective_column_set=view.columns if snapshot else None,
            added_rows=plan.added_rows, removed_rows=plan.removed_rows,
            shift_data=plan.shifts if view.is_full else None,
            added_rows_included=plan.added_rows if snapshot and view.is_full else None,
            mod_column_nodes=mods, table_size=len(self.table.rowset))


class PublisherRegistry:
    """The publishers of one server over `engine`'s tables, created on first subscription and
    dropped with the last (`Engine.publishers(config)`)."""

    def __init__(self, engine: "Engine", config: Optional[PublishingConfig] = None):
        config = config or PublishingConfig()
        self.engine = engine
        self.config = config
        piece_target_ms, min_piece_cells, max_piece_cells = \
            config.piece_target_ms, config.min_piece_cells, config.max_piece_cells
        # messages waiting for a subscriber's writer (a snapshot may queue behind one delta)
        self.outbox = config.outbox
        self.limits = config.encode
        self.max_viewport_ranges = config.max_viewport_ranges
        self.shared_snapshots = config.shared_snapshots
        self._lock = threading.Lock()
        self._by_table: dict[int, Publisher] = {}
        # growing snapshots: cells per piece, adapted so one piece's read under the graph's lock
        # takes about piece_target_ms
        self.piece_target = piece_target_ms / 1000.0
        self.min_piece_cells = int(min_piece_cells)
        self.max_piece_cells = int(max_piece_cells)
        self.piece_cells = min(self.max_piece_cells, max(self.min_piece_cells, 500_000))
        self._sec_per_cell: Optional[float] = None
        # on_snapshot(table, rows, columns, bytes, seconds, step, messages): a snapshot was built for
        # subscribers (under the graph's lock: cheap work only)
        self.on_snapshot: Optional[SnapshotHook] = None

    def observe_piece(self, cells: int, seconds: float) -> None:
        if cells <= 0 or seconds <= 0:
            return
        rate = seconds / cells
        self._sec_per_cell = rate if self._sec_per_cell is None else 0.7 * self._sec_per_cell + 0.3 * rate
        want = int(self.piece_target / self._sec_per_cell)
        self.piece_cells = min(self.max_piece_cells, max(self.min_piece_cells, want))

    def memory_by_table(self) -> dict[str, int]:
        """Bytes each publisher holds (its subscribers, their queued messages, kept snapshots),
        by table name: a diagnosis aid (engine/footprint.py)."""
        with self._lock:
            pubs = list(self._by_table.values())
        out: dict[str, int] = {}
        for p in pubs:
            out[p.table.name] = out.get(p.table.name, 0) + self.engine.held_bytes(p)
        return out

    def publisher(self, table: Table) -> Publisher:
        with self._lock:
            p = self._by_table.get(id(table))
            if p is None or p.table is not table:
                p = self._by_table[id(table)] = Publisher(self, table)
            return p

    def drop(self, p: Publisher) -> None:
        with self._lock:
            if self._by_table.get(id(p.table)) is p:
                del self._by_table[id(p.table)]

    def subscribe(self, table: Table, view: View, options: RequestOptions, notify: Callable[[], None]) -> Subscriber:
        return self.publisher(table).subscribe(view, options, notify)

    @property
    def subscriptions(self) -> list[Subscriber]:
        with self._lock:
            pubs = list(self._by_table.values())
        return [s for p in pubs for s in p.subs]


def snapshot_message(wire: TableWire, *, columns: Optional[tuple[int, ...]] = None,
                     viewport: Optional[RowSet] = None, reverse: bool = False,
                     doget: bool = True, limits: Optional[EncodeLimits] = None) -> tuple[Message, int]:
    """A DoGet / snapshot-request response message (docs/flows.md#doget,
    docs/flows.md#snapshot-requests) and its row count.

    `columns` None means all (and no effective_column_set); `viewport` None means the whole table.
    Refreshing tables are read under the graph's lock at a cycle boundary."""
    table = wire.table
    graph = table.graph
    cols = tuple(range(len(wire.names))) if columns is None else columns
    with graph.lock:
        if table.failure is not None:
            raise _failed(table.failure)
        rows = table.rowset
        step = graph.step if table.is_refreshing else -1
        if viewport is None:
            keys = rows
        else:
            keys = window_keys(rows, viewport, reverse)
        try:
            added = wire.gather(keys, cols)
        except TableFailedError as exc:  # a view's formula raised on these rows
            raise _failed(exc.failure) from None
    md = metadata_bytes(first_seq=step, last_seq=step, is_snapshot=True,
                        effective_viewport=None if doget else viewport,
                        effective_reverse_viewport=reverse,
                        effective_column_set=None if columns is None else np.asarray(columns, dtype=np.int64),
                        added_rows=rows, shift_data=_EMPTY_SHIFTS, added_rows_included=keys)
    return Message(md, wire.types, added, None, step=step, limits=limits or EncodeLimits(),
                   added_rows=len(keys)), len(keys)



class DogetSnapshot:
    """A DoGet of a whole table as a series of messages, for tables whose rows are mostly
    `stable_rows` (a history's Parquet locations, a static table): the row set, the step and the
    other rows' values are read under the graph's lock; the stable rows are read afterwards,
    `piece_rows` at a time, so that memory follows a piece and not the table, and the lock is
    not held while a billion rows are read. The first message carries the metadata (every row
    added, at the step the rows were read); the others carry record batches only.

        snap = DogetSnapshot.take(wire, limits=..., piece_rows=...)
        for msg in snap.messages():    # each gathered when asked for (call off the event loop)
            ...
    """

    def __init__(self, wire: TableWire, rows: RowSet, step: int, stable: RowSet,
                 tail: list[Optional[Any]], tail_rows: int, limits: EncodeLimits, piece_rows: int,
                 version: int = -1):
        self.wire = wire
        self.rows = rows
        self.step = step
        self.version = version  # table_version's, read with the rows
        self.stable = stable
        self._tail = tail
        self._tail_rows = tail_rows
        self.limits = limits
        self.piece_rows = piece_rows

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @classmethod
    def take(cls, wire: TableWire, *, limits: Optional[EncodeLimits] = None,
             piece_rows: int = 1 << 20) -> "DogetSnapshot":
        table = wire.table
        graph = table.graph
        cols = tuple(range(len(wire.names)))
        with graph.lock:
            if table.failure is not None:
                raise _failed(table.failure)
            rows = table.rowset
            step = graph.step if table.is_refreshing else -1
            version = _version(table)
            stable = table.stable_rows(rows) if len(rows) > piece_rows else RowSet()
            tail = rows.minus(stable) if not stable.is_empty() else rows
            # the stable rows are sent first: only when they all come before the others
            if not stable.is_empty() and not tail.is_empty() and tail.first() < stable.last():
                stable, tail = RowSet(), rows
            try:
                values = wire.gather(tail, cols)
            except TableFailedError as exc:  # a view's formula raised on these rows
                raise _failed(exc.failure) from None
        return cls(wire, rows, step, stable, values, len(tail), limits or EncodeLimits(), piece_rows, version)

    @staticmethod
    def table_version(table: Table) -> int:
        """What changes whenever `table`'s content may have: the step of its last update (-1 for a
        static table); a failed table raises its status. Two attribute reads, without the lock
        (a cheap call on the event loop): a cycle under way may have changed the rows before it
        sets the step, and a reader then sees the previous version, whose content it gets."""
        if table.failure is not None:
            raise _failed(table.failure)
        return _version(table)

    def messages(self) -> Iterator[Message]:
        md = metadata_bytes(first_seq=self.step, last_seq=self.step, is_snapshot=True, added_rows=self.rows,
                            shift_data=_EMPTY_SHIFTS, added_rows_included=self.rows)
        wire, types, cols = self.wire, self.wire.types, tuple(range(len(self.wire.names)))
        n = len(self.stable)
        for first in range(0, n, self.piece_rows):
            keys = self.stable.subset_by_positions(first, min(n, first + self.piece_rows) - 1)
            yield Message(md, types, wire.gather(keys, cols), None, step=self.step, limits=self.limits,
                          added_rows=len(keys))
            md = b""
        if self._tail_rows or md:  # the rows read under the lock (or, for an empty table, the metadata)
            yield Message(md, types, self._tail, None, step=self.step, limits=self.limits,
                          added_rows=self._tail_rows)


def _version(table: Table) -> int:
    return table.last_step if table.is_refreshing else -1
