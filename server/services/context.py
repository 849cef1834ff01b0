"""What every service of one server shares: its engine, sessions, scope, publishers, worker pool and
configuration (`ServerContext`). The server builds one (`TickwireServer`); a test builds one
around an engine of its own to call the services' handlers without sockets
(tests/harness.py)."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from typing import Any, Callable, Optional

from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine, Table
from tickwire.server.engine.publishing import PublisherRegistry
from tickwire.server.services.rpc import call_session
from tickwire.server.services.sessions import Scope, Session, SessionManager, session_headers
from tickwire.server.services.table_ops import TableOps

__all__ = ["ServerContext"]


class ServerContext:
    """The engine, the sessions, the scope (tables by name and by export ticket), the publishers,
    the worker pool that runs blocking work off the event loop, and the configuration."""

    def __init__(self, engine: Engine, config: Optional[ServerConfig] = None, *,
                 executor: Optional[concurrent.futures.Executor] = None,
                 sessions: Optional[SessionManager] = None, registry: Optional[PublisherRegistry] = None):
        self.engine = engine
        self.config = config = config or ServerConfig()
        self.executor = executor if executor is not None else concurrent.futures.ThreadPoolExecutor(
            max_workers=config.workers, thread_name_prefix="tickwire-work")
        self.sessions = sessions if sessions is not None else SessionManager(
            psk=config.psk, duration_ms=config.session_duration_ms, clock=engine.clock)
        self.registry = registry if registry is not None else engine.publishers(config.publishing)
        self.ops = TableOps(engine)
        self.scope = Scope(engine, self.ops, list_system=config.show_system_tables)

    @property
    def clock(self):
        return self.engine.clock

    async def run(self, fn: Callable, *args) -> Any:
        """Runs blocking work (reading tables, encoding) off the event loop, in the worker pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    def session_of(self, context) -> Session:
        """The call's session, without awaiting anything: the one its credentials were checked
        for before its body was parsed, or (outside such a call) a fresh check of its metadata."""
        session = call_session()
        if session is None:
            session = self.sessions.authenticate(context.invocation_metadata() or ())
        return session

    @staticmethod
    async def send_session_header(context, session: Session, extra: tuple[tuple[str, str], ...] = ()) -> None:
        """The response header that tells the client its session's bearer token, and the auth
        cookie too when the call asked for it (`x-deephaven-auth-cookie-request: true`), with
        `extra` headers of the call's own."""
        await context.send_initial_metadata(session_headers(session, context.invocation_metadata() or ()) + extra)

    async def authenticate(self, context, *, send_header: bool = True) -> Session:
        """The call's session (`session_of`), its header sent unless `send_header` is False."""
        session = self.session_of(context)
        if send_header:
            await self.send_session_header(context, session)
        return session

    async def resolve(self, ticket: bytes, session: Optional[Session]) -> Table:
        """The table `ticket` names; an export of `session` still being made is waited for (up to
        `config.export_wait_s`): see tickwire.server.services.sessions."""
        return await self.scope.resolve_async(ticket, session, self.config.export_wait_s)

    async def resolve_parsed(self, ticket, session: Optional[Session]) -> Table:
        """`resolve` for a parsed ticket."""
        return await self.scope.resolve_parsed_async(ticket, session, self.config.export_wait_s)

    def record_snapshot(self, table, kind: str, **figures) -> None:
        """A DoGet's or snapshot request's figures, into the performance tables when there are any."""
        perf = self.engine.perf
        if perf is not None:
            perf.record_snapshot(table, kind, **figures)
