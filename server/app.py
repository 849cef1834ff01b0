"""The tickwire server: one grpc.aio server on one port for Flight and Deephaven's services.

The gRPC event loop runs in its own thread; work that takes the update graph's lock or encodes
data runs in a small worker pool so the loop never blocks. `TickwireServer` is usable from
Python (tests, notebooks, the `tickwire serve` and `tickwire demo` commands):

    graph = UpdateGraph(100).start()
    server = TickwireServer(graph, port=10000).start()
    ...
    server.stop()
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from pathlib import Path
from typing import Optional

import grpc

from tickwire.server.barrage import PublisherRegistry
from tickwire.server.config import ServerConfig
from tickwire.server.services import handlers as service_handlers
from tickwire.server.graph import UpdateGraph
from tickwire.server.rpc import ServerContext, build_handlers, with_stubs
from tickwire.server.session import Scope, SessionManager

__all__ = ["TickwireServer"]

log = logging.getLogger(__name__)

GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]


class TickwireServer:
    """Serves the tables of `graph` (every table is a global-scope variable `s/<name>`).

    `port=0` picks a free port (see `.port` after `start`). `psk` requires Deephaven's
    pre-shared-key authentication; otherwise anonymous access is allowed. `tls_cert`/`tls_key`
    (PEM files) switch the port to TLS. `config` holds the tuning knobs (ServerConfig); `workers`,
    `session_duration_ms` and `max_inbound_message_size`, when given, override its fields."""

    def __init__(self, graph: Optional[UpdateGraph] = None, *, host: str = "127.0.0.1", port: int = 10000,
                 psk: Optional[str] = None, tls_cert: Optional[str | Path] = None,
                 tls_key: Optional[str | Path] = None, workers: Optional[int] = None,
                 session_duration_ms: Optional[int] = None, start_graph: bool = True,
                 max_inbound_message_size: Optional[int] = None, config: Optional[ServerConfig] = None):
        overrides = {k: v for k, v in (("workers", workers), ("session_duration_ms", session_duration_ms),
                                       ("max_inbound_message_size", max_inbound_message_size)) if v is not None}
        self.config = dataclasses.replace(config or ServerConfig(), **overrides)
        self.graph = graph if graph is not None else UpdateGraph()
        self.host = host
        self.requested_port = int(port)
        self.port: Optional[int] = None
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        self.tls = None if tls_cert is None else (Path(tls_cert).read_bytes(), Path(tls_key).read_bytes())
        cfg = self.config
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=cfg.workers,
                                                              thread_name_prefix="tickwire-work")
        self.sessions = SessionManager(psk=psk, duration_ms=cfg.session_duration_ms)
        self.registry = PublisherRegistry(config=cfg)
        self.ctx = ServerContext(self.graph, Scope(self.graph), self.sessions, self.registry, self.executor, cfg)
        self.services, self._handlers = service_handlers(self.ctx)  # Flight, Config, Session, Table, Application
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._server: Optional[grpc.aio.Server] = None
        self._stopped = threading.Event()
        self.start_graph = start_graph
        self.replicas: list = []  # Replicators feeding this server's graph

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

    async def _start(self) -> int:
        options = GRPC_OPTIONS + [("grpc.max_receive_message_length", self.config.max_inbound_message_size)]
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers(build_handlers(with_stubs(self._handlers), precheck=self.sessions.authenticate))
        addr = f"{self.host}:{self.requested_port}"
        if self.tls is not None:
            key, cert = self.tls[1], self.tls[0]
            port = server.add_secure_port(addr, grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(addr)
        if port == 0:
            raise OSError(f"cannot listen on {addr}")
        await server.start()
        self._server = server
        return port

    def start(self) -> "TickwireServer":
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="tickwire-grpc", daemon=True)
        self._thread.start()
        ready.wait()
        try:
            self.port = asyncio.run_coroutine_threadsafe(self._start(), loop).result(30)
        except BaseException:
            self.stop()
            raise
        if self.start_graph and not self.graph.running:
            self.graph.start()
        log.info("tickwire serving on %s%s", self.target, " (TLS)" if self.tls else "")
        return self

    def replicate(self, target: str, table: str, *, local_name: Optional[str] = None, psk: Optional[str] = None,
                  tls: bool = False, root_certs: Optional[bytes] = None, wait: bool = True):
        """Follows `table` of the Barrage server at `target` ("host:port": tickwire or Deephaven)
        as the local table `local_name` (default: the same name); see tickwire.server.replica.
        With `wait`, returns once the first snapshot is in. Stopped with the server."""
        from tickwire.server.replica import Replicator

        if self.start_graph and not self.graph.running:
            self.graph.start()
        rep = Replicator(self.graph, target, table, local_name=local_name, psk=psk, tls=tls, root_certs=root_certs)
        self.replicas.append(rep)
        return rep.start(wait=wait)

    def sink(self, table: str, mode: str = "append", **options):
        """A Spark `foreachBatch` function writing each micro-batch into `table`:
        `df.writeStream.foreachBatch(server.sink("trades", mode="append")).start()`. Modes and
        options: see tickwire.server.spark.sink."""
        from tickwire.server.spark import sink

        return sink(self, table, mode, **options)

    def stop(self, grace: float = 1.0) -> None:
        for rep in self.replicas:
            rep.stop()
        self.replicas = []
        loop = self._loop
        if loop is None:
            return
        if self._server is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._server.stop(grace), loop).result(grace + 5)
            except Exception:
                log.debug("server stop", exc_info=True)
            self._server = None
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
