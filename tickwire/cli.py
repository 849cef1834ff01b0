"""The `tickwire` command line.

Options come from flags, `TICKWIRE_*` environment variables and a TOML file (`--config`), in that
order of precedence (tickwire.options). A user's mistake (a bad value, a port in use, a missing
certificate, a bad data directory) ends the command with one line on stderr and exit code 2 (a
bad value) or 1 (the server could not start); `--log-level debug` adds the traceback.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional

from tickwire.options import ConfigError, Settings, add_options, describe_error, probe_ports, render, resolve

log = logging.getLogger("tickwire.cli")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tickwire", description="Barrage-compatible Arrow Flight server")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    sub.add_parser("version", help="print the version")
    demo = sub.add_parser("demo", help="serve the demo tables, fed by a Python ticker and a Spark pipeline (Ctrl-C stops)",
                          description="Serve the demo tables, fed by a Python ticker and a Spark pipeline (Ctrl-C "
                                      "stops). Options: flags > TICKWIRE_* environment > --config file > defaults.")
    add_options(demo, "demo")
    serve = sub.add_parser("serve", help="run a server (tables arrive by DoPut or from Python)",
                           description="Run a server; tables arrive by DoPut, from Python or by --replicate. "
                                       "Options: flags > TICKWIRE_* environment > --config file > defaults.")
    add_options(serve, "serve")
    return parser


def _durability(args):
    """The --fsync policy as a storage.Durability, or an error message."""
    from tickwire.server.engine.storage.store import Durability

    words = list(args.fsync)
    if words == ["cycle"] or words == ["off"]:
        return Durability(fsync=words[0])
    if len(words) == 2 and words[0] == "interval" and words[1].isdigit() and int(words[1]) > 0:
        return Durability(fsync="interval", fsync_interval_ms=int(words[1]))
    raise ValueError(f"--fsync {' '.join(words)}: use 'cycle', 'interval MS' (a positive number) or 'off'")


def _ports(s: Settings) -> dict[str, Optional[int]]:
    return {"--port": s.port, "--web-port": None if s.no_web else s.web_port, "--metrics-port": s.metrics_port}


def _serve(s: Settings) -> int:
    import signal
    import threading
    import time

    from tickwire.server.app import TickwireServer
    from tickwire.server.config import ServerConfig
    from tickwire.server.adapters.demo import connect_help
    from tickwire.server.engine.graph import UpdateGraph
    from tickwire.server.adapters.replica import parse_replicate

    try:
        upstreams = parse_replicate(s.replicate) if s.replicate else []
        durability = _durability(s)
        limit = s.staging_limit_mb << 20  # positive: tickwire.options checks it, and --staging-ttl
        config = ServerConfig(staging_producer_bytes=limit, staging_total_bytes=max(limit, 1 << 30),
                              staging_ttl_s=s.staging_ttl)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    probe_ports(s.host, _ports(s))
    extra = {} if s.metrics_port is None else {"metrics_port": s.metrics_port}
    graph = UpdateGraph(interval_ms=s.interval_ms)
    try:
        server = TickwireServer(graph, host=s.host, port=s.port, psk=s.psk, tls_cert=s.tls_cert,
                                tls_key=s.tls_key, max_inbound_message_size=s.max_inbound_message_size,
                                web=not s.no_web, web_port=s.web_port, web_assets=s.web_assets,
                                data_dir=s.data_dir, durability=durability, config=config,
                                show_system_tables=s.show_system_tables, **extra).start()
    except BaseException:
        graph.stop()
        raise
    done = threading.Event()
    try:
        if s.data_dir:
            names = ", ".join(t.name for t in server.recovered) or "none"
            print(f"data directory {s.data_dir}: tables recovered: {names}", flush=True)
        for target, table in upstreams:
            # not waiting: an upstream that is down now is retried in the background
            server.replicate(target, table, psk=s.upstream_psk, tls=s.upstream_tls, wait=False)
            print(f"replicating {target}/{table} as {table!r}", flush=True)
        signal.signal(signal.SIGINT, lambda *_: done.set())
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        tables = server.ctx.engine.public_names()
        print(connect_help(s.host, server.port, s.psk, server.web_url, tls=server.tls is not None,
                           tables=tables, tls_cert=s.tls_cert), flush=True)
        started = time.monotonic()
        while not done.wait(0.2):
            if s.duration is not None and time.monotonic() - started >= s.duration:
                break
    finally:
        server.stop()
        graph.stop()
    print("tickwire: stopped", flush=True)
    return 0


def _demo(s: Settings) -> int:
    from tickwire.server.adapters.demo import run_demo

    try:
        durability = _durability(s)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if s.web_assets is not None and not s.no_web and not s.no_server:
        from tickwire.server.web.assets import locate_assets
        locate_assets(s.web_assets)  # a bad path fails now, not after Spark has started
    return run_demo(interval_ms=s.interval_ms, duration_s=s.duration,
                    port=None if s.no_server else s.port, host=s.host, psk=s.psk,
                    tls_cert=s.tls_cert, tls_key=s.tls_key, spark=not s.no_spark,
                    max_inbound_message_size=s.max_inbound_message_size,
                    web=not s.no_web, web_port=s.web_port, web_assets=s.web_assets,
                    data_dir=s.data_dir, durability=durability, metrics_port=s.metrics_port,
                    status_interval_s=s.status_interval, show_system_tables=s.show_system_tables,
                    out=lambda line: print(line, flush=True))


def _fail(message: str, code: int, debug: bool) -> int:
    if debug:
        log.debug("startup failed", exc_info=True)
    print(f"tickwire: {message}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # stdout's reader left (`tickwire serve --print-config | head -3`): it has what it wanted.
        # Point stdout at /dev/null so that the interpreter's final flush does not fail again.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version or args.command == "version":
        from tickwire import __version__

        print(__version__)
        return 0
    if args.command not in ("demo", "serve"):
        parser.print_help(sys.stderr)
        return 2
    try:
        settings = resolve(args.command, args)
    except ConfigError as exc:
        return _fail(str(exc), 2, False)
    from tickwire.logs import configure

    configure(settings.log_level, settings.log_format)
    debug = settings.log_level == "debug"
    if settings.print_config:
        print(render(settings), flush=True)
        return 0
    try:
        return _serve(settings) if args.command == "serve" else _demo(settings)
    except ConfigError as exc:
        return _fail(str(exc), 2, debug)
    except KeyboardInterrupt:
        return _fail("interrupted", 130, debug)
    except BrokenPipeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every startup mistake is one line (a traceback with debug)
        return _fail(_startup_message(exc, settings), 1, debug)


def _startup_message(exc: BaseException, s: Settings) -> str:
    """One line for an exception that stopped the server from starting."""
    from tickwire.server.engine.storage import StorageError

    text = describe_error(exc)
    if isinstance(exc, StorageError):
        return text if str(s.data_dir) in text else f"--data-dir {s.data_dir}: {text}"
    if isinstance(exc, ValueError) and s.web_assets is not None and (
            "--web-assets" in text or str(s.web_assets) in text or "asset" in text.lower()):
        return text if "--web-assets" in text else f"--web-assets {s.web_assets}: {text}"
    if s.tls_cert is not None and "Failed to bind" in text:
        return f"cannot listen with --tls-cert {s.tls_cert} / --tls-key {s.tls_key}: {text}"
    return text if isinstance(exc, (OSError, ValueError)) else f"{type(exc).__name__}: {text}"
