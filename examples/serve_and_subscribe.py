"""Serve a ticking table in-process and follow it with tickwire's client for a few seconds.

    python examples/serve_and_subscribe.py [--host 127.0.0.1] [--port 0] [--seconds 3 | --updates N]

A keyed table `prices` (one row per symbol) is created through the engine, a feeder thread
upserts new prices every 200 ms, and a subscription prints one line per update it receives:
first the snapshot, then the rows each cycle modified. `--port 0` (the default) picks a free port.
It follows the table for `--seconds`, or, with `--updates N`, until N updates after the snapshot
came (exit code 1 when they do not within `--timeout` seconds, however slow the machine).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import numpy as np
import pyarrow as pa

from tickwire import BarrageClient, Engine, TableSpec, TickwireServer

SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Seq", pa.int64())])
SYMBOLS = ["AAPL", "AMZN", "MSFT", "NVDA"]


def prices(rng: np.random.Generator, seq: int) -> pa.Table:
    n = len(SYMBOLS)
    return pa.table({"Sym": SYMBOLS, "Price": np.round(100 + rng.normal(0, 5, n), 2),
                     "Seq": np.arange(seq, seq + n, dtype=np.int64)}, schema=SCHEMA)


def feed(engine, table, stop: threading.Event, interval_s: float) -> None:
    rng = np.random.default_rng(1)
    seq = len(SYMBOLS)
    while not stop.wait(interval_s):
        engine.write(table, prices(rng, seq), wait=False)  # queued; the next cycle applies it
        seq += len(SYMBOLS)


def describe(update) -> str:
    if update.is_snapshot:
        return f"snapshot: {update.table_size} rows"
    modified = max((len(v) for v in update.modified.values()), default=0)
    return (f"update {update.last_seq}: {update.added.num_rows} added, {update.removed.num_rows} removed, "
            f"{modified} modified ({', '.join(update.modified_columns)})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0 picks a free one)")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long to follow the table")
    parser.add_argument("--updates", type=int, default=None,
                        help="instead of --seconds: stop after this many updates after the snapshot")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="with --updates: give up after this many seconds")
    args = parser.parse_args(argv)

    engine = Engine(interval_ms=100)
    table, _ = engine.get_or_create(TableSpec("prices", "keyed", SCHEMA, keys=("Sym",)))
    stop = threading.Event()
    with TickwireServer(engine, host=args.host, port=args.port, web=False) as server:  # starts the engine too
        engine.write(table, prices(np.random.default_rng(0), 0))  # returns once a cycle applied it
        print(f"serving 'prices' on {server.target}", flush=True)
        feeder = threading.Thread(target=feed, args=(engine, table, stop, 0.2), daemon=True)
        with BarrageClient(f"grpc://{server.target}") as client:
            sub = client.subscribe("prices")
            feeder.start()
            counting = args.updates is not None
            end = time.monotonic() + (args.timeout if counting else args.seconds)
            got = 0
            # ends if no update comes for 5 s (with --updates: for the whole --timeout)
            for update in sub.updates(timeout=args.timeout if counting else 5):
                print(describe(update), flush=True)
                got += not update.is_snapshot
                if (counting and got >= args.updates) or time.monotonic() >= end:
                    break
            print(f"last state ({sub.size} rows):")
            for row in sub.table.to_pylist():
                print(f"  {row['Sym']:<5} {row['Price']:8.2f}  seq {row['Seq']}")
        stop.set()
        feeder.join()
    engine.stop()
    if counting and got < args.updates:
        print(f"only {got} of {args.updates} updates in {args.timeout:g} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
