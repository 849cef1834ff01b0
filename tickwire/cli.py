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
from pathlib import Path
from typing import Optional

from tickwire.options import (
    ConfigError,
    Settings,
    add_options,
    describe_error,
    probe_ports,
    render,
    resolve,
    server_config,
)

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
    demo = sub.add_parser("demo",
                          help="serve the demo tables, fed by a Python ticker and a Spark pipeline (Ctrl-C stops)",
                          description="Serve the demo tables, fed by a Python ticker and a Spark pipeline (Ctrl-C "
                                      "stops). Options: flags > TICKWIRE_* environment > --config file > defaults.")
    add_options(demo, "demo")
    serve = sub.add_parser("serve", help="run a server (tables arrive by DoPut or from Python)",
                           description="Run a server; tables arrive by DoPut, from Python or by --replicate. "
                                       "Options: flags > TICKWIRE_* environment > --config file > defaults.")
    add_options(serve, "serve")
    merge = sub.add_parser("merge", help="turn a date's intraday rows of a history table into a historical location",
                           description="Merge the intraday rows of a history table (served with --history and "
                                       "--data-dir) whose partition column holds DATE into a new Parquet location "
                                       "of its dataset, with no server running on the data directory.")
    merge.add_argument("--data-dir", required=True, metavar="DIR", help="the server's data directory")
    merge.add_argument("--table", required=True, metavar="NAME", help="the history table")
    merge.add_argument("--namespace", metavar="NS", help="the table's namespace (the same as --table NS/NAME)")
    merge.add_argument("--date", required=True, metavar="VALUE", help="the partition value (usually a date)")
    merge.add_argument("--history", metavar="URI", help="the dataset (default: the one the data directory recorded)")
    return parser


def _merge(args) -> int:
    from tickwire.server.engine import Engine, EngineConfig
    from tickwire.server.engine.core import history_index_path
    from tickwire.server.engine.storage.parquet import LocationIndex, SystemsLayout

    data_dir = Path(args.data_dir)
    name = f"{args.namespace}/{args.table}" if args.namespace else args.table
    uri = args.history or LocationIndex(str(history_index_path(data_dir, name))).uri()
    layout, root = SystemsLayout.of(data_dir, name)
    if uri is None and not Path(layout.index_path(root)).exists():
        return _fail(f"--data-dir {data_dir}: no history table {name!r} recorded there (give --history URI)",
                     2, False)
    engine = Engine(EngineConfig(data_dir=data_dir))
    try:
        engine.history(name, uri)
        engine.open()
        result = engine.merge(name, args.date)
    except Exception as exc:  # noqa: BLE001 - one line, as the other commands' mistakes
        return _fail(describe_error(exc), 1, False)
    finally:
        engine.stop()
    print(f"merged {result.rows} rows of {name} with {result.value} into {result.path} "
          f"(sha256 {result.checksum[:16]}...)", flush=True)
    return 0


def _ports(config) -> dict[str, Optional[int]]:
    return {"--port": config.port, "--web-port": config.web_port if config.web else None,
            "--metrics-port": config.metrics_port}


def _serve(s: Settings) -> int:
    import dataclasses
    import secrets
    import signal
    import threading

    from tickwire.demo import connect_help
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine
    from tickwire.server.process_gc import freeze_startup

    config = server_config(s)
    if s.values.get("worker_of"):
        return _serve_worker(s, config, str(s.values["worker_of"]))
    nworkers = int(s.values.get("fanout_workers") or 0)
    probe_ports(config.host, _ports(config))
    public = (config.host, config.port)
    if nworkers:
        if config.tls_cert is not None:
            raise ConfigError("--fanout-workers: the workers serve plaintext gRPC; TLS with workers is not supported")
        # this process serves the workers on a loopback port of its own, and browsers on --web-port;
        # the workers name the clients of the calls they forward under a key only they know
        config = dataclasses.replace(config, host="127.0.0.1", port=0,
                                     web=config.web and config.web_port is not None,
                                     forward_key=config.forward_key or secrets.token_hex(16))
    engine = Engine(config.engine)
    try:
        server = TickwireServer(engine, config).start()
    except BaseException:
        engine.stop()
        raise
    workers: list = []
    done = threading.Event()
    clock = engine.clock
    try:
        if nworkers:
            workers, public = start_workers(nworkers, server.target, public,
                                            interval_ms=float(s.values["interval_ms"]), psk=s.values.get("psk"),
                                            forward_key=config.forward_key,
                                            log_level=s.log_level, log_format=s.log_format, gc_young=s.gc_young)
        freeze_startup()  # what startup built lives for the whole run: no full collection walks it again
        if config.engine.data_dir is not None:
            names = ", ".join(t.name for t in server.recovered) or "none"
            print(f"data directory {s.data_dir}: tables recovered: {names}", flush=True)  # as given
        for up in server.upstreams:
            print(f"replicating {up.target}/{up.table} as {up.local!r}", flush=True)
        signal.signal(signal.SIGINT, lambda *_: done.set())
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        tables = server.ctx.scope.names()
        assert server.port is not None  # bound by start()
        host, port = public if nworkers else (config.host, server.port)
        print(connect_help(host, port, config.psk, server.web_url, tls=server.tls is not None,
                           tables=tables, tls_cert=config.tls_cert), flush=True)
        if nworkers:
            print(f"{nworkers} fan-out workers share port {port}; this process serves them on {server.target}",
                  flush=True)
        started = clock.monotonic()
        while not clock.wait(done, 0.2):
            if s.duration is not None and clock.monotonic() - started >= s.duration:
                break
            if any(w.poll() is not None for w in workers):
                print("tickwire: a fan-out worker ended; stopping", file=sys.stderr, flush=True)
                break
    finally:
        stop_workers(workers)
        server.stop()
        engine.stop()
    print("tickwire: stopped", flush=True)
    return 0


WORKER_READY = "tickwire worker: serving"


def start_workers(n: int, upstream: str, public: tuple[str, int], *, interval_ms: float, psk: Optional[str] = None,
                  forward_key: Optional[str] = None, log_level: str = "info", log_format: str = "text",
                  gc_young: int = 20_000
                  ) -> tuple[list, tuple[str, int]]:
    """Starts `n` fan-out worker processes (`tickwire serve --worker-of UPSTREAM`) on the public
    (host, port) (port 0: a free one, the same for all) and waits for each to serve; returns them
    and the (host, port) they share. Their output follows this process's. They end when this
    process does (their stdin closes); `stop_workers` ends them sooner. A worker runs a cycle as
    each upstream update arrives (EngineConfig.cycle_on_write), and every `interval_ms` without."""
    import os
    import socket
    import subprocess
    import threading

    if not public[1]:
        with socket.socket() as sock:
            sock.bind((public[0], 0))
            public = (public[0], int(sock.getsockname()[1]))

    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKWIRE_")}  # only what is passed here
    if psk:
        env["TICKWIRE_UPSTREAM_PSK"] = psk  # the replicas' credentials, not on the command line
    if forward_key:
        env["TICKWIRE_FORWARD_KEY"] = forward_key  # under which they name their callers
    cmd = [sys.executable, "-m", "tickwire", "serve", "--worker-of", upstream, "--host", public[0],
           "--port", str(public[1]), "--interval-ms", str(interval_ms), "--no-web",
           "--log-level", log_level, "--log-format", log_format, "--gc-young", str(gc_young)]
    procs = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True))
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if not line.startswith(WORKER_READY):
                raise OSError(f"a fan-out worker did not start (exit code {p.wait(10)})")
            threading.Thread(target=_follow_output, args=(p.stdout,), daemon=True).start()
    except BaseException:
        stop_workers(procs)
        raise
    return procs, public


def _follow_output(stream) -> None:
    for line in stream:
        print(line, end="", flush=True)


def stop_workers(procs: list) -> None:
    """Ends the worker processes (SIGTERM, then SIGKILL after 15 s)."""
    import subprocess

    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _serve_worker(s: Settings, config, upstream: str) -> int:
    """A fan-out worker (tickwire.server.worker): replicas only, on a port shared with the others;
    ends with SIGTERM or when its stdin closes (the engine process is gone)."""
    import dataclasses
    import signal
    import threading

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, EngineConfig
    from tickwire.server.process_gc import freeze_startup

    if config.engine.data_dir is not None or config.replicate or config.history:
        raise ConfigError("--worker-of: a worker holds replicas only (no --data-dir, --replicate or --history)")
    # each upstream update is applied, and published, as it arrives
    engine = Engine(EngineConfig(interval_ms=config.engine.interval_ms, cycle_on_write=True))
    config = dataclasses.replace(config, worker_of=upstream, reuse_port=True, web=False, metrics_port=None)
    try:
        server = TickwireServer(engine, config).start()
    except BaseException:
        engine.stop()
        raise
    freeze_startup()
    done = threading.Event()

    def parent_gone() -> None:
        sys.stdin.read()
        done.set()
    threading.Thread(target=parent_gone, name="tickwire-worker-parent", daemon=True).start()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        print(f"{WORKER_READY} {config.host}:{server.port} for {upstream}", flush=True)
        done.wait()
    finally:
        server.stop()
        engine.stop()
    return 0


def _demo(s: Settings) -> int:
    from tickwire.demo import run_demo
    from tickwire.server.process_gc import freeze_startup

    config = server_config(s)
    if config.web_assets is not None and config.web and not s.no_server:
        from tickwire.server.web.assets import locate_assets
        locate_assets(config.web_assets)  # a bad path fails now, not after Spark has started
    freeze_startup()  # the modules imported by now live for the whole run
    return run_demo(config, serve=not s.no_server, spark=not s.no_spark, duration_s=s.duration,
                    status_interval_s=s.status_interval, append_rows=s.append_rows,
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
    if args.command == "merge":
        return _merge(args)
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
    from tickwire.server.process_gc import tune_gc
    from tickwire.server.process_memory import MallocTrimmer, limit_malloc_arenas

    limit_malloc_arenas()  # before the server's threads start (see tickwire.server.process_memory)
    tune_gc(settings.gc_young)  # (see tickwire.server.process_gc)
    trimmer = MallocTrimmer().start()
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
    finally:
        trimmer.stop()


def _startup_message(exc: BaseException, s: Settings) -> str:
    """One line for an exception that stopped the server from starting."""
    from tickwire.server.engine.storage.store import StorageError

    text = describe_error(exc)
    if isinstance(exc, StorageError):
        return text if str(s.data_dir) in text else f"--data-dir {s.data_dir}: {text}"
    if isinstance(exc, ValueError) and s.web_assets is not None and (
            "--web-assets" in text or str(s.web_assets) in text or "asset" in text.lower()):
        return text if "--web-assets" in text else f"--web-assets {s.web_assets}: {text}"
    if s.tls_cert is not None and "Failed to bind" in text:
        return f"cannot listen with --tls-cert {s.tls_cert} / --tls-key {s.tls_key}: {text}"
    return text if isinstance(exc, (OSError, ValueError)) else f"{type(exc).__name__}: {text}"
