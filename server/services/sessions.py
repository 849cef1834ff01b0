"""Sessions, authentication and ticket resolution for the gRPC services.

Deephaven's clients authenticate with an `authorization` header on their first call
(`Anonymous`, or a pre-shared key in the form `io.deephaven.authentication.psk.PskAuthenticationHandler <key>`)
and the server answers with a response header `authorization: Bearer <token>` that they send on
every later call (docs/flows.md#sessions-and-authentication). A token names a session; a session holds its exports
(`e` + int32 LE tickets) and expires after `http.session.durationMs` without use. Ending a
session (CloseSession or expiry) frees its exports; the tables they held are hidden: only export
tickets of their session reach them.

Export ids are chosen by the client, which pipelines: Deephaven's JS API sends a Batch and, some
microseconds later, an ApplyPreviewColumns whose source is the Batch's result, without waiting
for the Batch's answer. As in Deephaven (SessionState.getExport), an id that a call names before
the call making it has finished -- or even started -- is a pending export, and the naming call
waits for it:

  * a call that makes exports `claim`s its result ids before its first await (so that calls a
    client sent after it can never miss them), then fulfils or fails each claim;
  * a call that names an export (`wait_for`) gets the table once it is made, or the status of
    the call that failed to make it: its code and message, as Deephaven forwards a failed
    export's status to its dependents (a failure that is not a status of its own:
    FAILED_PRECONDITION "Export in state DEPENDENCY_FAILED", Deephaven's words);
  * Release of a pending id, or the session's end, ends the waits with FAILED_PRECONDITION
    "Export in state DEPENDENCY_CANCELLED (related parent export id: N)", as Deephaven does;
  * Deephaven waits without bound for an id nobody makes; tickwire waits at most
    `ServerConfig.export_wait_s`, then answers NOT_FOUND.

A session remembers the last ids that ended (released, failed, cancelled) so that naming one
again answers at once: a failed id with its failure (as Deephaven keeps failed exports), a
released one with NOT_FOUND. A later call may make an export under a remembered id again.

Shared tickets (`h` + id bytes, Deephaven's SharedTicketResolver; `SharedTickets`): PublishFromTicket
puts one of a session's exports under an id the client chose, and any session may then name it
(GetExportedTableCreationResponse, DoGet, subscriptions, the source of an operation, ExportFromTicket).
The ticket lives exactly as long as that export: once it is released or its session ends, naming
the ticket answers FAILED_PRECONDITION "Export in state DEPENDENCY_FAILED", as Deephaven does.
"""
from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import threading
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.errors import TickwireError
from tickwire.protocol.tickets import AppTicket, ExportTicket, ScopeTicket, SharedTicket, TicketError, parse_ticket
from tickwire.server.engine import Engine, Table

if TYPE_CHECKING:
    from tickwire.server.services.table_ops import TableOps

__all__ = ["AuthError", "Session", "SessionManager", "ResolveError", "Scope", "ExportClaim", "SharedTickets",
           "failure_status", "PSK_SCHEME", "ANONYMOUS", "CLOSED", "EXPIRED", "SHUTDOWN", "REMEMBERED_ENDS",
           "REMEMBERED_SHARES", "AUTH_COOKIE", "AUTH_COOKIE_REQUEST", "metadata_texts", "session_headers"]

log = logging.getLogger(__name__)

PSK_SCHEME = "io.deephaven.authentication.psk.PskAuthenticationHandler"
ANONYMOUS = "Anonymous"
BEARER = "Bearer"
BASIC = "Basic"
#: the cookie Deephaven sets when a call asks for it (header AUTH_COOKIE_REQUEST: true) and reads
#: a session from: "deephaven-auth-cookie=<token>" (Flight SQL's JDBC and ADBC drivers keep cookies)
AUTH_COOKIE = "deephaven-auth-cookie"
AUTH_COOKIE_REQUEST = "x-deephaven-auth-cookie-request"


def metadata_texts(metadata: Sequence[tuple[str, object]]) -> list[tuple[str, str]]:
    """A call's metadata as (lower-case key, text) pairs."""
    return [(str(k).lower(), v.decode() if isinstance(v, bytes) else str(v)) for k, v in metadata]


def session_headers(session: "Session", metadata: Sequence[tuple[str, object]]) -> tuple[tuple[str, str], ...]:
    """The response headers that tell a client its session: the bearer token, and the auth cookie
    too when the call's `metadata` asked for it (AUTH_COOKIE_REQUEST: true)."""
    headers: tuple[tuple[str, str], ...] = (("authorization", f"{BEARER} {session.token}"),)
    if any(k == AUTH_COOKIE_REQUEST and v.strip().lower() == "true" for k, v in metadata_texts(metadata)):
        headers += (("set-cookie", f"{AUTH_COOKIE}={session.token}"),)
    return headers


class AuthError(TickwireError):
    """No usable credentials."""

    code = "UNAUTHENTICATED"


class ResolveError(TickwireError):
    """A ticket that names nothing usable; `code` is the gRPC status name."""

    def __init__(self, message: str, code: str = "NOT_FOUND"):
        super().__init__(message, code)


#: Why a session's listeners were told it is over (`Session.on_end`).
CLOSED, EXPIRED, SHUTDOWN = "closed", "expired", "shutdown"

#: How many ended export ids (released, failed, cancelled) a session remembers, the oldest
#: forgotten first: a forgotten one named again waits like an id never made
REMEMBERED_ENDS = 4096


def failure_status(exc: BaseException) -> tuple[str, str]:
    """(code, message) that the calls waiting for an export hear when the call making it failed
    with `exc`: the failure's own status, as Deephaven forwards a failed export's status to its
    dependents; what has none of its own (an internal error) is Deephaven's DEPENDENCY_FAILED."""
    if isinstance(exc, TickwireError):
        return exc.code, str(exc)
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "CANCELLED", "Export is cancelled"
    return "FAILED_PRECONDITION", "Export in state DEPENDENCY_FAILED"


def _cancelled_status(export_id: int) -> tuple[str, str]:
    """What the calls waiting for a pending export hear when it is released or its session ends."""
    return "FAILED_PRECONDITION", f"Export in state DEPENDENCY_CANCELLED (related parent export id: {export_id})"


def _missing(export_id: int) -> ResolveError:
    code = "NOT_FOUND" if export_id > 0 else "FAILED_PRECONDITION"
    return ResolveError(f"export {export_id} does not exist in this session", code)


@dataclass(frozen=True)
class _Ended:
    """An export id that ended: the status a call naming it gets, and whether a Release ended it."""
    code: str
    message: str
    released: bool = False


class ExportClaim:
    """A result id a running call has claimed: pending until the call `fulfil`s it with its
    table or `fail`s it (each at most once; later calls do nothing, or raise for `fulfil`).

    Use as a context manager around the call's work: leaving it with an exception fails the
    claim with that exception's status, leaving it unsettled fails it as an internal error."""

    __slots__ = ("session", "export_id", "settled")

    def __init__(self, session: "Session", export_id: int):
        self.session = session
        self.export_id = export_id
        self.settled = False  # under the session's lock

    def fulfil(self, table: Table) -> None:
        """The export now holds `table`; ResolveError (UNAUTHENTICATED when the session ended,
        CANCELLED when the id was released meanwhile) when it cannot, and nothing holds it."""
        self.session.fulfil_claim(self, table)

    def fail(self, exc: BaseException) -> None:
        """The call could not make the export: the calls waiting for it hear `exc`'s status."""
        self.session.fail_claim(self, *failure_status(exc))

    def __enter__(self) -> "ExportClaim":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:
            self.fail(exc)
        elif not self.settled:
            self.session.fail_claim(self, "INTERNAL", f"export {self.export_id} was never made")


@dataclass(eq=False)
class _Pending:
    """An export id named before it is made: the call making it (once one has claimed it) and the
    calls waiting for it, each as (its event loop, its future)."""
    claim: Optional[ExportClaim] = None
    waiters: list = field(default_factory=list)


def _settle(fut: asyncio.Future, table: Optional[Table], status: Optional[tuple[str, str]]) -> None:
    if fut.done():  # the waiter gave up (its bound, or its call was cancelled)
        return
    if status is None:
        fut.set_result(table)
    else:
        fut.set_exception(ResolveError(status[1], status[0]))


def _wake(waiters: list, table: Optional[Table], status: Optional[tuple[str, str]]) -> None:
    """Settles the waiters' futures on their own loops (from any thread)."""
    for loop, fut in waiters:
        try:
            loop.call_soon_threadsafe(_settle, fut, table, status)
        except RuntimeError:  # that loop is closed: nobody waits there any more
            pass


_SESSION_IDS = itertools.count(1)


@dataclass(eq=False)
class Session:
    """One client's session: its exports and who listens for its end.

    `exports` holds the exports made ({id: table}); ids named before they are made wait in
    `_pending`, ids that ended are remembered in `_ended` (see the module's docstring).

    Listeners (`on_end`, `on_exports`) are called on whatever thread ends the session or changes
    its exports (a worker, the reaper, the stopping thread), never under the session's lock; a
    listener on an event loop hands itself over with `loop.call_soon_threadsafe`."""

    token: str
    expires: float
    exports: dict[int, Table] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    ended_by: Optional[str] = None  # CLOSED or EXPIRED once ended
    id: int = field(default_factory=lambda: next(_SESSION_IDS))  # for logs: the token is a secret
    auth: str = ""  # how it was opened, for logs: "anonymous", "psk", "basic"
    peer: str = ""  # who opened it, for logs, when known
    announced: bool = False  # its opening was logged at INFO (see SessionManager)
    _pending: dict[int, _Pending] = field(default_factory=dict, repr=False)
    _ended: "OrderedDict[int, _Ended]" = field(default_factory=OrderedDict, repr=False)
    _end_listeners: list = field(default_factory=list, repr=False)
    _export_listeners: list = field(default_factory=list, repr=False)
    _export_ends: dict[int, list] = field(default_factory=dict, repr=False)  # see on_export_end

    # -- making exports ----------------------------------------------------------------------------
    def claim(self, export_id: int) -> ExportClaim:
        """Registers `export_id` as the result of a running call: from now on a call naming it
        waits for it. Call it before the call's first await. ResolveError: INVALID_ARGUMENT
        for an id that is not positive, ALREADY_EXISTS when the id is exported or claimed,
        UNAUTHENTICATED when the session has ended."""
        if export_id <= 0:
            raise ResolveError(f"result export id must be positive (client-chosen), got {export_id}",
                               "INVALID_ARGUMENT")
        with self.lock:
            if self.closed:
                raise ResolveError("the session is closed", "UNAUTHENTICATED")
            pending = self._pending.get(export_id)
            if export_id in self.exports or (pending is not None and pending.claim is not None):
                raise ResolveError(f"export {export_id} already exists in this session", "ALREADY_EXISTS")
            if pending is None:
                pending = self._pending[export_id] = _Pending()
            self._ended.pop(export_id, None)
            claim = pending.claim = ExportClaim(self, export_id)
        return claim

    def export(self, export_id: int, table: Table) -> None:
        """Exports `table` as `export_id` at once (a claim fulfilled on the spot)."""
        self.claim(export_id).fulfil(table)

    def fulfil_claim(self, claim: ExportClaim, table: Table) -> None:
        """`claim.fulfil(table)` (the claim's session does the bookkeeping)."""
        eid = claim.export_id
        with self.lock:
            if self.closed:  # closed or expired while the call ran: nothing may outlive it
                raise ResolveError("the session is closed", "UNAUTHENTICATED")
            pending = self._pending.get(eid)
            if claim.settled or pending is None or pending.claim is not claim:
                raise ResolveError("Export is cancelled", "CANCELLED")  # released while it was made
            claim.settled = True
            del self._pending[eid]
            self.exports[eid] = table
            waiters = list(pending.waiters)  # (a waiter that wakes takes itself off the list)
            listeners = list(self._export_listeners)
        _wake(waiters, table, None)
        _call_all(listeners)

    def fail_claim(self, claim: ExportClaim, code: str, message: str) -> None:
        """`claim.fail(...)` with a status (the claim's session does the bookkeeping)."""
        eid = claim.export_id
        with self.lock:
            if claim.settled:
                return
            claim.settled = True
            pending = self._pending.get(eid)
            if pending is None or pending.claim is not claim:
                return
            del self._pending[eid]
            if not self.closed:
                self._remember(eid, _Ended(code, message))
            waiters = list(pending.waiters)  # (a waiter that wakes takes itself off the list)
        _wake(waiters, None, (code, message))

    def _remember(self, export_id: int, ended: _Ended) -> None:
        """Under the lock."""
        self._ended.pop(export_id, None)
        self._ended[export_id] = ended
        while len(self._ended) > REMEMBERED_ENDS:
            self._ended.popitem(last=False)

    # -- naming exports ----------------------------------------------------------------------------
    def get(self, export_id: int) -> Table:
        """The table of `export_id` now: ResolveError when it is not (yet) made."""
        with self.lock:
            t = self.exports.get(export_id)
            ended = self._ended.get(export_id) if t is None else None
        if t is None:
            if ended is not None:
                raise ResolveError(ended.message, ended.code)
            raise _missing(export_id)
        return t

    async def wait_for(self, export_id: int, timeout: float, clock: Clock = SYSTEM_CLOCK) -> Table:
        """The table of `export_id`, waiting (on the event loop, holding no lock) while it is
        pending: until the call making it fulfils it, fails it (its status is raised), it is
        released or the session ends, or `timeout` seconds of `clock` pass with nobody making it
        (NOT_FOUND). An id that ended answers at once."""
        loop = asyncio.get_running_loop()
        with self.lock:
            t = self.exports.get(export_id)
            if t is not None:
                return t
            ended = self._ended.get(export_id)
            if ended is None and (export_id <= 0 or self.closed):
                raise _missing(export_id)
            if ended is None:
                pending = self._pending.get(export_id)
                if pending is None:
                    pending = self._pending[export_id] = _Pending()
                fut = loop.create_future()
                pending.waiters.append((loop, fut))
                # the wait counts from now, not from when the timer task first runs (a moment
                # later, or much later on a loaded machine)
                deadline = clock.monotonic() + timeout
        if ended is not None:
            raise ResolveError(ended.message, ended.code)
        # not asyncio.wait_for: before Python 3.12 it can swallow the call's cancellation when the
        # export is settled at the same moment
        async def give_up() -> None:
            await clock.sleep(deadline - clock.monotonic())
            _settle(fut, None, ("NOT_FOUND", f"export {export_id} does not exist in this session "
                                             f"(no call made it within {timeout:g} s)"))

        timer = loop.create_task(give_up())
        assert pending is not None  # registered above, as the id is neither exported nor ended
        try:
            return await fut
        finally:
            timer.cancel()
            with self.lock:
                try:
                    pending.waiters.remove((loop, fut))
                except ValueError:
                    pass
                if pending.claim is None and not pending.waiters and self._pending.get(export_id) is pending:
                    del self._pending[export_id]  # nobody makes it and nobody waits any more

    # -- ending exports ----------------------------------------------------------------------------
    def release(self, export_id: int) -> Optional[Table]:
        """Removes export `export_id`; returns its table, or None for an id that holds none (a
        pending one, whose waiters are told it was cancelled, a failed one, or one released
        before: Deephaven answers those OK too). ResolveError UNAVAILABLE "Export not yet
        defined" for an id the session does not know, as Deephaven answers it."""
        waiters: list = []
        listeners: list = []
        with self.lock:
            table = self.exports.pop(export_id, None)
            pending = self._pending.pop(export_id, None) if table is None else None
            ended = self._ended.get(export_id) if table is None and pending is None else None
            if table is not None:
                self._remember(export_id, _Ended("NOT_FOUND", f"export {export_id} does not exist in this session",
                                                 released=True))
                listeners = list(self._export_listeners) + self._export_ends.pop(export_id, [])
            elif pending is not None:
                if pending.claim is not None:
                    pending.claim.settled = True  # the call making it finds it cancelled
                status = _cancelled_status(export_id)
                self._remember(export_id, _Ended(*status))
                waiters = list(pending.waiters)
            elif ended is None:  # as Deephaven answers an id no call has named
                raise ResolveError("Export not yet defined", "UNAVAILABLE")
        if waiters:
            _wake(waiters, None, _cancelled_status(export_id))
        _call_all(listeners)
        return table

    def end(self, reason: str = CLOSED) -> list[Table]:
        """Closes the session: no export can be added any more; returns the tables it held. The
        calls waiting for its pending exports are told they were cancelled. The end listeners
        hear `reason` (once: a second end tells nobody)."""
        with self.lock:
            first = not self.closed
            self.closed = True
            if first:
                self.ended_by = reason
            held = list(self.exports.values())
            self.exports.clear()
            pending = [(eid, list(p.waiters)) for eid, p in self._pending.items()]
            for p in self._pending.values():
                if p.claim is not None:
                    p.claim.settled = True
            self._pending = {}
            self._ended.clear()
            listeners = list(self._end_listeners) if first else []
            self._end_listeners.clear()
            self._export_listeners.clear()
            export_ends = [fn for fns in self._export_ends.values() for fn in fns]
            self._export_ends.clear()
        for eid, waiters in pending:
            _wake(waiters, None, _cancelled_status(eid))
        _call_all(listeners, reason)
        _call_all(export_ends)
        return held

    # -- listeners -----------------------------------------------------------------------------------
    def announce(self, reason: str) -> None:
        """Tells the end listeners `reason` without ending the session (the server is stopping:
        its streams get their last word before the transport goes)."""
        with self.lock:
            listeners = list(self._end_listeners)
            self._end_listeners.clear()
        _call_all(listeners, reason)

    def on_end(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Calls `fn(reason)` once, when the session ends (CLOSED, EXPIRED) or the server stops
        (SHUTDOWN); at once (EXPIRED or CLOSED) when it has already ended. Returns a function that
        takes `fn` back."""
        with self.lock:
            ended = self.ended_by if self.closed else None
            if ended is None:
                self._end_listeners.append(fn)
        if ended is not None:
            _call_all([fn], ended)
        return lambda: self._remove(self._end_listeners, fn)

    def on_export_end(self, export_id: int, table: Table, fn: Callable[[], None]) -> bool:
        """Calls `fn()` once, when export `export_id` (which must hold `table` now) is released or
        the session ends; False, and `fn` is never called, when it does not hold `table` (any
        more)."""
        with self.lock:
            if self.closed or self.exports.get(export_id) is not table:
                return False
            self._export_ends.setdefault(export_id, []).append(fn)
        return True

    def on_exports(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Calls `fn()` after each export added or released; returns a function that takes it back."""
        with self.lock:
            if not self.closed:
                self._export_listeners.append(fn)
        return lambda: self._remove(self._export_listeners, fn)

    def _remove(self, listeners: list, fn) -> None:
        with self.lock:
            try:
                listeners.remove(fn)
            except ValueError:
                pass

    def export_items(self) -> list[tuple[int, Table]]:
        """(export id, table) of every export, in id order."""
        with self.lock:
            return sorted(self.exports.items(), key=lambda kv: kv[0])

    @property
    def pending_count(self) -> int:
        """How many ids are named but not made yet."""
        with self.lock:
            return len(self._pending)

    def waiting(self, export_id: int) -> int:
        """How many calls are waiting for `export_id` to be made."""
        with self.lock:
            pending = self._pending.get(export_id)
            return 0 if pending is None else len(pending.waiters)




def _log_open(s: Session, level: int) -> None:
    log.log(level, "session %d opened (auth %s%s)", s.id, s.auth, f", peer {s.peer}" if s.peer else "",
            extra={"event": "session_open", "session": s.id, "auth": s.auth, "peer": s.peer})


def _log_end(s: Session, reason: str) -> None:
    # a session nobody used after its first call (a pyarrow.flight call with fresh credentials
    # each time) came and goes at DEBUG, as it was opened
    log.log(logging.INFO if s.announced else logging.DEBUG, "session %d %s (auth %s%s)", s.id, reason,
            s.auth or "?", f", peer {s.peer}" if s.peer else "",
            extra={"event": "session_end", "session": s.id, "reason": reason, "auth": s.auth, "peer": s.peer})


def _call_all(listeners: list, *args) -> None:
    for fn in listeners:
        try:
            fn(*args)
        except Exception:  # one listener failing must not keep the others from hearing
            log.exception("a session listener failed")


ReleaseHook = Callable[[list], None]


class SessionManager:
    """Issues and checks bearer tokens; `psk` None means anonymous access is allowed.

    A session opened with a checked pre-shared key is logged at INFO; one opened on an anonymous
    server (any credentials pass) at DEBUG, and at INFO once it is used again: a client that opens
    a session for every call (pyarrow.flight with its headers) does not fill the log.

    Sessions expire `duration_ms` after their last call (times of `clock`). A reaper thread
    (running while any session exists) ends expired sessions and hands the tables they held to
    `on_expire` (set by the service that frees them), so an abandoned session frees its exports
    without any traffic."""

    def __init__(self, psk: Optional[str] = None, duration_ms: int = 300_000, *, clock: Clock = SYSTEM_CLOCK):
        self.psk = psk
        self.clock = clock
        self.duration_ms = int(duration_ms)
        self.on_expire: Optional[ReleaseHook] = None
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._reaper: Optional[threading.Thread] = None
        self._stop = threading.Event()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def live(self) -> list[Session]:
        """The sessions open now."""
        with self._lock:
            return list(self._sessions.values())

    def exports_held(self) -> int:
        """Exports held by the open sessions."""
        total = 0
        for s in self.live():
            with s.lock:
                total += len(s.exports)
        return total

    @property
    def reap_interval(self) -> float:
        """Seconds between expiry checks: a session outlives its duration by at most this."""
        return min(1.0, max(0.01, self.duration_ms / 4000.0))

    def own_session(self) -> Session:
        """A session of the server itself, which never expires and no client holds (a fan-out
        worker's local calls run under it: the engine process checked their own credentials)."""
        s = Session(token=str(uuid.uuid4()), expires=float("inf"), auth="worker")
        with self._lock:
            self._sessions[s.token] = s
        return s

    def _new(self, auth: str = "", peer: Optional[str] = None, *, announce: bool = False) -> Session:
        s = Session(token=str(uuid.uuid4()), expires=self.clock.monotonic() + self.duration_ms / 1000.0, auth=auth,
                    peer=peer or "", announced=announce)
        _log_open(s, logging.INFO if announce else logging.DEBUG)
        with self._lock:
            self._sessions[s.token] = s
            if self._reaper is None and not self._stop.is_set():
                self._reaper = threading.Thread(target=_reap_loop, args=(weakref.ref(self), self._stop, self.clock),
                                                name="tickwire-session-reaper", daemon=True)
                self._reaper.start()
        return s

    def reap(self, now: Optional[float] = None) -> int:
        """Ends every expired session and frees what it held (through `on_expire`); returns how
        many ended. Runs on the reaper thread: the hook may take the update graph's lock."""
        now = self.clock.monotonic() if now is None else now
        with self._lock:
            expired = [s for s in self._sessions.values() if s.expires < now]
            for s in expired:
                del self._sessions[s.token]
        for s in expired:
            if not s.closed:
                _log_end(s, EXPIRED)
            held = s.end(EXPIRED)
            hook = self.on_expire
            if held and hook is not None:
                try:
                    hook(held)
                except Exception:  # the reaper keeps running; the next session still expires
                    log.exception("freeing the exports of an expired session failed")
        return len(expired)

    def reap_step(self) -> bool:
        """One pass of the reaper thread; False when it should end (no session left)."""
        self.reap()
        with self._lock:
            if self._sessions and not self._stop.is_set():
                return True
            self._reaper = None
            return False

    def stop(self) -> None:
        """Ends the reaper thread and tells every session's end listeners that the server is
        stopping (SHUTDOWN): a held TerminationNotification answers while it still can. The
        sessions themselves stay until the process ends. Called again, it tells nobody twice."""
        self._stop.set()
        with self._lock:
            live = list(self._sessions.values())
        for s in live:
            s.announce(SHUTDOWN)

    def authenticate(self, metadata: Sequence[tuple[str, object]], peer: Optional[str] = None) -> Session:
        """The session of a call's request metadata, creating one for valid initial credentials.
        `peer` (the caller's address) is only logged.

        Raises AuthError when the call has no usable credentials (logged at WARNING)."""
        try:
            return self._authenticate(metadata, peer)
        except AuthError as exc:
            log.warning("refused credentials%s: %s", f" from {peer}" if peer else "", exc,
                        extra={"event": "auth_refused", "peer": peer or "", "reason": str(exc)})
            raise

    def _authenticate(self, metadata: Sequence[tuple[str, object]], peer: Optional[str]) -> Session:
        now = self.clock.monotonic()
        texts = metadata_texts(metadata)
        for k, v in texts:  # Deephaven's auth cookie (Flight SQL clients), looked at first as Deephaven does
            if k == "cookie":
                name, eq, token = v.strip().partition("=")
                if eq and name == AUTH_COOKIE and "=" not in token:
                    found = self._by_token(token, now)
                    if found is not None:
                        return found
        values = [v for k, v in texts if k == "authorization"]
        if not values:
            raise AuthError("no authorization header; send 'authorization: Anonymous'"
                            + (" or the pre-shared key" if self.psk is not None else ""))
        header = values[-1].strip()
        scheme, _, rest = header.partition(" ")
        rest = rest.strip()
        if scheme == BEARER:
            found = self._by_token(rest, now)
            if found is not None:
                return found
            # not a session: Deephaven reads a bearer value as "<auth type> <credentials>" too (how
            # Flight SQL clients, which only send bearer tokens, log in)
            inner, _, inner_rest = rest.partition(" ")
            if inner not in (ANONYMOUS, PSK_SCHEME, BASIC):
                raise AuthError("unknown or expired session token")
            scheme, rest = inner, inner_rest.strip()
        if scheme == ANONYMOUS and not rest:
            if self.psk is not None:
                raise AuthError("anonymous access is disabled; this server requires a pre-shared key")
            return self._new("anonymous", peer)
        if scheme == PSK_SCHEME:
            if self.psk is None:
                return self._new("psk (unchecked)", peer)  # anonymous servers accept any credentials
            if hmac.compare_digest(rest.encode(), self.psk.encode()):
                return self._new("psk", peer, announce=True)
            raise AuthError("wrong pre-shared key")
        if scheme == BASIC and self.psk is None:
            return self._new("basic (unchecked)", peer)
        raise AuthError(f"unsupported authorization scheme {scheme!r}")

    def _by_token(self, token: str, now: float) -> Optional[Session]:
        """The live session of a bearer token (its lease renewed), or None."""
        with self._lock:
            s = self._sessions.get(token)
            if s is None or s.expires < now or s.closed:
                return None
            s.expires = now + self.duration_ms / 1000.0
            first_reuse = not s.announced
            s.announced = True
        if first_reuse:
            _log_open(s, logging.INFO)
        return s

    def shorten_lease(self, session: Session, until: float) -> None:
        """Lets `session` expire at `until` (the clock's monotonic()) unless used before then: a closed
        browser socket's sessions go soon after it, while a client that reconnects with the same
        token keeps its session (any call renews the full duration)."""
        with self._lock:
            if session.expires > until:
                session.expires = until

    def close(self, session: Session) -> list[Table]:
        """Ends `session` (CloseSession); returns the tables its exports held, for the caller to free."""
        with self._lock:
            self._sessions.pop(session.token, None)
        if not session.closed:
            _log_end(session, CLOSED)
        return session.end(CLOSED)


def _reap_loop(manager_ref, stop: threading.Event, clock: Clock) -> None:
    """The reaper thread: holds its manager weakly, so a dropped server's manager goes away."""
    while True:
        manager = manager_ref()
        if manager is None:
            return
        interval = manager.reap_interval
        if not manager.reap_step():
            return
        del manager
        if clock.wait(stop, interval):
            return


#: How many shared tickets whose export ended a server remembers (answering as Deephaven does while
#: it still knows them), the oldest forgotten first: a forgotten id may be published again
REMEMBERED_SHARES = 4096


class SharedTickets:
    """The server's shared tickets (`h` + id bytes), as Deephaven's SharedTicketResolver keeps them:
    an id names one session's export, the one PublishFromTicket put there, for every session.

    A second publish to an id taken answers ALREADY_EXISTS (the same export or another), as
    Deephaven does. Once that export is released or its session ends, the id names an ended
    export: naming it answers FAILED_PRECONDITION "Export in state DEPENDENCY_FAILED" and it
    cannot be published to again, until it is forgotten (REMEMBERED_SHARES; Deephaven forgets it
    when its collector frees the export)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[bytes, Table] = {}
        self._ended: "OrderedDict[bytes, None]" = OrderedDict()

    def publish(self, shared_id: bytes, session: Session, export_id: int, table: Table) -> None:
        """Puts export `export_id` of `session` (holding `table`) under `shared_id`: ResolveError
        ALREADY_EXISTS when the id is taken."""
        with self._lock:
            if shared_id in self._live or shared_id in self._ended:
                raise ResolveError(f"Could not publish 'resultId' to shared ticket '{shared_id.hex()}' (hex): "
                                   "destination already exists", "ALREADY_EXISTS")
            self._live[shared_id] = table
        if not session.on_export_end(export_id, table, lambda: self._end(shared_id, table)):
            self._end(shared_id, table)  # released (or its session ended) meanwhile: published, ended

    def _end(self, shared_id: bytes, table: Table) -> None:
        with self._lock:
            if self._live.get(shared_id) is not table:
                return
            del self._live[shared_id]
            self._ended[shared_id] = None
            while len(self._ended) > REMEMBERED_SHARES:
                self._ended.popitem(last=False)

    def get(self, shared_id: bytes) -> Table:
        """The table `shared_id` names, or ResolveError: NOT_FOUND for an id nobody published,
        FAILED_PRECONDITION for one whose export ended."""
        with self._lock:
            table = self._live.get(shared_id)
            ended = table is None and shared_id in self._ended
        if table is not None:
            return table
        if ended:
            raise ResolveError("Export in state DEPENDENCY_FAILED", "FAILED_PRECONDITION")
        raise ResolveError(f"Could not resolve shared ticket: ticket '{shared_id.hex()}' not found", "NOT_FOUND")

    @property
    def count(self) -> int:
        """How many shared tickets name a live export."""
        with self._lock:
            return len(self._live)


class Scope:
    """The global scope: every visible table of the engine, by name (`s/<name>` tickets).

    Hidden tables (`hidden`) are neither listed nor resolvable: they are reached only through
    the export tickets of the session that holds them. `ops` keeps the session-owned tables'
    reference counts (tickwire.server.services.table_ops.TableOps), shared by every service.
    System tables are listed when `list_system` (a server started with --show-system-tables).
    `shared` holds the shared tickets (`h` + id), which any session reaches."""

    def __init__(self, engine: Engine, ops: "TableOps", *, list_system: bool = False):
        self.engine = engine
        self.ops = ops
        self.list_system = list_system
        self.shared = SharedTickets()

    def names(self) -> list[str]:
        return self.engine.public_names(system=self.list_system)

    def names_now(self) -> tuple[str, ...]:
        """The listed names without waiting for a cycle boundary (Engine.names_now)."""
        return self.engine.names_now(system=self.list_system)

    def get(self, name: str) -> Table:
        t = self.engine.resolve(name)
        if t is None:
            raise ResolveError(f"Could not resolve 'table': variable '{name}' not found", "NOT_FOUND")
        return t

    def resolve(self, ticket: bytes, session: Optional[Session]) -> Table:
        """The table a ticket names, or ResolveError with the status code to answer."""
        try:
            t = parse_ticket(ticket)
        except TicketError as exc:
            raise ResolveError(str(exc), exc.code) from None
        return self.resolve_parsed(t, session)

    async def resolve_async(self, ticket: bytes, session: Optional[Session], wait_s: float) -> Table:
        """The table a ticket names, waiting up to `wait_s` seconds of the engine's clock for a
        pending export of the session (`Session.wait_for`); ResolveError with the status code to
        answer."""
        try:
            t = parse_ticket(ticket)
        except TicketError as exc:
            raise ResolveError(str(exc), exc.code) from None
        return await self.resolve_parsed_async(t, session, wait_s)

    async def resolve_parsed_async(self, t, session: Optional[Session], wait_s: float) -> Table:
        if isinstance(t, ExportTicket) and session is not None:
            return await session.wait_for(t.export_id, wait_s, self.engine.clock)
        return self.resolve_parsed(t, session)

    def resolve_parsed(self, t, session: Optional[Session]) -> Table:
        """The table a parsed ticket names now (an export that is still pending is NOT_FOUND)."""
        if isinstance(t, ScopeTicket):
            return self.get(t.name)
        if isinstance(t, ExportTicket):
            if session is None:
                raise ResolveError("export tickets need a session", "UNAUTHENTICATED")
            return session.get(t.export_id)
        if isinstance(t, AppTicket):
            if t.app_id == "scope":
                return self.get(t.field)
            # a namespace's table: "NAMESPACE/TABLE" in the catalog, a field of application NAMESPACE
            table = self.engine.resolve(f"{t.app_id}/{t.field}")
            if table is None:
                raise ResolveError(f"no application {t.app_id!r} (field {t.field!r})", "NOT_FOUND")
            return table
        if isinstance(t, SharedTicket):
            if session is None:  # as Deephaven: only a session is handed a shared export
                raise ResolveError(f"Could not resolve shared ticket '{t.shared_id.hex()}': no session to "
                                   "hand it to", "UNAUTHENTICATED")
            return self.shared.get(t.shared_id)
        raise ResolveError(f"unsupported ticket {t!r}", "FAILED_PRECONDITION")
