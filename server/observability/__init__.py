"""tickwire.server.observability: the health service and the metrics of one server.

`Observability(server)` holds both: the gRPC health service (`health.Health`, registered on the
grpc.aio server without credentials), the Prometheus registry (`metrics.Metrics`), one cycle
listener on the update graph feeding them (per published table: rows, rows in, failed or refusing
writes), and the HTTP handlers `/healthz` and `/metrics`, served by the web side
(tickwire.server.web.site) and, on request, on a port of their own (`metrics_port`).

Nothing here reaches into the graph: tables are read through the server's engine, in the cycle
listener, which runs at the end of each cycle inside the engine's `reading()`.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Optional

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from tickwire.server.engine import kind_of
from tickwire.server.observability.health import NOT_SERVING, SERVING, TABLE_SERVICE_PREFIX, Health, status_name
from tickwire.server.observability.metrics import ErrorCounts, Metrics, TransferCounters

__all__ = ["Observability", "Health", "Metrics", "TransferCounters", "ErrorCounts", "TABLE_SERVICE_PREFIX"]

log = logging.getLogger(__name__)


def _rows_added(table) -> int:
    """Rows a source table's input added this cycle (its row set against the one before the
    cycle, which a changed table exposes until the cycle ends): roaring set work, no per-row Python."""
    prev = table.prev_rowset
    rows = table.rowset
    if prev is None or kind_of(table) == "blink":  # a blink table's rows are all new each cycle
        return len(rows)
    return len(rows.minus(prev))


class Observability:
    """Health and metrics of one TickwireServer. `counters` are the Flight service's."""

    def __init__(self, server, counters: Optional[TransferCounters] = None):
        self.server = server
        self.engine = server.engine
        self.health = Health()
        self.counters = counters if counters is not None else TransferCounters()
        self.errors = ErrorCounts()
        self.metrics = Metrics(server, self.counters, self.errors)
        self._attached = False
        self._runner: Optional[web.AppRunner] = None
        self.metrics_port: Optional[int] = None

    # -- the update graph -----------------------------------------------------------------------------
    def attach(self) -> None:
        """Listens to the graph's cycles; SERVING at once when the graph has run a cycle already."""
        if self._attached:
            return
        self._attached = True
        self.engine.add_cycle_listener(self._on_cycle)
        if self.engine.step > 0:
            self.health.set_serving(True)

    def detach(self) -> None:
        if self._attached:
            self._attached = False
            self.engine.remove_cycle_listener(self._on_cycle)

    def _on_cycle(self, step: int) -> None:
        figures: dict[str, tuple[int, int, bool]] = {}
        statuses: dict[str, int] = {}
        for t in self.engine.tables(system=self.server.config.show_system_tables):  # published tables
            failed = t.failure is not None
            added = _rows_added(t) if not t.parents and t.last_step == step else 0
            figures[t.name] = (t.size, added, failed)
            # a durable table whose storage refuses writes (tickwire.server.engine.storage) takes no input any more
            refused = getattr(t, "refusal", None) is not None
            statuses[t.name] = NOT_SERVING if failed or refused else SERVING
        self.metrics.on_cycle(step, self.engine.cycle_seconds, figures)
        self.health.set_tables(statuses)
        if not self.health.serving:
            self.health.set_serving(True)

    # -- HTTP ---------------------------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        """200 "SERVING", else 503 with the status; `?service=<name>` asks about one name
        (e.g. tickwire.table/<table>), 404 when there is no such name."""
        service = request.query.get("service", "")
        status = self.health.status(service)
        if status is None:
            return web.Response(status=404, text=f"unknown service {service!r}\n",
                                headers={"Cache-Control": "no-store"})
        return web.Response(status=200 if status == SERVING else 503, text=status_name(status) + "\n",
                            headers={"Cache-Control": "no-store"})

    async def metrics_page(self, request: web.Request) -> web.Response:
        # only short locks are taken, never the graph's: a scrape never waits for a cycle; it runs
        # on the loop's default executor, not on the loop (a thousand tables take ~15 ms to format)
        # nor in the worker pool (where it would queue behind encoding)
        body = await asyncio.get_running_loop().run_in_executor(None, self.metrics.exposition)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST, "Cache-Control": "no-store"})

    def routes(self) -> list[tuple[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]]:
        return [("/healthz", self.healthz), ("/metrics", self.metrics_page)]

    async def listen(self, host: str, port: int) -> int:
        """Serves /metrics and /healthz on a port of their own (on the running loop); returns it."""
        app = web.Application()
        for path, handler in self.routes():
            app.router.add_route("GET", path, handler)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.metrics_port = runner.addresses[0][1]
        return self.metrics_port

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
