"""Deephaven's ApplicationService.ListFields: the tables of the global scope, then the ones
created or removed, for as long as the client listens (and its session lives).

One `ScopeWatch` per service looks for new and removed tables, on its own thread, for every open
ListFields stream at once (not one poll per stream); each stream reads the names once more when it
opens, so its first message lists what exists now. Nothing here runs on the event loop that could
wait for the update graph: the names are read without its lock (`Engine.names_now`), off the loop.
A stream ends when its session does, with CANCELLED "subscription cancelled", as Deephaven's does.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable, Optional

from tickwire.protocol.proto import application_pb2
from tickwire.protocol.proto.methods import APPLICATION_SERVICE
from tickwire.server.services.context import ServerContext
from tickwire.server.services.rpc import CallError, service_handlers

__all__ = ["ApplicationService", "ScopeWatch"]

log = logging.getLogger(__name__)


class ScopeWatch:
    """Reads the scope's names every `interval` seconds while anyone listens, on one daemon
    thread, and tells each listener `fn(version, names)` when they changed. Versions grow with
    every read, and listeners hear reads in order, so a stream can drop what is older than what it
    already has."""

    def __init__(self, read: Callable[[], tuple[str, ...]], interval: float):
        self._read = read
        self._interval = float(interval)
        self._lock = threading.Lock()  # listeners and the thread
        self._read_lock = threading.Lock()  # one read at a time, announced in order
        self._listeners: dict[int, Callable] = {}
        self._next_id = 0
        self._thread: Optional[threading.Thread] = None
        self._wake = threading.Event()
        self._version = 0
        self._names: Optional[tuple[str, ...]] = None

    @property
    def interval(self) -> float:
        return self._interval

    def refresh(self) -> tuple[int, tuple[str, ...]]:
        """Reads the names now; tells the listeners when they changed. Returns (version, names)."""
        with self._read_lock:
            names = tuple(self._read())
            self._version += 1
            version = self._version
            changed = names != self._names
            self._names = names
            if changed:
                with self._lock:
                    listeners = list(self._listeners.values())
                for fn in listeners:
                    try:
                        fn(version, names)
                    except Exception:
                        log.exception("a ListFields listener failed")
        return version, names

    def listen(self, fn: Callable[[int, tuple[str, ...]], None]) -> Callable[[], None]:
        """Adds a listener (starting the thread if it is the first); returns its removal."""
        with self._lock:
            key = self._next_id
            self._next_id += 1
            self._listeners[key] = fn
            if self._thread is None:
                self._wake.clear()
                self._thread = threading.Thread(target=self._run, name="tickwire-scope-watch", daemon=True)
                self._thread.start()

        def forget() -> None:
            with self._lock:
                self._listeners.pop(key, None)
                if not self._listeners:
                    self._wake.set()  # the thread sees nobody listens and ends
        return forget

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            with self._lock:
                if not self._listeners:
                    self._thread = None
                    self._names = None  # the next thread starts from nothing known
                    return
                self._wake.clear()
            try:
                self.refresh()
            except Exception:  # keep watching: the next read may work
                log.exception("reading the scope's names failed")


class ApplicationService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.watch = ScopeWatch(ctx.scope.names_now, ctx.config.list_fields_poll_s)

    def handlers(self) -> dict:
        return service_handlers(APPLICATION_SERVICE, {"ListFields": (self.list_fields, None, None)})

    @staticmethod
    def _field(name: str) -> application_pb2.FieldInfo:
        namespace, slash, table = name.partition("/")
        if slash and namespace and table:  # a namespace's table: a field of the application NAMESPACE
            f = application_pb2.FieldInfo(field_name=table, field_description=f"table of namespace {namespace}",
                                          application_id=namespace, application_name=namespace)
            f.typed_ticket.ticket.ticket = f"a/{namespace}/f/{table}".encode()
            f.typed_ticket.type = "Table"
            return f
        f = application_pb2.FieldInfo(field_name=name, field_description="query scope variable",
                                      application_id="scope")
        f.typed_ticket.ticket.ticket = b"s/" + name.encode()
        f.typed_ticket.type = "Table"
        return f

    def _update(self, created, removed) -> application_pb2.FieldsChangeUpdate:
        upd = application_pb2.FieldsChangeUpdate()
        upd.created.extend(self._field(n) for n in created)
        upd.removed.extend(self._field(n) for n in removed)
        return upd

    async def list_fields(self, _req, context):
        session = await self.ctx.authenticate(context)
        loop = asyncio.get_running_loop()
        heard: asyncio.Queue = asyncio.Queue()

        def hand_over(item) -> None:  # from the watch's thread or whoever ends the session
            try:
                loop.call_soon_threadsafe(heard.put_nowait, item)
            except RuntimeError:  # the loop is gone
                pass

        forget_watch = self.watch.listen(lambda version, names: hand_over((version, names)))
        forget_end = session.on_end(lambda _reason: hand_over(None))
        try:
            seen, names = await self.ctx.run(self.watch.refresh)
            yield self._update(names, ())
            known = set(names)
            while True:
                item = await heard.get()
                if item is None:
                    raise CallError("subscription cancelled", "CANCELLED")
                version, names = item
                if version <= seen:
                    continue  # read before what this stream already sent
                seen = version
                now = set(names)
                created = [n for n in names if n not in known]
                removed = sorted(known - now)
                known = now
                if created or removed:
                    yield self._update(created, removed)
        finally:
            forget_watch()
            forget_end()
