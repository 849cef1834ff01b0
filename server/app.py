"""The tickwire server: Flight and Deephaven's services on one port, for gRPC clients and browsers.

One event loop, in its own thread, runs grpcio's aio server and the web side (aiohttp). By
default both share the server's port: a splitter owns it and sends every connection that opens
with the HTTP/2 preface to grpcio (listening on a private loopback port) and everything else to
the web side (tickwire.server.web). `web_port` puts the web side on a port of its own and grpcio
back on the main port, as does TLS (the browser side then needs `web_port`). Work that takes the
update graph's lock or encodes data runs in a small worker pool so the loop never blocks.
`TickwireServer` is usable from Python (tests, notebooks, the `tickwire serve` and `tickwire
demo` commands):

    engine = Engine(interval_ms=100)
    server = TickwireServer(engine, port=10000).start()     # starts the engine too
    ...
    server.stop()
    engine.stop()
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import socket
import ssl
import threading
from typing import Optional, Sequence
from urllib.parse import quote

import grpc

from tickwire.server.adapters.replica import Replicator, parse_replicate
from tickwire.server.adapters.spark.sinks import sink as spark_sink
from tickwire.server.config import ServerConfig, merge_time, seconds_until
from tickwire.server.engine import Engine, EngineConfig
from tickwire.server.observability import Observability
from tickwire.server.services import handlers as service_handlers
from tickwire.server.services.context import ServerContext
from tickwire.server.services.forward import forwarded_peer
from tickwire.server.services.rpc import build_handlers, guarded_methods, with_stubs
from tickwire.server.web import PortSplitter, WebSide
from tickwire.server.web.assets import locate_assets
from tickwire.server.web.https import HttpsFront
from tickwire.server.worker import DO_EXCHANGE, WorkerRouter

__all__ = ["TickwireServer"]

log = logging.getLogger(__name__)

GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    # calls that arrive before the server's loop has asked grpcio for them wait in grpcio's queue,
    # which by default refuses calls at random past 1,000 waiting (all past 3,000): a thousand
    # subscribers connecting at once lost one to three calls (their clients saw CANCELLED, or
    # INTERNAL from a failed send) that the server never saw. Room for a burst of 16,384; a call
    # waits there at most 30 s (grpcio's server_max_unrequested_time_in_server) all the same.
    ("grpc.server.max_pending_requests", 16384),
    ("grpc.server.max_pending_requests_hard_limit", 32768),
]


def prefer_memory_pool() -> str:
    """Makes jemalloc Arrow's default memory pool for this process, unless the user chose one with
    ARROW_DEFAULT_MEMORY_POOL (or this pyarrow has no jemalloc); returns the pool's name.

    Why: the server allocates and frees buffers of megabytes all the time (a Parquet row group
    read for a viewport, a snapshot's columns, encoded messages). Measured by bench_history.py on
    this project's machines, with pyarrow's default here (mimalloc) a cold 60-row viewport of a
    history took up to 69 ms and a DoGet of one date ran at 9.2 M rows/s; with jemalloc 33 ms and
    11.0 M rows/s (fresh pages are faulted in less often: jemalloc reuses them)."""
    import os

    import pyarrow as pa

    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool().backend_name
    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool().backend_name
    pa.set_memory_pool(pool)
    return pool.backend_name


class TickwireServer:
    """Serves the tables of `engine` (every table is a global-scope variable `s/<name>`).

    `config` is a ServerConfig, or its fields are given as keywords
    (`TickwireServer(engine, port=0, psk="k")`; a keyword wins over the same field of `config`).
    Without an `engine` (or with `engine=EngineConfig(...)`, the ServerConfig field) the server
    builds one from `config.engine` and stops it with itself; a
    given engine is the caller's (started by `start` when `start_engine` and not yet running,
    never stopped here).

    `port=0` picks a free port (see `.port` after `start`). `psk` requires Deephaven's
    pre-shared-key authentication; otherwise anonymous access is allowed. `tls_cert`/`tls_key`
    (PEM files) switch the port to TLS.

    The web side (browsers: Deephaven's JS API and grid page) is on the same port unless `web` is
    False or `web_port` is given (0 picks a free one, see `.web_port`); with TLS it needs
    `web_port`. `web_assets`: a deephaven-web jar or directory to serve instead of the installed
    deephaven-server package's.

    A data directory (`EngineConfig.data_dir`) makes the engine's append, keyed and ring tables
    durable: `start` first brings back every table the directory holds (`engine.open()`).

    Health and metrics (tickwire.server.observability): the standard gRPC health service
    (grpc.health.v1, no credentials needed) answers NOT_SERVING until the engine's first cycle,
    SERVING after and NOT_SERVING from the start of `stop`, with `tickwire.table/<name>` per table;
    the web side serves `/healthz` and `/metrics` (Prometheus); `metrics_port` (0 picks a free one,
    see `.metrics_port`) serves both on a port of their own, for servers without a web side.

    Performance tables (tickwire.server.engine.perf_tables): `start` makes the engine's system
    tables `tickwire.update_performance`, `tickwire.barrage_performance` and
    `tickwire.snapshot_performance` (unless the engine's config has `perf_tables=None`), which any
    client can DoGet or subscribe to by name; they are listed (ListFlights, ListFields,
    list-tables, the browser's table list) only with `show_system_tables`.

    `replicate` ("HOST:PORT/TABLE[=LOCAL]", ...) follows tables of other Barrage servers once started."""

    def __init__(self, engine: Optional[Engine] = None, config: Optional[ServerConfig] = None, *,
                 start_engine: bool = True, **options):
        if isinstance(engine, EngineConfig):  # engine=EngineConfig(...): the ServerConfig field of that name
            options["engine"], engine = engine, None
        if engine is not None and not isinstance(engine, Engine):
            raise TypeError(f"TickwireServer takes an Engine, got {type(engine).__name__}")
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(ServerConfig)})
        if unknown:
            raise TypeError(f"TickwireServer got unknown option(s) {', '.join(unknown)}; its options are the "
                            f"fields of ServerConfig")
        self.config = cfg = dataclasses.replace(config or ServerConfig(), **options)
        self.owns_engine = engine is None
        self.engine = engine if engine is not None else Engine(cfg.engine)
        self.host = cfg.host
        self.requested_port = int(cfg.port)
        self.port: Optional[int] = None
        self.tls = None
        if cfg.tls_cert is not None:
            assert cfg.tls_key is not None  # ServerConfig takes both or neither
            self.tls = (cfg.tls_cert.read_bytes(), cfg.tls_key.read_bytes())
        self.ctx = ServerContext(self.engine, cfg)
        self.executor = self.ctx.executor
        self.sessions = self.ctx.sessions
        self.registry = self.ctx.registry
        self.services, self._handlers = service_handlers(self.ctx)  # Flight, Config, Session, Table, Application
        flight = next((s for s in self.services if hasattr(s, "counters")), None)
        self.observability = Observability(self, flight.counters if flight is not None else None)
        self.perf = self.engine.perf
        self.requested_metrics_port = cfg.metrics_port
        self.metrics_port: Optional[int] = None  # where /metrics and /healthz are served on their own port
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[grpc.aio.Server] = None
        self._stopped = threading.Event()
        self.start_engine = start_engine
        self.replicas: list[Replicator] = []  # Replicators feeding this server's engine
        self.upstreams = parse_replicate(",".join(cfg.replicate)) if cfg.replicate else []
        self.recovered: list = []  # tables brought back from the data directory at start
        self._refresh_stop = threading.Event()  # ends the history refresher and the daily merge
        self.daily_merges = 0  # daily merges run (each may merge nothing)
        self._refresher: Optional[threading.Thread] = None
        self.web_enabled = bool(cfg.web) and not cfg.worker_of  # a worker serves gRPC only
        self.router: Optional[WorkerRouter] = None  # a fan-out worker's (ServerConfig.worker_of)
        self.requested_web_port = cfg.web_port
        self.web_port: Optional[int] = None  # where browsers connect (the main port when shared)
        self.web: Optional[WebSide] = None  # the web side once started
        self.splitter: Optional[PortSplitter] = None
        self.https: Optional[HttpsFront] = None  # the web port with TLS (HTTP/2 and HTTP/1.1)
        self.web_assets = None
        if self.web_enabled:
            self.web_assets = locate_assets(cfg.web_assets)  # a bad path fails here, before anything starts

    def memory_by_holder(self) -> dict[str, int]:
        """Bytes held by each table ("table:NAME"), each table's publisher ("publisher:NAME"), the
        sessions with their exports, the web side and the shared port's splitter: where a long run's memory grows (the
        memory trace writes it each line). A diagnosis aid, see engine/footprint.py."""
        def stop(o: object) -> bool:
            return isinstance(o, (asyncio.AbstractEventLoop, TickwireServer, grpc.aio.Server))

        out = {f"table:{k}": v for k, v in self.engine.memory_by_table().items()}
        out.update({f"publisher:{k}": v for k, v in self.registry.memory_by_table().items()})
        for name, root in (("sessions", self.sessions), ("web", self.web), ("splitter", self.splitter)):
            if root is None:
                continue
            out[name] = self.engine.held_bytes(root, stop)
        return out

    def _real_peer(self, peer: str, metadata: Sequence[tuple[str, object]]) -> str:
        """The client's own address for a peer grpcio reports: the one a fan-out worker names
        under the shared `forward_key`, else through the splitter's loopback hop."""
        forwarded = forwarded_peer(metadata, self.config.forward_key)
        if forwarded is not None:
            return forwarded
        splitter = self.splitter
        return peer if splitter is None else splitter.real_peer(peer)

    @property
    def target(self) -> str:
        """host:port for clients."""
        return f"{self.host}:{self.port}"

    @property
    def method_paths(self) -> set[str]:
        """Every method path the server answers (each checks credentials first): the served ones
        and an UNIMPLEMENTED stub for every other method of the services in `proto/`."""
        return set(with_stubs(self._handlers))

    @property
    def uses_tls(self) -> bool:
        return self.tls is not None

    def _listener(self) -> socket.socket:
        """The main port's listening socket, for the splitter."""
        err: Optional[OSError] = None
        for family, kind, proto, _name, addr in socket.getaddrinfo(self.host, self.requested_port,
                                                                   type=socket.SOCK_STREAM,
                                                                   flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(addr)
                sock.listen(1024)
                return sock
            except OSError as exc:
                sock.close()
                err = exc
        raise OSError(f"cannot listen on {self.host}:{self.requested_port}: {err}")

    async def _start(self) -> int:
        options = GRPC_OPTIONS + [("grpc.max_receive_message_length", self.config.max_inbound_message_size)]
        if self.config.reuse_port:  # one of several processes on the port (an engine process's workers)
            options = [o for o in options if o[0] != "grpc.so_reuseport"] + [("grpc.so_reuseport", 1)]
        server = grpc.aio.server(options=options)
        impls = with_stubs(self._handlers)
        observability = self.observability
        if self.config.worker_of:
            # a fan-out worker: its router serves scope subscriptions itself and forwards the rest
            # (health included: the engine process's)
            local = guarded_methods(impls, on_error=observability.errors)[DO_EXCHANGE]
            self.router = WorkerRouter(self, self.config.worker_of, local, psk=self.config.upstream_psk,
                                       forwarded_key=self.config.forward_key)
            server.add_generic_rpc_handlers([self.router])
        else:
            server.add_generic_rpc_handlers(build_handlers(impls, precheck=self.sessions.authenticate,
                                                           peer_resolver=self._real_peer,
                                                           on_error=observability.errors))
            await observability.health.add_to_server(server)  # grpc.health.v1, answered without credentials
        addr = f"{self.host}:{self.requested_port}"
        web_on_main = self.web_enabled and self.requested_web_port is None and self.tls is None
        if self.web_enabled:
            self.web = WebSide(self.ctx, self.web_assets)
            self.web.methods = guarded_methods(impls, precheck=self.web.precheck, on_error=observability.errors)
            self.web.observability = observability  # /healthz and /metrics
            await self.web.start()
        listener = None
        if web_on_main:
            listener = self._listener()
            # grpcio behind the splitter listens on a private loopback port: splice(2) moves TCP
            # bytes without copying them, and grpcio writes to TCP inline from its poller (to a
            # Unix socket it hands the writes to other threads): a bulk DoGet ran at 0.6x of the
            # direct port through a Unix socket (bench/bench_web.py)
            grpc_port = server.add_insecure_port("127.0.0.1:0")
            if grpc_port == 0:
                listener.close()
                raise OSError("cannot listen on a private loopback port for grpcio")
            upstream = ("127.0.0.1", grpc_port)
            port = listener.getsockname()[1]
        elif self.tls is not None:
            key, cert = self.tls[1], self.tls[0]
            port = server.add_secure_port(addr, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(addr)
        if port == 0:
            raise OSError(f"cannot listen on {addr}")
        await server.start()
        self._server = server
        if self.requested_metrics_port is not None:
            self.metrics_port = await observability.listen(self.host, self.requested_metrics_port)
        if web_on_main:
            assert listener is not None and self.web is not None  # both made above when the web shares the port
            self.splitter = PortSplitter(listener, upstream, self.web.protocol_factory)
            self.splitter.start()
            self.web_port = port
        elif self.web is not None and self.requested_web_port is not None:
            if self.tls is not None:
                # https: HTTP/2 for the JS API's grpc-web calls, HTTP/1.1 for the rest (tickwire.server.web.https)
                ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                ssl_context.load_cert_chain(str(self.config.tls_cert), str(self.config.tls_key))
                relay = await self.web.listen("127.0.0.1", 0)
                self.https = HttpsFront(self.web.methods, self.web.protocol_factory, relay,
                                        max_message_size=self.config.max_inbound_message_size)
                self.web_port = await self.https.listen(self.host, self.requested_web_port, ssl_context)
            else:
                self.web_port = await self.web.listen(self.host, self.requested_web_port)
        elif self.web is not None:
            log.info("the web side needs --web-port with TLS; browsers cannot connect")
            await self.web.close()
            self.web = None
        return port

    @property
    def web_url(self) -> Optional[str]:
        """Where a browser connects (None without a web side)."""
        if self.web_port is None:
            return None
        scheme = "https" if self.tls is not None and self.requested_web_port is not None else "http"
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return f"{scheme}://{host}:{self.web_port}"

    def grid_url(self, table: str) -> Optional[str]:
        """The URL of Deephaven's grid page on `table` (None without a web side)."""
        base = self.web_url
        return None if base is None else f"{base}/iframe/widget/?name={quote(table, safe='')}"

    def start(self) -> "TickwireServer":
        if self._thread is not None:
            return self
        prefer_memory_pool()
        from .observability.memtrace import start_from_environment

        start_from_environment(self.memory_by_holder)
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()
            loop.close()

        try:
            engine = self.engine
            for name, uri in self.config.history:
                # before the data directory opens: its intraday rows come back into the history table
                # (a NAME alone: its own locations, Systems/<namespace>/ in the data directory)
                engine.history(name, uri or None)
            if engine.storage is None and engine.config.data_dir is not None:
                # before anything is served: a client never sees a table that is still coming back
                engine.open()
                self.recovered = list(engine.recovered)
                errors: dict[str, str] = engine.storage.errors if engine.storage is not None else {}
                log.info("data directory %s: %d table(s) recovered%s", engine.config.data_dir, len(self.recovered),
                         "".join(f"; {n!r} NOT recovered: {e}" for n, e in errors.items()))
            if self.perf is not None:  # the performance tables exist before anything is served
                self.perf.attach(self.registry)
        except BaseException:
            self._loop = None
            loop.close()  # never ran: nothing to stop
            raise
        self._thread = threading.Thread(target=run, name="tickwire-grpc", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), loop).result(30)
        except BaseException:
            self.stop()
            raise
        self.observability.attach()  # before the engine starts: its first cycle turns the health SERVING
        if (self.start_engine or self.owns_engine) and not self.engine.running:
            self.engine.start()
        if self.config.merge_at is not None:
            self._merger = threading.Thread(target=self._daily_merge, name="tickwire-daily-merge", daemon=True)
            self._merger.start()
        if self.config.history and self.config.history_refresh_s:
            self._refresher = threading.Thread(target=self._refresh_history, name="tickwire-history-refresh",
                                               daemon=True)
            self._refresher.start()
        for up in self.upstreams:
            # not waiting: an upstream that is down now is retried in the background
            self.replicate(up.target, up.table, local_name=up.local, psk=self.config.upstream_psk,
                           tls=self.config.upstream_tls, wait=False)
        log.info("tickwire serving on %s%s%s", self.target, " (TLS)" if self.tls else "",
                 f"; browsers at {self.web_url}" if self.web_url else "")
        return self

    def replicate(self, target: str, table: str, *, local_name: Optional[str] = None, psk: Optional[str] = None,
                  tls: bool = False, root_certs: Optional[bytes] = None, wait: bool = True):
        """Follows `table` of the Barrage server at `target` ("host:port": tickwire or Deephaven)
        as the local table `local_name` (default: the same name); see tickwire.server.adapters.replica.
        With `wait`, returns once the first snapshot is in. Stopped with the server."""
        if (self.start_engine or self.owns_engine) and not self.engine.running:
            self.engine.start()
        rep = Replicator(self.engine, target, table, local_name=local_name, psk=psk, tls=tls, root_certs=root_certs)
        rep.start(wait=False)  # refused here when another replica is served under the same name
        self.replicas.append(rep)
        return rep.wait_ready() if wait else rep

    def sink(self, table: str, mode: str = "append", **options):
        """A Spark `foreachBatch` function writing each micro-batch into `table`:
        `df.writeStream.foreachBatch(server.sink("trades", mode="append")).start()`. Modes and
        options: see tickwire.server.adapters.spark.sink."""
        return spark_sink(self.engine, table, mode, **options)

    def _daily_merge(self) -> None:
        """Each day at merge_at (UTC, on the engine's clock): every history table's intraday dates
        before the day's become locations (Engine.merge_before)."""
        hour, minute = merge_time(str(self.config.merge_at))
        clock = self.engine.clock
        while not clock.wait(self._refresh_stop, seconds_until(clock.now(), hour, minute)):
            today = datetime.datetime.fromtimestamp(clock.now(), datetime.timezone.utc).date().isoformat()
            try:
                results = self.engine.merge_before(today)
            except Exception:  # noqa: BLE001 - logged; tomorrow's merge tries again
                log.exception("the daily merge failed")
                continue
            for r in results:
                log.info("daily merge: %d rows of %r with %s into %s", r.rows, r.table, r.value, r.path)
            self.daily_merges += 1

    def _refresh_history(self) -> None:
        """Every history_refresh_s: the --history datasets' new files become locations."""
        interval = float(self.config.history_refresh_s or 0)
        while not self.engine.clock.wait(self._refresh_stop, interval):
            for name, _uri in self.config.history:
                if self.engine.resolve(name) is None:
                    continue  # an own-location history table its first write has not made yet
                try:
                    added = self.engine.refresh_history(name)
                except Exception as exc:  # noqa: BLE001 - logged; the next look tries again
                    log.warning("history table %r: looking for new files failed: %s", name, exc)
                    continue
                if added:
                    log.info("history table %r: %d new location(s): %s", name, len(added), ", ".join(added))

    def stop(self, grace: float = 1.0) -> None:
        self._refresh_stop.set()
        if self._refresher is not None:
            self._refresher.join(10)
            self._refresher = None
        self.observability.health.shutdown_from_thread()  # NOT_SERVING first, while everything still runs
        for rep in self.replicas:
            rep.stop()
        self.replicas = []
        if self.router is not None:
            self.router.stop_replicas()
        loop = self._loop
        if loop is None:
            return
        # sessions first: a held TerminationNotification answers "the server stops" while its
        # transport still carries it (the loop gets a moment to send those answers)
        self.sessions.stop()
        try:
            asyncio.run_coroutine_threadsafe(asyncio.sleep(0.1), loop).result(5)
        except Exception:
            log.debug("waiting for session listeners", exc_info=True)
        if self.https is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.https.close(), loop).result(grace + 5)
            except Exception:
                log.debug("https front stop", exc_info=True)
            self.https = None
        if self.web is not None:  # go-away to every browser first, while the loop still runs
            try:
                asyncio.run_coroutine_threadsafe(self.web.close(), loop).result(grace + 5)
            except Exception:
                log.debug("web side stop", exc_info=True)
            self.web = None
        if self.splitter is not None:  # no new connection reaches a grpcio that is stopping
            try:
                asyncio.run_coroutine_threadsafe(self.splitter.stop_accepting(), loop).result(5)
            except Exception:
                log.debug("splitter stop", exc_info=True)
        if self._server is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._server.stop(grace), loop).result(grace + 5)
            except Exception:
                log.debug("server stop", exc_info=True)
            self._server = None
        if self.router is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.router.close(), loop).result(5)
            except Exception:
                log.debug("worker router stop", exc_info=True)
        if self.splitter is not None:
            try:
                asyncio.run_coroutine_threadsafe(self.splitter.close(), loop).result(5)
            except Exception:
                log.debug("splitter stop", exc_info=True)
            self.splitter = None
        self.observability.detach()
        if self.perf is not None:
            self.perf.detach(self.registry)
        try:
            asyncio.run_coroutine_threadsafe(self.observability.close(), loop).result(5)
        except Exception:
            log.debug("metrics port stop", exc_info=True)
        if self.owns_engine:
            self.engine.stop()
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self._thread = None
        self._loop = None
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.sessions.stop()
        self._stopped.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until `stop` (or the timeout); True when stopped."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> "TickwireServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
