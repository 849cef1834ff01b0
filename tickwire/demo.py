"""`tickwire demo`: the demo tables (tickwire.server.adapters.demo) fed by a Python ticker and,
unless told otherwise, a Spark pipeline (tickwire.server.adapters.spark.pipeline_demo), served by a
TickwireServer; and the "how to connect" text that `tickwire serve` and `tickwire demo` print
(`connect_help`)."""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable, Optional, Sequence, Union
from urllib.parse import quote

from tickwire.options import mask, probe_ports
from tickwire.server.adapters.demo import publish_demo_tables
from tickwire.server.app import TickwireServer
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine

__all__ = ["run_demo", "connect_help"]

log = logging.getLogger(__name__)


def _pick(tables: list[str], preferred: str) -> str:
    return preferred if preferred in tables else tables[0]


def connect_help(host: str, port: int, psk: Optional[str] = None, web_url: Optional[str] = None,
                 grid_table: Optional[str] = None, *, tls: bool = False, tables: Optional[Sequence[str]] = None,
                 tls_cert: Union[str, os.PathLike[str], None] = None) -> str:
    """How to reach the server's tables with each client: the examples name `tables` (the tables
    served now; none: how to add one), use TLS when `tls` (`tls_cert`: the certificate a client of
    a self-signed server trusts), and show the pre-shared key `psk` masked. `web_url`: the
    server's browser address (None: no browser side)."""
    names = sorted(tables or [])
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    key = mask(psk)
    static = _pick(names, "static_mixed") if names else "<table>"
    keyed = _pick(names, "ticking_keyed") if names else "<table>"
    ticking = _pick(names, "ticking_append") if names else "<table>"
    grid = grid_table if grid_table in names else (keyed if names else None)
    auth = (f"(b'authorization', b'io.deephaven.authentication.psk.PskAuthenticationHandler {key}')" if psk
            else "(b'authorization', b'Anonymous')")
    dh_auth = (f", auth_type='io.deephaven.authentication.psk.PskAuthenticationHandler', auth_token='{key}'"
               if psk else "")
    certs = f"open('{tls_cert}', 'rb').read()" if tls_cert else None
    if tls:
        flight_url = f"grpc+tls://{shown_host}:{port}"
        flight_tls = f", tls_root_certs={certs}" if certs else ""
        dh_tls = ", use_tls=True" + (f", tls_root_certs={certs}" if certs else "")
        tw_tls = ", tls=True" + (f", root_certs={certs}" if certs else "")
    else:
        flight_url, flight_tls, dh_tls, tw_tls = f"grpc://{shown_host}:{port}", "", "", ""
    tw_psk = f", psk='{key}'" if psk else ""
    lines = [f"tickwire is serving on {host}:{port}" + (" with TLS" if tls else "")
             + (f", pre-shared key {key}" if psk else "") + ". Connect with:"]
    if not names:
        lines += ["  (no tables yet: DoPut an Arrow table to ['scope', NAME] with any Flight client, e.g. "
                  "client.do_put(pyarrow.flight.FlightDescriptor.for_path('scope', NAME), schema, opts), "
                  "or from Python with engine.get_or_create(TableSpec(...)))"]
    lines += [
        "  pyarrow.flight:",
        f"    c = pyarrow.flight.FlightClient('{flight_url}'{flight_tls})",
        f"    opts = pyarrow.flight.FlightCallOptions(headers=[{auth}])",
        f"    c.do_get(pyarrow.flight.Ticket(b's/{static}'), opts).read_all()",
        "  pydeephaven:",
        f"    s = pydeephaven.Session(host='{shown_host}', port={port}{dh_auth}{dh_tls})",
        f"    s.open_table('{keyed}').to_arrow()",
        "  pydeephaven-ticking:",
        "    from pydeephaven_ticking.table_listener import listen",
        f"    listen(s.open_table('{ticking}'), lambda update: print(update.added())).start()",
        "  tickwire's client:",
        "    from tickwire.clients.client import BarrageClient",
        f"    sub = BarrageClient('{shown_host}:{port}'{tw_psk}{tw_tls}).subscribe('{keyed}')",
        "    sub.wait_for(lambda s: s.size > 0); print(sub.to_pandas())",
        "  Deephaven's Java client: BarrageSession to "
        f"{shown_host}:{port}{' (TLS)' if tls else ''}, ticket s/<table>",
    ]
    if psk:
        lines.append(f"  (the key is shown masked: {key}; use the one given with --psk)")
    if names:
        lines.append(f"  tables: {', '.join(names)}")
    if web_url is not None:
        lines.append("  a browser" + (" (log in with the pre-shared key)" if psk else "") + ":")
        if grid is not None:
            page = f"{web_url}/iframe/widget/?name={quote(grid, safe='')}"
            lines.append(f"    Deephaven's grid page on a live table: {page}")
        lines.append(f"    every table: {web_url}/tables/")
    return "\n".join(lines)



def _launch_spark(quiet: bool = True) -> None:
    """Starts the demo's SparkSession (its JVM) if Spark can run here; `start_spark_demo` takes it.
    `quiet`: its JVM logs errors only, less the ones of a stopped query's interrupted batch (else
    as Spark's defaults say)."""
    from tickwire.server.adapters.spark.pipeline_demo import spark_available

    if spark_available() is None:
        from tickwire.server.adapters.spark.launch import spark_session

        spark_session("tickwire-demo", quiet=quiet)


def run_demo(config: Optional[ServerConfig] = None, *, serve: bool = True, spark: bool = False,
             duration_s: Optional[float] = None, status_interval_s: Optional[float] = None,
             out: Callable[[str], None] = print, spark_tables_wait_s: float = 60.0,
             append_rows: Optional[int] = None) -> int:
    """Runs the demo tables until Ctrl-C (or `duration_s`) on an engine built from `config.engine`.
    With `serve`, serves them as `config` says (port 0 picks a free one) and prints how to connect
    once the tables exist (the Spark ones included). `status_interval_s`: print the tables' sizes
    that often (default: never). The ports are checked before anything starts: a port in use fails
    at once (OSError), not after Spark's ~30 s start. `append_rows`: the append tables keep their
    last `append_rows` rows (ring tables), for a demo that runs for days in bounded memory."""
    config = config or ServerConfig()
    if serve:
        probe_ports(config.host, {"--port": config.port, "--web-port": config.web_port if config.web else None,
                                  "--metrics-port": config.metrics_port})
    engine = Engine(config.engine)
    if config.engine.data_dir is not None:  # before the tables are made, so that they come back and stay durable
        engine.open()
        out(f"data directory {config.engine.data_dir}: tables recovered: "
            f"{', '.join(t.name for t in engine.recovered) or 'none'}")
    ticker = publish_demo_tables(engine, interval_ms=config.engine.interval_ms, big=serve, append_rows=append_rows)
    server = None
    spark_feed = None
    done = threading.Event()
    clock = engine.clock
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None

    def on_signal(*_):
        done.set()

    if main:
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    spark_quiet = not logging.getLogger().isEnabledFor(logging.DEBUG)  # --log-level debug: Spark's own logging
    try:
        if spark and serve:
            try:
                _launch_spark(spark_quiet)
            except KeyboardInterrupt:  # Ctrl-C while Spark starts (its own handler was in place)
                done.set()
                from tickwire.server.adapters.spark.pipeline_demo import stop_active_spark
                stop_active_spark()
            if main:
                signal.signal(signal.SIGINT, on_signal)  # Spark replaced it with its own
        engine.start()
        ticker.start()
        if serve:
            server = TickwireServer(engine, config).start()
        if spark and not done.is_set():
            from tickwire.server.adapters.spark.pipeline_demo import start_spark_demo, stop_active_spark

            try:
                spark_feed = start_spark_demo(engine, out=out, quiet=spark_quiet, append_rows=append_rows)
            except KeyboardInterrupt:  # Ctrl-C while Spark starts (its own handler was in place)
                done.set()
                stop_active_spark()
            if main:
                signal.signal(signal.SIGINT, on_signal)
        if spark_feed is not None:  # a Spark table exists from its first micro-batch on
            wanted = {s.name for s in spark_feed.sinks.values()}
            until = clock.monotonic() + spark_tables_wait_s
            while not wanted <= set(engine.public_names()) and clock.monotonic() < until \
                    and not clock.wait(done, 0.1):
                pass
        if server is not None and not done.is_set():
            assert server.port is not None  # bound by start()
            out(connect_help(config.host, server.port, config.psk, server.web_url, tls=server.tls is not None,
                             tables=engine.public_names(), tls_cert=config.tls_cert))
        out(f"tickwire demo: tables {', '.join(sorted(engine.public_names()))}; Ctrl-C stops")
        started = clock.monotonic()
        next_status = None if not status_interval_s else started + status_interval_s
        while not clock.wait(done, 0.25):
            if spark_feed is not None and main and signal.getsignal(signal.SIGINT) is not on_signal:
                signal.signal(signal.SIGINT, on_signal)  # Spark may install its own handler again
            now = clock.monotonic()
            if next_status is not None and now >= next_status:
                assert status_interval_s is not None  # next_status is set only with an interval
                next_status = now + status_interval_s
                with engine.reading():
                    sizes = ", ".join(f"{t.name}={t.size}" for t in sorted(engine.tables(), key=lambda t: t.name))
                out(f"step {engine.step}: {sizes}")
                if spark_feed is not None:
                    out(spark_feed.status())
            if duration_s is not None and now - started >= duration_s:
                break
    finally:
        if spark_feed is not None:
            if not logging.getLogger().isEnabledFor(logging.DEBUG):
                logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
            spark_feed.stop()  # the Spark queries end before the server drains
        ticker.stop()
        if server is not None:
            server.stop()
        engine.stop()
        if main:
            signal.signal(signal.SIGINT, previous)
    out("tickwire demo: stopped")
    return 0
