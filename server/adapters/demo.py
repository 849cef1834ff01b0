"""The demo tables and the Python ticker that feeds them.

Tables (names kept stable for the server and its clients):
- static_mixed: 1,000 deterministic rows covering the supported types, with nulls;
- ticking_append: an append-only table of trades;
- ticking_keyed: the latest trade per symbol (upserts over 20 keys);
- blink: each cycle's trades only;
- ticking_ring: the last 1,000 trades;
- big_static (when served): 1,000,000 rows x 5 numeric columns.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine import TableSpec, engine_of
from tickwire.server.engine.graph import UpdateGraph

TRADES = pa.schema([("Timestamp", pa.timestamp("ns", "UTC")), ("Sym", pa.string()), ("Price", pa.float64()),
                    ("Size", pa.int32()), ("Seq", pa.int64())])
SYMBOLS = [f"SYM{i:02d}" for i in range(20)]

log = logging.getLogger(__name__)


def static_mixed(n: int = 1000) -> pa.Table:
    """n deterministic rows of every basic type; column k is null where i % P_k == 0 (row 0 is all
    null). The same values as the golden captures' static_mixed table from Deephaven."""
    i = np.arange(n)
    base = np.datetime64("2024-01-01T00:00:00", "ns").astype(np.int64)

    def col(values, t, p):
        return pa.array(values, t, mask=i % p == 0)

    return pa.table({
        "I8": col((i % 100 - 50).astype(np.int8), pa.int8(), 17),
        "I16": col((i * 7 - 3000).astype(np.int16), pa.int16(), 19),
        "I32": col((i * 1000003).astype(np.int32), pa.int32(), 23),
        "I64": col(i.astype(np.int64) * 10000000019, pa.int64(), 29),
        "F32": col((i * 0.125).astype(np.float32), pa.float32(), 31),
        "F64": col(i * 1.25 - 100.0, pa.float64(), 37),
        "Bool": col(i % 2 == 0, pa.bool_(), 13),
        "Str": col(np.array([f"s{x}" for x in i.tolist()], dtype=object), pa.string(), 11),
        "Ts": col(base + i.astype(np.int64) * 1_000_000_000, pa.timestamp("ns", "UTC"), 41),
        "Ch": col((65 + i % 26).astype(np.uint16), pa.uint16(), 43),
    })


class DemoTicker:
    """Feeds the ticking demo tables from a background thread."""

    def __init__(self, graph: UpdateGraph, rows_per_tick: int = 5, interval_s: float = 0.1, seed: int = 7):
        self.graph = graph
        self.rows = rows_per_tick
        self.interval = interval_s
        self.rng = np.random.default_rng(seed)
        self.seq = 0
        self.engine = engine = engine_of(graph)
        engine.get_or_create(TableSpec("static_mixed", "static", data=static_mixed()))
        self.append, _ = engine.get_or_create(TableSpec("ticking_append", "append", TRADES))
        self.keyed, _ = engine.get_or_create(TableSpec("ticking_keyed", "keyed", TRADES, keys=("Sym",)))
        self.blink, _ = engine.get_or_create(TableSpec("blink", "blink", TRADES))
        self.ring, _ = engine.get_or_create(TableSpec("ticking_ring", "ring", TRADES, capacity=1000))
        # the latest trade per symbol, sorted on its (changing) price: a derived table whose rows
        # move, with tight row-key gaps so that moves show up as shifts as well as removes/adds
        from tickwire.server.engine.graph.ops import LastByTable, SortTable
        latest = LastByTable(graph, "__ticking_latest_by_sym", self.append, ["Sym"])
        self.sorted = SortTable(graph, "ticking_sorted", latest, "Price", spacing=2)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def tick(self) -> pa.Table:
        n = self.rows
        now = time.time_ns()
        seq = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        t = pa.table({
            "Timestamp": pa.array(np.full(n, now, dtype=np.int64)).view(pa.timestamp("ns", "UTC")),
            "Sym": pa.array(np.array(SYMBOLS, dtype=object)[self.rng.integers(0, len(SYMBOLS), n)]),
            "Price": pa.array(np.round(100 + self.rng.normal(0, 5, n), 2)),
            "Size": pa.array(self.rng.integers(1, 1000, n).astype(np.int32)),
            "Seq": pa.array(seq),
        }, schema=TRADES)
        with self.engine.writes(wait=False) as writes:  # one cycle applies the tick to every table
            for table in (self.append, self.keyed, self.blink, self.ring):
                writes.write(table, t)
        return t

    def start(self) -> "DemoTicker":
        self._thread = threading.Thread(target=self._run, name="tickwire-demo-ticker", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def big_static(n: int = 1_000_000) -> pa.Table:
    """n deterministic rows x 5 numeric columns (the DoGet throughput table)."""
    i = np.arange(n, dtype=np.int64)
    return pa.table({
        "Id": i,
        "X": i * 0.5,
        "Bucket": (i % 1000).astype(np.int32),
        "Y": np.sin(i.astype(np.float64) / 1000.0),
        "Z": i * 7 % 1_000_003,
    })


def _pick(tables: list[str], preferred: str) -> str:
    return preferred if preferred in tables else tables[0]


def connect_help(host: str, port: int, psk: Optional[str] = None, web_url: Optional[str] = None,
                 grid_table: Optional[str] = None, *, tls: bool = False, tables: Optional[Sequence[str]] = None,
                 tls_cert: Optional[str] = None) -> str:
    """How to reach the server's tables with each client: the examples name `tables` (the tables
    served now; none: how to add one), use TLS when `tls` (`tls_cert`: the certificate a client of
    a self-signed server trusts), and show the pre-shared key `psk` masked. `web_url`: the
    server's browser address (None: no browser side)."""
    from tickwire.options import mask

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
                  "or from Python with tickwire.engine_of(graph).get_or_create(TableSpec(...)))"]
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
            from urllib.parse import quote
            lines.append(f"    Deephaven's grid page on a live table: {web_url}/iframe/widget/?name={quote(grid, safe='')}")
        lines.append(f"    every table: {web_url}/tables/")
    return "\n".join(lines)


def publish_demo_tables(graph: UpdateGraph, *, interval_ms: float = 100.0, big: bool = True) -> DemoTicker:
    """Adds the demo tables (and big_static) to `graph`; returns the (not yet started) ticker."""
    ticker = DemoTicker(graph, interval_s=interval_ms / 1000.0)
    if big:
        engine_of(graph).get_or_create(TableSpec("big_static", "static", data=big_static()))
    return ticker


def _launch_spark() -> None:
    """Starts the demo's SparkSession (its JVM) if Spark can run here; `start_spark_demo` takes it."""
    from tickwire.server.adapters.spark.pipeline_demo import spark_available

    if spark_available() is None:
        from tickwire.server.adapters.spark.launch import spark_session

        spark_session("tickwire-demo")


def run_demo(interval_ms: float = 100.0, duration_s: Optional[float] = None, out=print, *, port: Optional[int] = None,
             host: str = "127.0.0.1", psk: Optional[str] = None, tls_cert=None, tls_key=None,
             spark: bool = False, max_inbound_message_size: Optional[int] = None, web: bool = True,
             web_port: Optional[int] = None, web_assets=None, data_dir=None, durability=None,
             metrics_port: Optional[int] = None, status_interval_s: Optional[float] = None,
             spark_tables_wait_s: float = 60.0, show_system_tables: bool = False) -> int:
    """Runs the demo tables until Ctrl-C (or `duration_s`). With a `port`, serves them over
    Flight/Barrage on it (port 0 picks a free one) and prints how to connect once the tables exist
    (the Spark ones included). `status_interval_s`: print the tables' sizes that often (default:
    never). The ports are checked before anything starts: a port in use fails at once (OSError),
    not after Spark's ~30 s start."""
    if port is not None:
        from tickwire.options import probe_ports
        probe_ports(host, {"--port": port, "--web-port": web_port if web else None, "--metrics-port": metrics_port})
    graph = UpdateGraph(interval_ms=interval_ms)
    if data_dir is not None:  # before the tables are made, so that they come back and stay durable
        recovered = engine_of(graph).open_storage(data_dir, durability)
        out(f"data directory {data_dir}: tables recovered: {', '.join(t.name for t in recovered) or 'none'}")
    ticker = publish_demo_tables(graph, interval_ms=interval_ms, big=port is not None)
    server = None
    spark_feed = None
    done = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def on_signal(*_):
        done.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
    try:
        if spark and port is not None:
            # the JVM is started (a fork) before the gRPC server's threads exist: a fork beside them
            # can lose the child before it runs java (seen as "Java gateway process exited")
            try:
                _launch_spark()
            except KeyboardInterrupt:  # Ctrl-C while Spark starts (its own handler was in place)
                done.set()
                from tickwire.server.adapters.spark.pipeline_demo import stop_active_spark
                stop_active_spark()
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, on_signal)  # Spark replaced it with its own
        graph.start()
        ticker.start()
        if port is not None:
            from tickwire.server.app import TickwireServer
            options = {} if max_inbound_message_size is None else {"max_inbound_message_size": max_inbound_message_size}
            if metrics_port is not None:
                options["metrics_port"] = metrics_port
            server = TickwireServer(graph, host=host, port=port, psk=psk, tls_cert=tls_cert, tls_key=tls_key,
                                    web=web, web_port=web_port, web_assets=web_assets,
                                    show_system_tables=show_system_tables, **options).start()
        if spark and not done.is_set():
            from tickwire.server.adapters.spark.pipeline_demo import start_spark_demo, stop_active_spark

            try:
                spark_feed = start_spark_demo(graph, out=out)
            except KeyboardInterrupt:  # Ctrl-C while Spark starts (its own handler was in place)
                done.set()
                stop_active_spark()
            if threading.current_thread() is threading.main_thread():
                # Spark replaces the SIGINT handler with its own; Ctrl-C must stop the demo cleanly
                signal.signal(signal.SIGINT, on_signal)
        engine = engine_of(graph)
        if spark_feed is not None:  # a Spark table exists from its first micro-batch on
            wanted = {s.name for s in spark_feed.sinks.values()}
            until = time.monotonic() + spark_tables_wait_s
            while not wanted <= set(engine.public_names()) and time.monotonic() < until and not done.wait(0.1):
                pass
        if server is not None and not done.is_set():
            out(connect_help(host, server.port, psk, server.web_url, tls=server.tls is not None,
                             tables=engine.public_names(), tls_cert=tls_cert))
        out(f"tickwire demo: tables {', '.join(sorted(engine.public_names()))}; Ctrl-C stops")
        started = time.monotonic()
        next_status = None if not status_interval_s else started + status_interval_s
        while not done.wait(0.25):
            if spark_feed is not None and threading.current_thread() is threading.main_thread() \
                    and signal.getsignal(signal.SIGINT) is not on_signal:
                signal.signal(signal.SIGINT, on_signal)  # Spark may install its own handler again
            now = time.monotonic()
            if next_status is not None and now >= next_status:
                next_status = now + status_interval_s
                with engine.reading():
                    sizes = ", ".join(f"{t.name}={t.size}" for t in sorted(engine.tables(), key=lambda t: t.name))
                out(f"step {graph.step}: {sizes}")
                if spark_feed is not None:
                    out(spark_feed.status())
            if duration_s is not None and now - started >= duration_s:
                break
    finally:
        if spark_feed is not None:
            if not logging.getLogger().isEnabledFor(logging.DEBUG):
                # a micro-batch cut by the stop is logged by py4j as an ERROR with a long Java stack
                logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)
            spark_feed.stop()  # the Spark queries end before the server drains
        ticker.stop()
        if server is not None:
            server.stop()
        graph.stop()
        engine_of(graph).close_storage()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)
    out("tickwire demo: stopped")
    return 0
