"""Prometheus metrics of one server (prometheus-client, text exposition).

Each server has its own `CollectorRegistry` (never the process-wide default one: a process may run
several servers). Almost everything is read when scraped from the state the server keeps anyway
(subscribers, sessions, the per-cycle table figures); what has to be counted as it happens is
counted once per call, per FlightData message or per cycle, never per row:

* the update graph: `tickwire_cycle_duration_seconds` (histogram), `tickwire_cycles` (the step
  counter), `tickwire_cycle_lag_seconds` (how far the graph is behind its schedule: the time since
  the last cycle ended beyond one interval; it grows while a cycle is stuck or the graph stopped);
* tables (published ones): `tickwire_table_rows{table}`, `tickwire_table_rows_in{table}` (rows
  added to a source table by its input: appended, upserted under new keys, a blink table's
  rows), `tickwire_table_failed{table}`, `tickwire_table_rows_out{table}` (rows sent to clients:
  DoGet, snapshot requests and the added and modified rows of subscription messages, counted per
  message; the rows of tables that are not published, e.g. a session's own, under `table=""`);
* subscriptions: `tickwire_subscriptions{kind="full"|"viewport"}`, `tickwire_subscriptions_growing`
  (still being sent their initial snapshot), `tickwire_subscription_outbox_messages` (queued for
  their writers), `tickwire_subscription_updates` (Barrage messages queued for subscribers),
  `tickwire_subscription_coalesced` (cycles folded into a pending change because the client was
  slow), `tickwire_snapshot_pieces` (snapshot messages: those queued for subscribers, an initial
  snapshot's pieces each, and the replies to snapshot requests);
* Flight calls: `tickwire_doget_requests`, `tickwire_doget_rows`, `tickwire_doget_bytes`,
  `tickwire_doput_requests`, `tickwire_doput_rows`, `tickwire_doput_bytes` (received),
  `tickwire_exchange_messages_sent`, `tickwire_exchange_bytes_sent` (DoExchange FlightData:
  subscriptions and snapshot requests, gRPC and browser websockets alike);
* `tickwire_grpc_errors{code}`: calls ended with an error status, by status code;
* `tickwire_sessions`, `tickwire_exports`, `tickwire_web_sockets`;
* memory: `tickwire_resident_bytes`, `tickwire_arrow_allocated_bytes` (Arrow's default pool),
  `tickwire_python_allocated_blocks` (pymalloc's). numpy arrays, where the engine keeps its
  columns, are in neither of the last two: resident growth alone does not tell a growing table
  from the allocators' fragmentation; `tickwire_malloc_in_use_bytes` and
  `tickwire_malloc_free_bytes` (glibc's C heap: held by someone, or freed and kept by the
  arenas) do;
* `tickwire_threads{name}`: the process's Python threads by name (digits dropped, so a pool's
  threads count under one name).
"""
from __future__ import annotations

import collections
import re
import threading
import weakref
from typing import Iterable, Optional

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..process_memory import malloc_figures
from .memtrace import memory_figures

__all__ = ["Metrics", "TransferCounters", "ErrorCounts", "CYCLE_BUCKETS"]

CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class TransferCounters:
    """What the Flight service counts as it serves (plain integers, bumped on the event loop)."""

    def __init__(self) -> None:
        self.doget_requests = 0
        self.doget_rows = 0
        self.doget_bytes = 0
        self.doput_requests = 0
        self.doput_rows = 0
        self.doput_bytes = 0
        self.exchange_messages = 0
        self.exchange_bytes = 0
        self.snapshot_replies = 0  # answers to snapshot requests (one snapshot message each)
        self._lock = threading.Lock()
        self._retired: "weakref.WeakSet" = weakref.WeakSet()
        self.retired_updates = 0
        self.retired_coalesced = 0
        self.retired_snapshot_messages = 0
        # by table: DoGet, snapshot requests, retired subscriptions
        self._rows_out: collections.Counter = collections.Counter()

    def rows_out(self, table: str, rows: int) -> None:
        """A message of `rows` rows of `table` is sent (DoGet or a snapshot request's reply)."""
        with self._lock:
            self._rows_out[table] += rows

    def snapshot_reply(self, table: str, rows: int) -> None:
        """A snapshot request is answered with a snapshot of `rows` rows of `table`."""
        with self._lock:
            self.snapshot_replies += 1
            self._rows_out[table] += rows

    def retire(self, sub) -> None:
        """A subscription's call is over: its counts stay in the totals after it is gone."""
        if sub is None:
            return
        with self._lock:
            if sub in self._retired:
                return
            self._retired.add(sub)
            self.retired_updates += sub.messages
            self.retired_coalesced += sub.coalesced
            self.retired_snapshot_messages += sub.snapshot_messages
            self._rows_out[_table_of(sub)] += sub.rows

    def fold(self, published) -> None:
        """Moves the rows out of tables no longer (or never) published to the `""` entry, so that
        the per-table counts stay as many as the published tables."""
        with self._lock:
            _fold(self._rows_out, published)

    def subscription_figures(self, live: Iterable, published=None) -> "_SubscriptionFigures":
        """Totals over every subscription so far (the retired ones and `live`) and the rows out by
        table (DoGet and snapshot requests included); with `published`, the rows of other tables
        are counted under `""`."""
        with self._lock:
            f = _SubscriptionFigures(self.retired_updates, self.retired_coalesced,
                                     self.retired_snapshot_messages + self.snapshot_replies,
                                     collections.Counter(self._rows_out))
            for sub in live:
                if sub not in self._retired:
                    f.updates += sub.messages
                    f.coalesced += sub.coalesced
                    f.snapshot_pieces += sub.snapshot_messages
                    f.rows_out[_table_of(sub)] += sub.rows
        if published is not None:
            _fold(f.rows_out, published)
        return f


def _fold(rows_out: collections.Counter, published) -> None:
    """Moves the counts of tables not in `published` to the `""` entry."""
    for name in [n for n in rows_out if n and n not in published]:
        rows_out[""] += rows_out.pop(name)


class _SubscriptionFigures:
    __slots__ = ("updates", "coalesced", "snapshot_pieces", "rows_out")

    def __init__(self, updates: int, coalesced: int, snapshot_pieces: int, rows_out: collections.Counter):
        self.updates, self.coalesced = updates, coalesced
        self.snapshot_pieces, self.rows_out = snapshot_pieces, rows_out


def _table_of(sub) -> str:
    return sub.publisher.table.name


class ErrorCounts:
    """Calls ended with an error status, by status code (rpc.py's single error path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()

    def __call__(self, code) -> None:
        name = getattr(code, "name", str(code))
        with self._lock:
            self._counts[name] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class _TableFigures:
    """Per published table, as of the last cycle: rows now, rows in so far, failed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, int] = {}
        self.rows_in: dict[str, int] = {}
        self.failed: dict[str, bool] = {}


class Metrics:
    """The registry of one server and the collector reading its state at scrape time.

    `server` is the TickwireServer (its registry of publishers, sessions, web side); `counters`
    and `errors` are filled by the Flight service and the call wrapper."""

    def __init__(self, server, counters: TransferCounters, errors: ErrorCounts):
        self.server = server
        self.counters = counters
        self.errors = errors
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle_duration = Histogram("tickwire_cycle_duration_seconds",
                                        "Duration of the update graph's cycles", buckets=CYCLE_BUCKETS,
                                        registry=self.registry)
        self.tables = _TableFigures()
        self.clock = server.engine.clock
        self.started = self.clock.monotonic()
        self.last_cycle: Optional[float] = None
        self.step = 0
        self.registry.register(_Collector(self))

    # -- fed by the cycle listener (under the graph's lock: cheap work only) ------------------------------
    def on_cycle(self, step: int, durations, figures: dict[str, tuple[int, int, bool]]) -> None:
        """`durations`: the graph's recent cycle durations, whose last one is the previous cycle's
        (observed here, one cycle late: the graph records a cycle's duration after its listeners);
        `figures`: {table: (rows now, rows added this cycle, failed)} for every published table."""
        if durations:
            self.cycle_duration.observe(durations[-1])
        self.last_cycle = self.clock.monotonic()
        self.step = step
        t = self.tables
        with t.lock:
            for name in [n for n in t.rows if n not in figures]:  # dropped tables
                t.rows.pop(name, None)
                t.rows_in.pop(name, None)
                t.failed.pop(name, None)
            for name, (rows, added, failed) in figures.items():
                t.rows[name] = rows
                t.failed[name] = failed
                if added or name not in t.rows_in:
                    t.rows_in[name] = t.rows_in.get(name, 0) + added
        self.counters.fold(figures)

    # -- scraping ------------------------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """The text exposition of every metric (prometheus-client's format)."""
        return generate_latest(self.registry)


class _Collector:
    def __init__(self, metrics: Metrics):
        self.m = metrics

    def describe(self):
        return []

    def collect(self) -> Iterable[Metric]:
        m = self.m
        server = m.server
        yield from self._graph(m, server)
        yield from self._tables(m)
        yield from self._subscriptions(m, server)
        yield from self._calls(m)
        yield from self._sessions(server)
        yield from self._memory()

    @staticmethod
    def _graph(m: Metrics, server):
        engine = server.engine
        interval = engine.interval_ms / 1000.0
        yield _counter("tickwire_cycles", "Cycles the update graph has run", engine.step)
        now = m.clock.monotonic()
        last = m.last_cycle if m.last_cycle is not None else m.started
        yield _gauge("tickwire_cycle_lag_seconds",
                     "How far the update graph is behind its schedule: seconds since its last cycle beyond one "
                     "interval", max(0.0, now - last - interval))
        yield _gauge("tickwire_cycle_interval_seconds", "The update graph's cycle interval", interval)

    @staticmethod
    def _tables(m: Metrics):
        t = m.tables
        with t.lock:
            rows, rows_in, failed = dict(t.rows), dict(t.rows_in), dict(t.failed)
        g = GaugeMetricFamily("tickwire_table_rows", "Rows of each published table (as of the last cycle)",
                              labels=["table"])
        for name, n in sorted(rows.items()):
            g.add_metric([name], n)
        yield g
        c = CounterMetricFamily("tickwire_table_rows_in", "Rows added to each published source table by its "
                                "input", labels=["table"])
        for name, n in sorted(rows_in.items()):
            c.add_metric([name], n)
        yield c
        f = GaugeMetricFamily("tickwire_table_failed", "1 for a published table that has failed",
                              labels=["table"])
        for name, bad in sorted(failed.items()):
            f.add_metric([name], 1 if bad else 0)
        yield f

    @staticmethod
    def _subscriptions(m: Metrics, server):
        subs = [s for s in server.registry.subscriptions if not s.closed]
        kinds = {"full": 0, "viewport": 0}
        growing = outbox = 0
        for s in subs:
            view = s.view if s.view is not None else s.requested
            kinds["full" if view is None or view.is_full else "viewport"] += 1
            growing += 1 if s.growing else 0
            outbox += len(s.outbox)
        g = GaugeMetricFamily("tickwire_subscriptions", "Open Barrage subscriptions by kind", labels=["kind"])
        for kind, n in kinds.items():
            g.add_metric([kind], n)
        yield g
        yield _gauge("tickwire_subscriptions_growing", "Subscriptions still being sent their initial snapshot",
                     growing)
        yield _gauge("tickwire_subscription_outbox_messages", "Messages queued for the subscriptions' writers",
                     outbox)
        t = m.tables
        with t.lock:
            published = set(t.rows)
        f = m.counters.subscription_figures(subs, published)
        yield _counter("tickwire_subscription_updates", "Barrage messages queued for subscribers", f.updates)
        yield _counter("tickwire_subscription_coalesced",
                       "Cycles folded into a subscriber's pending change because the client was slow", f.coalesced)
        yield _counter("tickwire_snapshot_pieces",
                       "Snapshot messages queued for subscribers (an initial snapshot's pieces each) and replies "
                       "to snapshot requests", f.snapshot_pieces)
        c = CounterMetricFamily("tickwire_table_rows_out", "Rows sent to clients by DoGet, snapshot requests and "
                                "subscriptions (added and modified), by table; \"\" for tables not published",
                                labels=["table"])
        for name, n in sorted(f.rows_out.items()):
            c.add_metric([name], n)
        yield c

    @staticmethod
    def _calls(m: Metrics):
        c = m.counters
        for name, value, doc in (
                ("tickwire_doget_requests", c.doget_requests, "DoGet calls"),
                ("tickwire_doget_rows", c.doget_rows, "Rows sent by DoGet"),
                ("tickwire_doget_bytes", c.doget_bytes, "FlightData bytes sent by DoGet"),
                ("tickwire_doput_requests", c.doput_requests, "DoPut calls"),
                ("tickwire_doput_rows", c.doput_rows, "Rows written by DoPut calls"),
                ("tickwire_doput_bytes", c.doput_bytes, "FlightData bytes received by DoPut"),
                ("tickwire_exchange_messages_sent", c.exchange_messages,
                 "FlightData messages sent by DoExchange (subscriptions and snapshot requests)"),
                ("tickwire_exchange_bytes_sent", c.exchange_bytes,
                 "FlightData bytes sent by DoExchange (subscriptions and snapshot requests)")):
            yield _counter(name, doc, value)
        e = CounterMetricFamily("tickwire_grpc_errors", "Calls ended with an error status, by status code",
                                labels=["code"])
        for code, n in sorted(m.errors.counts().items()):
            e.add_metric([code], n)
        yield e

    @staticmethod
    def _sessions(server):
        sessions = server.sessions
        yield _gauge("tickwire_sessions", "Open client sessions", sessions.count)
        yield _gauge("tickwire_exports", "Exports held by the open sessions", sessions.exports_held())
        web = server.web
        yield _gauge("tickwire_web_sockets", "Open browser websockets", web.open_sockets if web is not None else 0)

    @staticmethod
    def _memory():
        mem = memory_figures()
        yield _gauge("tickwire_arrow_allocated_bytes", "Bytes held by Arrow's default memory pool",
                     int(mem["arrow_mb"] * 2**20))
        yield _gauge("tickwire_python_allocated_blocks", "Memory blocks Python's allocator holds",
                     mem["py_blocks"])
        if mem["rss_mb"] == mem["rss_mb"]:
            yield _gauge("tickwire_resident_bytes", "The process's resident set size", int(mem["rss_mb"] * 2**20))
        heap = malloc_figures()
        if heap is not None:
            yield _gauge("tickwire_malloc_in_use_bytes", "C heap bytes allocated and not freed (glibc)",
                         int(heap["in_use_mb"] * 2**20))
            yield _gauge("tickwire_malloc_free_bytes", "C heap bytes freed but kept by malloc's arenas (glibc)",
                         int(heap["free_mb"] * 2**20))
        names = collections.Counter(re.sub(r"\d+", "N", t.name) for t in threading.enumerate())
        g = GaugeMetricFamily("tickwire_threads", "Python threads by name (digits as N)", labels=["name"])
        for name, n in sorted(names.items()):
            g.add_metric([name], n)
        yield g


def _gauge(name: str, doc: str, value) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


