"""tickwire's Python Barrage client: snapshots and live subscriptions over Arrow Flight.

Works against tickwire and against a Deephaven server (anonymous or pre-shared-key auth, TLS):

    with BarrageClient("localhost:10000") as client:
        client.snapshot("static_mixed")                         # pyarrow.Table
        sub = client.subscribe("ticking_keyed", on_update=print)
        sub.wait_for(lambda s: s.size > 0)
        sub.table                                                # the current state, a pyarrow.Table
        for update in sub.updates(timeout=5): ...               # blocking iterator of updates
        sub.set_view(viewport=[(0, 49)], columns=["Sym", "Price"])  # viewport subscriptions only
        sub.close()

Each subscription runs one reader thread: it decodes the stream with `tickwire.protocol`, applies
every update to a `NaturalTableState` (remove, shift, add, modify; no per-row loops), calls the callbacks
and queues the update for `updates()`. The queue is bounded: a consumer that does not drain it
makes the reader wait, which makes the server coalesce (it never buffers without bound either).
"""
from __future__ import annotations

import collections
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import grpc
import numpy as np
import pyarrow as pa

from tickwire.clients.state import NaturalTableState
from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.protocol import barrage
from tickwire.protocol.difference import Difference, difference
from tickwire.protocol.opening import exchange_opening, request_message, snapshot_request, subscription_request
from tickwire.protocol.proto import config_pb2, flight_pb2, session_pb2
from tickwire.protocol.proto.methods import METHODS
from tickwire.protocol.responses import ResponseReader, SchemaReceived, natural_added, natural_modified
from tickwire.protocol.rowset import keys_to_ranges, merge_ranges
from tickwire.protocol.update import BarrageUpdate

__all__ = ["BarrageClient", "Subscription", "Update", "ClientError", "PSK_AUTH", "NaturalTableState"]

PSK_AUTH = "io.deephaven.authentication.psk.PskAuthenticationHandler"
FLIGHT = "/arrow.flight.protocol.FlightService/"
CONFIG = "/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants"
CLOSE = "/io.deephaven.proto.backplane.grpc.SessionService/CloseSession"
_END = object()
CLOSE_TIMEOUT_S = 5.0
#: a subscription with `reconnect` subscribes again after these (the server went away or forgot us)
_RECONNECT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)


class ClientError(Exception):
    """A failed call or stream; `code` is the gRPC status (None for local errors)."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.code = code


def _ranges(rows) -> np.ndarray:
    return np.empty((0, 2), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1, 2)


def _shifts(shift_data) -> np.ndarray:
    """shift_data (starts, ends, dests) as an (n, 3) array of [start, end, dest] rows."""
    if shift_data is None:
        return np.empty((0, 3), dtype=np.int64)
    return np.column_stack([np.asarray(a, dtype=np.int64) for a in shift_data]).reshape(-1, 3)


@dataclass
class Update:
    """One applied update. Row sets are (n, 2) ranges: row keys for full subscriptions, indices
    into the viewport's rows for viewport subscriptions. `added` holds the values of the added
    rows, `removed` the values the removed rows had, `modified` the new values of each modified
    column (in the order of `modified_rows[column]`). `shifts` (full subscriptions) holds the
    row-key moves as [start, end, dest] rows: keys start..end (inclusive, after the removals)
    moved to dest..dest+(end-start), applied before the additions. `reconnected` marks the one
    update that follows a reconnection: the difference between the state held before and the
    new snapshot (rows gone, rows new, and for rows held on both sides only the columns whose
    values differ; no shifts)."""

    is_snapshot: bool
    first_seq: int
    last_seq: int
    table_size: int
    added_rows: np.ndarray
    removed_rows: np.ndarray
    modified_rows: dict[str, np.ndarray]
    added: pa.Table
    removed: pa.Table
    modified: dict[str, pa.Array] = field(default_factory=dict)
    shifts: np.ndarray = field(default_factory=lambda: np.empty((0, 3), dtype=np.int64))
    reconnected: bool = False

    @property
    def modified_columns(self) -> list[str]:
        return list(self.modified)


def _row_ids(state: NaturalTableState) -> np.ndarray:
    """What an update calls the rows of `state`: row keys (full), window indices (viewport)."""
    return np.arange(len(state), dtype=np.int64) if state.viewport else state.keys.copy()


def _state_update(state: NaturalTableState) -> Update:
    """`state` as one snapshot update: every row it holds added (what `updates()` starts with when
    the subscription's own snapshot, and maybe more, arrived before it was called)."""
    shown = state.table(state.selected)
    return Update(is_snapshot=True, first_seq=state.last_seq, last_seq=state.last_seq,
                  table_size=state.table_size if state.viewport else len(state),
                  added_rows=keys_to_ranges(_row_ids(state)), removed_rows=keys_to_ranges(np.empty(0, np.int64)),
                  modified_rows={}, added=shown, removed=shown.slice(0, 0))


def _reconnect_update(old: NaturalTableState, new: NaturalTableState) -> Update:
    """The one update that takes `old` (the state shown before a reconnection) to `new` (the
    new stream's snapshot). A full subscription compares rows by row key; a viewport
    subscription compares its window index by index. When the table's columns changed, every
    row goes and comes."""
    old_ids, new_ids = _row_ids(old), _row_ids(new)
    old_t, new_t = old.table(), new.table()
    shown = new.selected if new.selected is not None else list(new_t.column_names)
    if old_t.schema.equals(new_t.schema):
        d = difference(old_ids, new_ids, new_t, old_t, columns=shown)
    else:
        d = Difference(removed=old_ids, added=np.arange(new_ids.size, dtype=np.int64))
    removed = old_t.take(pa.array(np.searchsorted(old_ids, d.removed), type=pa.int64()))
    added = new_t.take(pa.array(d.added, type=pa.int64()))
    modified = {n: new_t.column(n).take(pa.array(d.modified[n])).combine_chunks() for n in shown if n in d.modified}
    modified_rows = {n: keys_to_ranges(new_ids[d.modified[n]]) for n in modified}
    return Update(is_snapshot=False, first_seq=new.last_seq, last_seq=new.last_seq,
                  table_size=new.table_size if new.viewport else len(new),
                  added_rows=keys_to_ranges(new_ids[d.added]), removed_rows=keys_to_ranges(d.removed),
                  modified_rows=modified_rows, added=added.select(shown),
                  removed=removed.select(old.selected if old.selected is not None else old_t.column_names),
                  modified=modified, reconnected=True)


class _Auth:
    """The `authorization` header: initial credentials, then the server's bearer token."""

    def __init__(self, psk: Optional[str], auth_type: Optional[str], auth_token: Optional[str]):
        if psk is not None:
            self.initial = f"{PSK_AUTH} {psk}"
        elif auth_type is not None:
            self.initial = f"{auth_type} {auth_token or ''}".strip()
        else:
            self.initial = "Anonymous"
        self.bearer: Optional[str] = None
        self.lock = threading.Lock()

    def metadata(self) -> tuple:
        with self.lock:
            return (("authorization", self.bearer or self.initial),)

    def forget(self) -> None:
        """Drops the bearer token (its session is gone): the next call logs in again."""
        with self.lock:
            self.bearer = None

    def learn(self, call) -> None:
        try:
            md = call.initial_metadata() or ()
        except Exception:  # noqa: BLE001 - a call that failed before headers
            return
        for k, v in md:
            if k == "authorization" and isinstance(v, str) and v.startswith("Bearer "):
                with self.lock:
                    self.bearer = v


def parse_target(target: str) -> tuple[str, bool]:
    """(host:port, tls) of "host:port" or a pyarrow-style URL: grpc://, grpc+tcp:// (plain),
    grpc+tls:// (TLS)."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        return target, False
    scheme = scheme.lower()
    if scheme not in ("grpc", "grpc+tcp", "grpc+tls"):
        raise ClientError(f"{target!r}: unsupported scheme {scheme!r} (use grpc://, grpc+tcp:// or grpc+tls://)")
    rest = rest.rstrip("/")
    if not rest or "/" in rest:
        raise ClientError(f"{target!r}: expected {scheme}://host:port")
    return rest, scheme == "grpc+tls"


class BarrageClient:
    """A connection to a Barrage server. `target` is "host:port" or a URL as pyarrow.flight takes
    it: "grpc://host:port" or "grpc+tls://host:port" (TLS, as `tls=True`)."""

    def __init__(self, target: str, *, psk: Optional[str] = None, tls: bool = False,
                 root_certs: Optional[bytes] = None, auth_type: Optional[str] = None,
                 auth_token: Optional[str] = None, keepalive: bool = True, clock: Clock = SYSTEM_CLOCK,
                 channel=None):
        """`clock` times the session keepalive and the subscriptions' reconnect backoff (the
        timeouts of calls that block their caller, such as `Subscription.wait_for`, are real
        seconds). `channel`:
        a gRPC channel to call instead of one to `target` (an in-process server's, for example:
        tickwire.server.services.inprocess)."""
        target, url_tls = parse_target(target)
        self.clock = clock
        tls = tls or url_tls
        self.target = target
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
        if channel is not None:
            self.channel = channel
        elif tls or root_certs is not None:
            self.channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certs), options=opts)
        else:
            self.channel = grpc.insecure_channel(target, options=opts)
        self.auth = _Auth(psk, auth_type, auth_token)
        self._subs: list[Subscription] = []
        self._closed = threading.Event()
        self.config = self.fetch_config()
        duration = float(self.config.get("http.session.durationMs", "300000")) / 1000.0
        self._keepalive = None
        if keepalive:
            self._keepalive = threading.Thread(target=self._refresh, args=(max(1.0, duration / 3),),
                                               name="tickwire-client-keepalive", daemon=True)
            self._keepalive.start()

    # -- plumbing -------------------------------------------------------------------------------------------
    def _unary(self, path: str, request, timeout: Optional[float] = None):
        m = METHODS[path]
        fn = self.channel.unary_unary(path, request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)
        try:
            resp, call = fn.with_call(request, metadata=self.auth.metadata(), timeout=timeout)
        except grpc.RpcError as exc:
            raise ClientError(f"{m.name}: {exc.code().name}: {exc.details()}", exc.code()) from None
        self.auth.learn(call)
        return resp

    def fetch_config(self) -> dict[str, str]:
        """The server's configuration constants (ConfigService); a call that also keeps the session alive."""
        resp = self._unary(CONFIG, config_pb2.ConfigurationConstantsRequest())
        return {k: v.string_value for k, v in resp.config_values.items()}

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def keepalive_thread(self) -> Optional[threading.Thread]:
        """The thread that keeps the session alive (None with keepalive=False)."""
        return self._keepalive

    def forget(self, sub: "Subscription") -> None:
        """A subscription of this client ended: it is no longer closed with the client."""
        if sub in self._subs:
            self._subs.remove(sub)

    def _refresh(self, every: float) -> None:
        while not self.clock.wait(self._closed, every):
            try:
                self.fetch_config()
            except ClientError:
                pass  # the next call reports the problem

    def open_exchange(self, requests: Iterable[bytes]):
        """A raw DoExchange call with this client's credentials: sends the FlightData of
        `requests` (e.g. `protocol.opening.exchange_opening(...)`; the iterable's end half-closes)
        and returns the gRPC call, an iterator of the server's FlightData bytes with `cancel()`.
        Reading it raises grpc.RpcError when the call fails."""
        return self.channel.stream_stream(FLIGHT + "DoExchange")(iter(requests), metadata=self.auth.metadata())

    @staticmethod
    def ticket(table: str | bytes) -> bytes:
        """A table name (global scope) or raw ticket bytes."""
        return table if isinstance(table, bytes) else b"s/" + table.encode()

    # -- discovery and snapshots ------------------------------------------------------------------------------
    def tables(self) -> list[str]:
        """Names of the tables the server lists (ListFlights; Deephaven and tickwire list the scope)."""
        m = METHODS[FLIGHT + "ListFlights"]
        fn = self.channel.unary_stream(m.path, request_serializer=m.request.SerializeToString,
                                       response_deserializer=m.response.FromString)
        try:
            call = fn(flight_pb2.Criteria(), metadata=self.auth.metadata())
            infos = list(call)
        except grpc.RpcError as exc:
            raise ClientError(f"ListFlights: {exc.code().name}: {exc.details()}", exc.code()) from None
        return [i.flight_descriptor.path[-1] for i in infos if len(i.flight_descriptor.path) == 2]

    def snapshot(self, table: str | bytes, *, columns: Optional[Sequence[str]] = None,
                 viewport: Optional[Sequence[tuple[int, int]]] = None, reverse: bool = False,
                 timeout: Optional[float] = 60) -> pa.Table:
        """The table's current contents (optionally some columns and a viewport of positions)."""
        if columns is None and viewport is None and not reverse:
            return self._doget(self.ticket(table), timeout)
        return self._exchange(table, columns=columns, viewport=viewport, reverse=reverse,
                              timeout=timeout)

    def _doget(self, ticket: bytes, timeout) -> pa.Table:
        fn = self.channel.unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
        reader = ResponseReader()
        state: Optional[NaturalTableState] = None
        try:
            for raw in fn(flight_pb2.Ticket(ticket=ticket), metadata=self.auth.metadata(), timeout=timeout):
                for ev in reader.feed(raw):
                    if isinstance(ev, SchemaReceived):
                        state = NaturalTableState(ev.schema, viewport=False)
                    else:
                        assert state is not None  # the schema opens every response (ResponseReader)
                        state.apply_plain(ev.update)
        except grpc.RpcError as exc:
            raise ClientError(f"DoGet {ticket!r}: {exc.code().name}: {exc.details()}", exc.code()) from None
        if state is None:
            raise ClientError(f"DoGet {ticket!r}: the stream ended without a schema")
        return state.table()

    def _exchange(self, table, *, columns, viewport, reverse, timeout) -> pa.Table:
        sub = Subscription(self, table, columns=columns, viewport=viewport, reverse=reverse, snapshot=True)
        try:
            if not sub.wait_ready(timeout):
                raise ClientError(f"snapshot of {table!r} timed out after {timeout} s")
            if sub.error is not None:
                raise sub.error
            return sub.table
        finally:
            sub.close()

    def schema(self, table: str) -> pa.Schema:
        """The table's schema (GetSchema on the descriptor ["scope", table])."""
        m = METHODS[FLIGHT + "GetSchema"]
        desc = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.PATH, path=["scope", table])
        resp = self._unary(m.path, desc)
        return pa.ipc.read_schema(pa.py_buffer(resp.schema))

    # -- subscriptions ----------------------------------------------------------------------------------------
    def subscribe(self, table: str | bytes, *, columns: Optional[Sequence[str]] = None,
                  viewport: Optional[Sequence[tuple[int, int]]] = None, reverse: bool = False,
                  on_update: Optional[Callable[["Update"], None]] = None,
                  on_error: Optional[Callable[[Exception], None]] = None, min_update_interval_ms: int = 0,
                  queue_size: int = 1024, reconnect: bool = False,
                  on_connection: Optional[Callable[[str], None]] = None,
                  backoff: tuple[float, float] = (0.1, 5.0)) -> "Subscription":
        """A live subscription: the whole table (viewport None) or a viewport of position ranges
        (inclusive), optionally counted from the end (`reverse`) and limited to `columns`.

        With `reconnect`, a lost connection (UNAVAILABLE, or a session the server no longer knows)
        does not end the subscription: it subscribes again, logging in again, with a backoff
        growing from `backoff[0]` to `backoff[1]` seconds. The new stream's snapshot is collected
        aside (the state shown stays as it was meanwhile), then becomes the state in one update
        marked `reconnected`: the rows removed, the rows added and, for rows on both sides, only
        the columns that changed. `on_connection(state)` hears "disconnected: <reason>",
        "reconnecting" and "connected"."""
        sub = Subscription(self, table, columns=columns, viewport=viewport, reverse=reverse, on_update=on_update,
                           on_error=on_error, min_update_interval_ms=min_update_interval_ms, queue_size=queue_size,
                           reconnect=reconnect, on_connection=on_connection, backoff=backoff)
        self._subs.append(sub)
        return sub

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        for s in list(self._subs):
            s.close()
        try:  # a courtesy to the server: closing never waits long for one that is going away
            self._unary(CLOSE, session_pb2.HandshakeRequest(), timeout=CLOSE_TIMEOUT_S)
        except ClientError:
            pass
        self.channel.close()
        if self._keepalive is not None and self._keepalive is not threading.current_thread():
            self._keepalive.join(10)

    def __enter__(self) -> "BarrageClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



class Subscription:
    """A live subscription (or a one-shot snapshot request) on a DoExchange stream.

    A viewport subscription changes its viewport, columns and direction on the same stream. A
    Deephaven server refuses any change to a full subscription (it ends the stream with
    INVALID_ARGUMENT), so a full subscription changes its columns by opening a new stream, whose
    snapshot then replaces the state."""

    def __init__(self, client: BarrageClient, table, *, columns=None, viewport=None, reverse=False, on_update=None,
                 on_error=None, min_update_interval_ms: int = 0, queue_size: int = 1024, snapshot: bool = False,
                 reconnect: bool = False, on_connection: Optional[Callable[[str], None]] = None,
                 backoff: tuple[float, float] = (0.1, 5.0)):
        self.client = client
        self.reconnect = bool(reconnect) and not snapshot
        self._on_connection = on_connection
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.connection = "connecting"
        self.reconnects = 0
        self.name = table
        self.ticket = client.ticket(table)
        self._columns = list(columns) if columns is not None else None
        self.viewport = None if viewport is None else [tuple(map(int, r)) for r in viewport]
        self.reverse = bool(reverse)
        self.snapshot_only = snapshot
        self.interval = int(min_update_interval_ms)
        self._callbacks = [on_update] if on_update else []
        self._on_error = on_error
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_size))
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ready = threading.Event()
        self._closed = threading.Event()
        self.error: Optional[ClientError] = None
        self.state: Optional[NaturalTableState] = None
        self.schema: Optional[pa.Schema] = None
        self.update_count = 0
        self.last_seq = 0
        self._names: Optional[list[str]] = None
        self._iterating = False
        self._iterate_after = 0  # updates counted before updates() was first called are in its first item
        self._delivering = False
        self._pending_columns: collections.deque = collections.deque()  # column lists of view changes in flight
        self._call: Any = None  # the gRPC call of the current stream (set by _open)
        self._requests: Optional[queue.Queue] = None
        self._thread: Optional[threading.Thread] = None
        self._threads: list[threading.Thread] = []
        if self._columns is not None:
            if not isinstance(table, str):
                raise ClientError("a column subset needs the table's name (to read its schema)")
            self._names = list(client.schema(table).names)
        self._open(self._request_bytes())

    # -- requests -------------------------------------------------------------------------------------------
    def _request_bytes(self) -> bytes:
        cols = None
        if self._columns is not None:
            if self._names is None:
                raise ClientError("column names need the schema; wait for the subscription to start")
            missing = [c for c in self._columns if c not in self._names]
            if missing:
                raise ClientError(f"no columns {missing} in {self.name!r}; it has {self._names}")
            idx = sorted({self._names.index(c) for c in self._columns} | {0})
            # The first column is always requested (and left out of the results): Deephaven (42.x)
            # splits a message into batches at the first column's chunk boundaries, and without
            # that column it fails messages of more than 65 536 rows with INVALID_ARGUMENT.
            cols = np.array(idx, dtype=np.int64)
        if self.snapshot_only:
            return snapshot_request(self.ticket, columns=cols, viewport=self.viewport, reverse=self.reverse)
        return subscription_request(self.ticket, columns=cols, viewport=self.viewport, reverse=self.reverse,
                                    options=barrage.SubscriptionOptions(min_update_interval_ms=self.interval))

    def _open(self, request: bytes, resync: bool = False) -> None:
        """Starts a DoExchange stream that sends `request`, and its reader thread. A snapshot
        request half-closes at once: the server ends the stream when everything is sent. With
        `resync` the reader collects the stream's snapshot off the state shown, then delivers
        the difference as one update (a reconnection)."""
        requests: queue.Queue = queue.Queue()
        for message in exchange_opening(request):
            requests.put(message)
        if self.snapshot_only:
            requests.put(_END)
        call = self.client.open_exchange(iter(requests.get, _END))
        thread = threading.Thread(target=self._run, args=(call, self._columns, resync),
                                  name=f"tickwire-sub-{self.name}", daemon=True)
        self._call, self._requests, self._thread = call, requests, thread
        self._threads.append(thread)
        thread.start()

    def set_view(self, *, viewport=None, columns=None, reverse: Optional[bool] = None) -> None:
        """Changes the viewport (position ranges), columns or direction of a running viewport
        subscription; a full subscription can change only its columns (on a new stream)."""
        superseded = None
        with self._lock:
            if self.viewport is None and (viewport is not None or reverse):
                raise ClientError("a full subscription cannot become a viewport subscription")
            if self._closed.is_set():
                raise ClientError(f"the subscription to {self.name!r} has ended"
                                  + (f": {self.error}" if self.error else ""))
            before = (self.viewport, self._columns, self.reverse)
            if viewport is not None:
                self.viewport = [tuple(map(int, r)) for r in viewport]
            if columns is not None:
                self._columns = list(columns)
            if reverse is not None and self.viewport is not None:
                self.reverse = bool(reverse)
            try:
                request = self._request_bytes()
            except ClientError:
                self.viewport, self._columns, self.reverse = before
                raise
            if self.viewport is not None:
                # the columns shown change with the snapshot that answers this request, so that a
                # message of the old view arriving in between is still shown with the old columns
                self._pending_columns.append(self._columns)
                assert self._requests is not None  # set by _open (from __init__)
                self._requests.put(request_message(request))
            elif columns is not None:
                superseded = (self._call, self._requests)
                self._open(request)
        if superseded is not None:
            old_call, old_requests = superseded
            assert old_requests is not None  # set by _open (from __init__)
            old_requests.put(_END)
            old_call.cancel()

    # -- reading --------------------------------------------------------------------------------------------
    def _current(self, call) -> bool:
        return self._call is call

    def _what(self) -> str:
        return f"{'snapshot of' if self.snapshot_only else 'subscription to'} {self.name!r}"

    def _run(self, call, columns, resync: bool = False) -> None:
        reader = ResponseReader()
        state: Optional[NaturalTableState] = None
        try:
            for raw in call:
                for ev in reader.feed(raw):
                    if isinstance(ev, SchemaReceived):
                        if self.connection != "connected":
                            self._connection("connected")
                        state = NaturalTableState(ev.schema, viewport=self.viewport is not None, selected=columns)
                        with self._lock:
                            if self._current(call) and self.state is None:
                                self._adopt(state)
                    else:
                        assert state is not None  # the schema opens every response (ResponseReader)
                        if resync:
                            # the state shown stays as it was until this stream's snapshot is whole
                            with self._lock:
                                if not self._current(call):
                                    return
                                self._apply_to(state, ev.update)
                                whole = self._snapshot_whole(ev)
                            if whole:
                                resync = False
                                if not self._resync(state, call):
                                    return
                        elif not self._apply(ev.update, state, call):
                            return  # a newer stream replaced this one
        except grpc.RpcError as exc:
            if self._current(call) and not self._closed.is_set() and self.reconnect \
                    and exc.code() in _RECONNECT_CODES \
                    and self._resubscribe(call, f"{exc.code().name}: {exc.details()}"):
                return  # a new stream (and reader) took over
            if self._current(call) and not self._closed.is_set() and exc.code() != grpc.StatusCode.CANCELLED:
                self._fail(ClientError(f"{self._what()}: {exc.code().name}: {exc.details()}",
                                       exc.code()))
        except Exception as exc:  # noqa: BLE001 - reported to the user
            if self._current(call):
                self._fail(ClientError(f"{self._what()}: {type(exc).__name__}: {exc}"))
        finally:
            if self._current(call):
                if self.snapshot_only and self.error is None and state is None:
                    self._fail(ClientError(f"{self._what()}: the stream ended without a schema"))
                self._ready.set()
                self._finish()

    def _connection(self, state: str) -> None:
        self.connection = state
        if self._on_connection is not None:
            try:
                self._on_connection(state)
            except Exception as exc:  # noqa: BLE001 - a user callback must not end the subscription
                if self._on_error:
                    self._on_error(exc)

    def _resubscribe(self, call, reason: str) -> bool:
        """After a lost connection: logs in again and opens a new stream, retrying with backoff
        until it works or the subscription is closed (False then)."""
        self._connection(f"disconnected: {reason}")
        delay = self.backoff[0]
        while not self.client.clock.wait(self._closed, delay) and not self.client.closed:
            self._connection("reconnecting")
            self.client.auth.forget()  # a restarted server knows no session of ours
            try:
                self.client.fetch_config()
                with self._lock:
                    if self._closed.is_set() or not self._current(call):
                        return False
                    self._pending_columns.clear()
                    old_requests = self._requests
                    self._open(self._request_bytes(), resync=self.state is not None)
                assert old_requests is not None  # set by _open (from __init__)
                old_requests.put(_END)
                self.reconnects += 1
                self._connection("connected")
                return True
            except ClientError as exc:
                self._connection(f"disconnected: {exc}")
            delay = min(self.backoff[1], delay * 2)
        return False

    def _adopt(self, state: NaturalTableState) -> None:
        """Makes `state` the one shown (caller holds the lock)."""
        self.state = state
        self._names = list(state.wire_schema.names)
        self.schema = state.wire_schema

    def _apply(self, u: BarrageUpdate, state: NaturalTableState, call) -> bool:
        md = u.metadata
        with self._lock:
            if not self._current(call):
                return False
            if self.state is not state:
                self._adopt(state)  # the first message of a stream that replaced another one
            names = self._names
            assert names is not None  # set by _adopt
            removed_vals = None
            if md is not None and md.removed_rows is not None:
                removed_vals = state.values_at(_ranges(md.removed_rows))
            self._apply_to(state, u)
            callbacks = self._applied(state)
            count = self.update_count
        self._deliver(lambda: self._update(u, names, removed_vals, state), callbacks, count)
        return True

    def _apply_to(self, state: NaturalTableState, u: BarrageUpdate) -> None:
        """Applies one message to `state` (caller holds the lock); the snapshot that answers a
        view change brings that change's columns."""
        md = u.metadata
        state.apply_plain(u)
        if md is not None and md.is_snapshot and self._pending_columns and md.removed_rows is not None:
            state.selected = self._pending_columns.popleft()

    def _applied(self, state: NaturalTableState) -> list:
        """Counts an update of the state shown (caller holds the lock); returns the callbacks to call."""
        self.update_count += 1
        self.last_seq = state.last_seq
        callbacks = list(self._callbacks)
        if callbacks:
            self._delivering = True  # wait_for() waits until the callbacks have seen this update
        else:
            self._changed.notify_all()
        return callbacks

    def _snapshot_whole(self, ev) -> bool:
        """Does this message complete a resubscription's snapshot? A full subscription's
        snapshot ends with the piece without an effective viewport; a viewport's with the snapshot
        whose effective viewport is the one requested (caller holds the lock)."""
        md = ev.update.metadata
        if md is None or not md.is_snapshot:
            return False
        if md.effective_viewport is None:
            return True
        return self.viewport is not None and np.array_equal(merge_ranges(_ranges(md.effective_viewport)),
                                                                 merge_ranges(_ranges(self.viewport)))

    def _resync(self, new: NaturalTableState, call) -> bool:
        """A resubscription's snapshot is whole: `new` becomes the state shown, and the
        subscriber gets one update that takes the previous state to it."""
        with self._lock:
            if not self._current(call):
                return False
            old = self.state
            assert old is not None  # a resync replaces the state shown
            self._adopt(new)
            callbacks = self._applied(new)
            count = self.update_count
        self._deliver(lambda: _reconnect_update(old, new), callbacks, count)
        return True

    def _deliver(self, make: Callable[[], "Update"], callbacks: list, count: int) -> None:
        """Builds the update (only when someone takes it), calls the callbacks, then queues it
        for `updates()` (waiting while the queue is full) unless it is the `count`th update or
        an earlier one and `updates()`'s first item, the state then, already holds it."""
        if not callbacks and not self._iterating:
            return
        try:
            upd = make()
            for cb in callbacks:
                try:
                    cb(upd)
                except Exception as exc:  # noqa: BLE001 - a user callback must not end the stream
                    if self._on_error:
                        self._on_error(exc)
        finally:
            if callbacks:
                with self._lock:
                    self._delivering = False
                    self._changed.notify_all()
        while self._iterating and count > self._iterate_after and not self._closed.is_set():
            try:
                self._queue.put(upd, timeout=0.1)
                break
            except queue.Full:
                continue

    def _update(self, u: BarrageUpdate, names: list[str], removed_vals, state: NaturalTableState) -> Update:
        md = u.metadata
        n = max((len(a) for a in u.added), default=0)
        added = pa.Table.from_arrays(natural_added(u, state.wire_schema, n), names=names)
        if removed_vals is None:
            removed = added.slice(0, 0)
        else:
            removed = pa.Table.from_arrays(state.natural(removed_vals), names=names)
        modified, modified_rows = {}, {}
        nodes = (md.mod_column_nodes or []) if md is not None else []
        for c, rows in enumerate(nodes):
            r = _ranges(rows)
            if r.size:
                modified_rows[names[c]] = r
                modified[names[c]] = natural_modified(u, state.wire_schema, c)
        if state.selected is not None:
            added, removed = added.select(state.selected), removed.select(state.selected)
            modified = {k: v for k, v in modified.items() if k in state.selected}
            modified_rows = {k: v for k, v in modified_rows.items() if k in state.selected}
        return Update(is_snapshot=bool(md.is_snapshot) if md else True, first_seq=md.first_seq if md else 0,
                      last_seq=md.last_seq if md else 0, table_size=state.table_size,
                      added_rows=_ranges(md.added_rows_included if md is not None and md.added_rows_included
                                         is not None else (md.added_rows if md else None)),
                      removed_rows=_ranges(md.removed_rows if md else None), modified_rows=modified_rows,
                      added=added, removed=removed, modified=modified,
                      shifts=_shifts(md.shift_data if md is not None else None))

    def _fail(self, err: ClientError) -> None:
        self.error = err
        if self._on_error:
            try:
                self._on_error(err)
            except Exception:  # noqa: BLE001
                pass

    def _finish(self) -> None:
        with self._lock:
            self._closed.set()
            self._changed.notify_all()
            requests = self._requests
        # ends the request stream, whose gRPC sender thread would otherwise wait on it for ever
        assert requests is not None  # set by _open (from __init__)
        requests.put(_END)
        try:
            self._queue.put_nowait(_END)
        except queue.Full:
            pass

    # -- the user's side ------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def table(self) -> pa.Table:
        """The current state as a pyarrow Table (the subscribed columns; viewport rows in table order)."""
        with self._lock:
            if self.state is None:
                raise ClientError(f"no data yet for {self.name!r}" + (f": {self.error}" if self.error else ""))
            return self.state.table(self.state.selected)

    def to_pandas(self):
        return self.table.to_pandas()

    @property
    def size(self) -> int:
        """Rows held (full) or the table's size (viewport)."""
        with self._lock:
            if self.state is None:
                return 0
            return self.state.table_size if self.viewport is not None else len(self.state)

    @property
    def reader_threads(self) -> tuple[threading.Thread, ...]:
        """The threads reading this subscription's streams (one, or two while a view change moves
        it to a new stream)."""
        return tuple(self._threads)

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Waits until the first snapshot is in (True), or `timeout` real seconds pass (a wait of
        the caller's: the client's clock times only the client's own behaviour)."""
        return self._ready.wait(timeout)

    def wait_for(self, predicate: Callable[["Subscription"], bool], timeout: float = 30.0) -> bool:
        """Waits until `predicate(self)` holds after an update (True) or the timeout / end (False).
        The predicate is checked once the `on_update` callbacks have been called with the update
        (unless wait_for is called from a callback)."""
        clock = SYSTEM_CLOCK  # the caller's wait: real seconds, whatever clock times the client
        end = clock.monotonic() + timeout
        reader = threading.current_thread() in self._threads
        with self._lock:
            while True:
                if self.state is not None and self.update_count and (reader or not self._delivering):
                    self._lock.release()
                    try:
                        ok = predicate(self)
                    finally:
                        self._lock.acquire()
                    if ok:
                        return True
                if self._closed.is_set():
                    return False
                left = end - clock.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))

    def updates(self, timeout: Optional[float] = None) -> Iterator[Update]:
        """Applied updates, in order, until the subscription ends (or `timeout` passes between
        updates). The first call's iterator starts with the subscription's snapshot: the
        server's own, or, when updates arrived before the call, one snapshot update of the state
        then, followed by every later update. While iterating, an update not yet consumed makes
        the reader wait once `queue_size` are pending (the server then coalesces)."""
        with self._lock:
            if not self._iterating:
                self._iterate_after = self.update_count
                if self.state is not None and self.update_count and not self._closed.is_set():
                    self._queue.put_nowait(_state_update(self.state))  # nothing was queued before
                self._iterating = True
        return self._iterate(timeout)

    def _iterate(self, timeout: Optional[float]) -> Iterator[Update]:
        while True:
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                return
            if item is _END:
                if self.error is not None:
                    raise self.error
                return
            yield item

    def close(self) -> None:
        """Ends the subscription (half-close, then cancel) and joins its reader thread(s)."""
        with self._lock:
            self._closed.set()
            self._changed.notify_all()
            call, requests, threads = self._call, self._requests, list(self._threads)
        assert requests is not None  # set by _open (from __init__)
        requests.put(_END)
        call.cancel()
        for t in threads:
            if t is not threading.current_thread():
                t.join(10)
        self.client.forget(self)
