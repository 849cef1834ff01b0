"""Sessions, authentication and ticket resolution for the gRPC services.

Deephaven's clients authenticate with an `authorization` header on their first call
(`Anonymous`, or a pre-shared key in the form `io.deephaven.authentication.psk.PskAuthenticationHandler <key>`)
and the server answers with a response header `authorization: Bearer <token>` that they send on
every later call (BARRAGE-WIRE.md §7.1). A token names a session; a session holds its exports
(`e` + int32 LE tickets) and expires after `http.session.durationMs` without use.
"""
from __future__ import annotations

import hmac
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional, Sequence

from tickwire.protocol.tickets import AppTicket, ExportTicket, ScopeTicket, SharedTicket, TicketError, parse_ticket
from tickwire.server.graph import Table, UpdateGraph

__all__ = ["AuthError", "Session", "SessionManager", "ResolveError", "Scope", "PSK_SCHEME", "ANONYMOUS"]

PSK_SCHEME = "io.deephaven.authentication.psk.PskAuthenticationHandler"
ANONYMOUS = "Anonymous"
BEARER = "Bearer"
BASIC = "Basic"


class AuthError(Exception):
    """No usable credentials (answered with UNAUTHENTICATED)."""


class ResolveError(Exception):
    """A ticket that names nothing usable; `code` is the gRPC status name."""

    def __init__(self, message: str, code: str = "NOT_FOUND"):
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    token: str
    expires: float
    exports: dict[int, Table] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def export(self, export_id: int, table: Table) -> None:
        if export_id <= 0:
            raise ResolveError(f"result export id must be positive (client-chosen), got {export_id}",
                               "INVALID_ARGUMENT")
        with self.lock:
            if export_id in self.exports:
                raise ResolveError(f"export {export_id} already exists in this session", "ALREADY_EXISTS")
            self.exports[export_id] = table

    def release(self, export_id: int) -> bool:
        with self.lock:
            return self.exports.pop(export_id, None) is not None

    def get(self, export_id: int) -> Table:
        with self.lock:
            t = self.exports.get(export_id)
        if t is None:
            code = "NOT_FOUND" if export_id > 0 else "FAILED_PRECONDITION"
            raise ResolveError(f"export {export_id} does not exist in this session", code)
        return t


class SessionManager:
    """Issues and checks bearer tokens; `psk` None means anonymous access is allowed."""

    def __init__(self, psk: Optional[str] = None, duration_ms: int = 300_000):
        self.psk = psk
        self.duration_ms = int(duration_ms)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._last_reap = time.monotonic()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _new(self) -> Session:
        s = Session(token=str(uuid.uuid4()), expires=time.monotonic() + self.duration_ms / 1000.0)
        with self._lock:
            self._sessions[s.token] = s
        return s

    def _reap(self, now: float) -> None:
        if now - self._last_reap < 10.0:
            return
        self._last_reap = now
        with self._lock:
            for tok in [t for t, s in self._sessions.items() if s.expires < now]:
                del self._sessions[tok]

    def authenticate(self, metadata: Sequence[tuple[str, object]]) -> Session:
        """The session of a call's request metadata, creating one for valid initial credentials.

        Raises AuthError when the call has no usable credentials."""
        now = time.monotonic()
        self._reap(now)
        values = [v.decode() if isinstance(v, bytes) else str(v) for k, v in metadata if k.lower() == "authorization"]
        if not values:
            raise AuthError("no authorization header; send 'authorization: Anonymous'"
                            + (" or the pre-shared key" if self.psk is not None else ""))
        header = values[-1].strip()
        scheme, _, rest = header.partition(" ")
        rest = rest.strip()
        if scheme == BEARER:
            with self._lock:
                s = self._sessions.get(rest)
            if s is None or s.expires < now:
                raise AuthError("unknown or expired session token")
            s.expires = now + self.duration_ms / 1000.0
            return s
        if scheme == ANONYMOUS and not rest:
            if self.psk is not None:
                raise AuthError("anonymous access is disabled; this server requires a pre-shared key")
            return self._new()
        if scheme == PSK_SCHEME:
            if self.psk is None:
                return self._new()  # anonymous servers accept any credentials
            if hmac.compare_digest(rest.encode(), self.psk.encode()):
                return self._new()
            raise AuthError("wrong pre-shared key")
        if scheme == BASIC and self.psk is None:
            return self._new()
        raise AuthError(f"unsupported authorization scheme {scheme!r}")

    def close(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.token, None)
        with session.lock:
            session.exports.clear()


class Scope:
    """The global scope: every table of the update graph, by name (`s/<name>` tickets)."""

    def __init__(self, graph: UpdateGraph):
        self.graph = graph

    def names(self) -> list[str]:
        with self.graph.lock:
            return [n for n in self.graph.tables if not n.startswith("__")]

    def get(self, name: str) -> Table:
        t = self.graph.tables.get(name)
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

    def resolve_parsed(self, t, session: Optional[Session]) -> Table:
        if isinstance(t, ScopeTicket):
            return self.get(t.name)
        if isinstance(t, ExportTicket):
            if session is None:
                raise ResolveError("export tickets need a session", "UNAUTHENTICATED")
            return session.get(t.export_id)
        if isinstance(t, AppTicket):
            if t.app_id == "scope":
                return self.get(t.field)
            raise ResolveError(f"no application {t.app_id!r} (field {t.field!r})", "NOT_FOUND")
        if isinstance(t, SharedTicket):
            raise ResolveError(f"shared ticket 0x{t.shared_id.hex()} not found", "NOT_FOUND")
        raise ResolveError(f"unsupported ticket {t!r}", "FAILED_PRECONDITION")
