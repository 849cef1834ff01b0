"""The standard gRPC health service (grpc.health.v1, from grpcio-health-checking) for one server.

Service names and what they answer:

* `""` (the server as a whole) and `arrow.flight.protocol.FlightService`: NOT_SERVING until the
  update graph has run its first cycle, SERVING after, NOT_SERVING from the first thing `stop`
  does (and for good: a stopping server never turns SERVING again);
* `tickwire.table/<name>` for every published table: SERVING, or NOT_SERVING once the table has
  failed (a derived table whose computation raised, tickwire.server.engine.graph) or, for a durable
  table, once its storage refuses writes (its journal could not be written or synced, or the data
  directory was closed: `SourceTable.refusal`, tickwire.server.engine.storage); the names are kept
  up to date at the end of every cycle, so a table created or failed between cycles appears at
  the next one. A name that no table has (any more) answers NOT_FOUND to Check and
  SERVICE_UNKNOWN to Watch, as the protocol says.

The service answers without credentials (it is registered beside the guarded handlers, not
through them), as load balancers and orchestrators call it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Iterable, Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from tickwire.protocol.proto.methods import FLIGHT_SERVICE

__all__ = ["Health", "TABLE_SERVICE_PREFIX", "SERVER_SERVICES", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN",
           "status_name"]

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

TABLE_SERVICE_PREFIX = "tickwire.table/"
#: the names that stand for the whole server
SERVER_SERVICES = ("", FLIGHT_SERVICE)


def status_name(status: int) -> str:
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)


class _Servicer(health_aio.HealthServicer):
    """grpc_health's asyncio servicer (Watch, graceful shutdown); Check reads the statuses as
    `Health` knows them, so that it never lags behind the event loop."""

    def __init__(self, health: "Health"):
        super().__init__()
        self._health = health

    async def Check(self, request, context):
        status = self._health.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)


class Health:
    """The statuses of one server's health service names; `set` may be called from any thread
    (the update graph's cycle thread sets them), the servicer's Watch streams hear of each change
    on the server's event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, int] = dict.fromkeys(SERVER_SERVICES, NOT_SERVING)
        self._tables: set[str] = set()
        self._dirty: set[str] = set()
        self._flush_scheduled = False
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.stopping = False
        self.servicer = _Servicer(self)

    # -- serving ------------------------------------------------------------------------------------
    async def add_to_server(self, server: grpc.aio.Server) -> None:
        """Registers the service on `server` (call on its event loop, before it starts). A server
        started again after `stop` begins anew: NOT_SERVING until the next cycle."""
        if self.stopping:
            with self._lock:
                self.stopping = False
                self._status = dict.fromkeys(SERVER_SERVICES, NOT_SERVING)
                self._tables = set()
                self._dirty = set()
                self._flush_scheduled = False
            self.servicer = _Servicer(self)
        self._loop = asyncio.get_running_loop()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        with self._lock:
            self._dirty.update(self._status)
        await self._flush()

    def status(self, service: str = "") -> Optional[int]:
        """The status of `service` (None: no such name)."""
        with self._lock:
            return self._status.get(service)

    @property
    def serving(self) -> bool:
        return self.status("") == SERVING

    # -- changes --------------------------------------------------------------------------------------
    def set_serving(self, serving: bool) -> None:
        """The server as a whole (every name of SERVER_SERVICES)."""
        self._update(dict.fromkeys(SERVER_SERVICES, SERVING if serving else NOT_SERVING))

    def set_tables(self, statuses: dict[str, int]) -> None:
        """The statuses of every published table by table name; names of tables that are gone are
        dropped."""
        with self._lock:
            gone = self._tables - statuses.keys()
        changes: dict[str, Optional[int]] = {TABLE_SERVICE_PREFIX + n: s for n, s in statuses.items()}
        changes.update({TABLE_SERVICE_PREFIX + n: None for n in gone})
        self._update(changes, tables=set(statuses))

    def _update(self, changes: dict[str, Optional[int]], tables: Optional[set] = None) -> None:
        with self._lock:
            if self.stopping:
                return
            if tables is not None:
                self._tables = tables
            changed = []
            for name, status in changes.items():
                if self._status.get(name) == status:
                    continue
                if status is None:
                    del self._status[name]
                else:
                    self._status[name] = status
                changed.append(name)
            if not changed:
                return
            self._dirty.update(changed)
            schedule = not self._flush_scheduled and self._loop is not None
            if schedule:
                self._flush_scheduled = True
        for name in changed:
            status = changes[name]
            log.debug("health of %r: %s", name, "gone" if status is None else status_name(status))
        if schedule:
            self._schedule()

    def _schedule(self) -> None:
        loop = self._loop
        assert loop is not None  # scheduled only once attached to a loop
        try:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._flush()))
        except RuntimeError:  # the loop is closed: the server has stopped
            with self._lock:
                self._flush_scheduled = False

    async def _flush(self) -> None:
        """Hands the latest statuses of the changed names to the servicer (its Watch streams)."""
        with self._lock:
            dirty, self._dirty, self._flush_scheduled = self._dirty, set(), False
            latest = {name: self._status.get(name, SERVICE_UNKNOWN) for name in dirty}
        for name, status in latest.items():
            await self.servicer.set(name, status)

    async def shutdown(self) -> None:
        """NOT_SERVING for every name, for good (on the event loop)."""
        with self._lock:
            self.stopping = True
            for name in self._status:
                self._status[name] = NOT_SERVING
        await self.servicer.enter_graceful_shutdown()

    def shutdown_from_thread(self, timeout: float = 2.0) -> None:
        """`shutdown`, from a thread other than the event loop's (TickwireServer.stop)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            with self._lock:
                self.stopping = True
                for name in self._status:
                    self._status[name] = NOT_SERVING
            return
        try:
            asyncio.run_coroutine_threadsafe(self.shutdown(), loop).result(timeout)
        except Exception:
            log.debug("health shutdown", exc_info=True)
            with self._lock:
                self.stopping = True

    def names(self) -> Iterable[str]:
        with self._lock:
            return sorted(self._status)
