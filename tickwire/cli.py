"""The `tickwire` command line."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickwire", description="Barrage-compatible Arrow Flight server")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("version", help="print the version")
    demo = sub.add_parser("demo", help="serve the demo tables, fed by a Python ticker and a Spark pipeline (Ctrl-C stops)")
    _server_args(demo, default_port=10000)
    demo.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    demo.add_argument("--no-spark", action="store_true", help="no Spark pipeline: the Python ticker's tables only")
    demo.add_argument("--no-server", action="store_true", help="run the tables without serving them")
    serve = sub.add_parser("serve", help="run a server (tables arrive by DoPut or from Python)")
    _server_args(serve, default_port=10000)
    serve.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    serve.add_argument("--replicate", default=None, metavar="HOST:PORT/TABLE[,...]",
                       help="follow these tables of other Barrage servers (tickwire or Deephaven) as local tables")
    serve.add_argument("--upstream-psk", default=None, help="pre-shared key for the --replicate servers")
    serve.add_argument("--upstream-tls", action="store_true", help="connect to the --replicate servers with TLS")
    return parser


def _server_args(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=default_port, help="port (0 picks a free one)")
    p.add_argument("--interval-ms", type=float, default=100.0, help="update graph cycle interval")
    p.add_argument("--psk", default=None, help="require this pre-shared key (Deephaven PSK authentication)")
    p.add_argument("--tls-cert", default=None, help="PEM certificate: serve TLS")
    p.add_argument("--tls-key", default=None, help="PEM private key for --tls-cert")
    p.add_argument("--max-inbound-message-size", type=int, default=100 * 1024 * 1024, metavar="BYTES",
                   help="largest gRPC message a client may send (a DoPut batch, a request); default 100 MiB, "
                        "as Deephaven's")
    p.add_argument("--web-port", type=int, default=None,
                   help="serve browsers (Deephaven's JS API and grid page) on this port instead of the main one "
                        "(needed with TLS; 0 picks a free one)")
    p.add_argument("--web-assets", default=None, metavar="PATH",
                   help="a deephaven-web jar or directory to serve the browser pages from (default: the installed "
                        "deephaven-server package, `pip install 'tickwire[web]'`)")
    p.add_argument("--no-web", action="store_true", help="no browser side: the port serves gRPC only")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="make append, keyed and ring tables durable in DIR: a restart brings them back "
                        "(default: in memory only)")
    p.add_argument("--fsync", nargs="+", default=["cycle"], metavar="POLICY",
                   help="when journals reach the disk: 'cycle' (before each cycle applies its input; a write "
                        "acknowledged is on disk), 'interval MS', or 'off' (default: cycle)")


def _durability(args):
    """The --fsync policy as a storage.Durability, or an error message."""
    from tickwire.server.storage.store import Durability

    words = args.fsync
    if words == ["cycle"] or words == ["off"]:
        return Durability(fsync=words[0])
    if len(words) == 2 and words[0] == "interval" and words[1].isdigit() and int(words[1]) > 0:
        return Durability(fsync="interval", fsync_interval_ms=int(words[1]))
    raise ValueError(f"--fsync {' '.join(words)}: use 'cycle', 'interval MS' (a positive number) or 'off'")


def _serve(args) -> int:
    import logging
    import signal
    import threading
    import time

    from tickwire.server.app import TickwireServer
    from tickwire.server.demo import connect_help
    from tickwire.server.graph import UpdateGraph

    from tickwire.server.replica import parse_replicate

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        upstreams = parse_replicate(args.replicate) if args.replicate else []
    except ValueError as exc:
        print(f"tickwire: {exc}", file=sys.stderr)
        return 2
    try:
        durability = _durability(args)
    except ValueError as exc:
        print(f"tickwire: {exc}", file=sys.stderr)
        return 2
    graph = UpdateGraph(interval_ms=args.interval_ms)
    server = TickwireServer(graph, host=args.host, port=args.port, psk=args.psk, tls_cert=args.tls_cert,
                            tls_key=args.tls_key, max_inbound_message_size=args.max_inbound_message_size,
                            web=not args.no_web, web_port=args.web_port, web_assets=args.web_assets,
                            data_dir=args.data_dir, durability=durability).start()
    if args.data_dir:
        names = ", ".join(t.name for t in server.recovered) or "none"
        print(f"data directory {args.data_dir}: tables recovered: {names}", flush=True)
    for target, table in upstreams:
        # not waiting: an upstream that is down now is retried in the background
        server.replicate(target, table, psk=args.upstream_psk, tls=args.upstream_tls, wait=False)
        print(f"replicating {target}/{table} as {table!r}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: done.set())
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(connect_help(args.host, server.port, args.psk, server.web_url), flush=True)
    started = time.monotonic()
    try:
        while not done.wait(0.5):
            if args.duration is not None and time.monotonic() - started >= args.duration:
                break
    finally:
        server.stop()
        graph.stop()
    print("tickwire: stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version or args.command == "version":
        from tickwire import __version__

        print(__version__)
        return 0
    if args.command == "demo":
        from tickwire.server.demo import run_demo

        try:
            durability = _durability(args)
        except ValueError as exc:
            print(f"tickwire: {exc}", file=sys.stderr)
            return 2
        return run_demo(interval_ms=args.interval_ms, duration_s=args.duration,
                        port=None if args.no_server else args.port, host=args.host, psk=args.psk,
                        tls_cert=args.tls_cert, tls_key=args.tls_key, spark=not args.no_spark,
                        max_inbound_message_size=args.max_inbound_message_size,
                        web=not args.no_web, web_port=args.web_port, web_assets=args.web_assets,
                        data_dir=args.data_dir, durability=durability,
                        out=lambda line: print(line, flush=True))
    if args.command == "serve":
        return _serve(args)
    parser.print_help(sys.stderr)
    return 2
