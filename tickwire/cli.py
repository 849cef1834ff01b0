"""The `tickwire` command line."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickwire", description="Barrage-compatible Arrow Flight server")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("version", help="print the version")
    demo = sub.add_parser("demo", help="run the demo tables fed by a Python ticker (Ctrl-C stops)")
    demo.add_argument("--interval-ms", type=float, default=100.0, help="update graph cycle interval")
    demo.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    demo.add_argument("--no-spark", action="store_true", help="feed the tables from the Python ticker only")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version or args.command == "version":
        from tickwire import __version__

        print(__version__)
        return 0
    if args.command == "demo":
        from tickwire.server.demo import run_demo

        return run_demo(interval_ms=args.interval_ms, duration_s=args.duration)
    parser.print_help(sys.stderr)
    return 2
