"""Follow a ticking table with Deephaven's own Python clients, pydeephaven and pydeephaven-ticking.

    python examples/ticking_listener.py [--host 127.0.0.1] [--port 10000] [--table ticking_append]
                                           [--updates 5] [--psk KEY]

Prints the table's size from a pydeephaven snapshot, then one line per update the ticking
listener receives (its first one holds the whole table), and stops after `--updates` of them.
"""
from __future__ import annotations

import argparse
import queue

from pydeephaven import Session
from pydeephaven_ticking.table_listener import listen

PSK_HANDLER = "io.deephaven.authentication.psk.PskAuthenticationHandler"


def rows(columns: dict) -> int:
    """The number of rows in a pydeephaven-ticking column dict (empty when nothing changed)."""
    return len(next(iter(columns.values()))) if columns else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=10000)
    parser.add_argument("--table", default="ticking_append")
    parser.add_argument("--updates", type=int, default=5, help="stop after this many updates")
    parser.add_argument("--psk", help="the server's pre-shared key (default: anonymous)")
    args = parser.parse_args(argv)

    auth = {"auth_type": PSK_HANDLER, "auth_token": args.psk} if args.psk else {}
    session = Session(host=args.host, port=args.port, **auth)
    try:
        table = session.open_table(args.table)
        print(f"{args.table}: {table.to_arrow().num_rows} rows in a snapshot")
        updates: queue.Queue = queue.Queue()
        handle = listen(table, lambda update: updates.put(update), lambda error: updates.put(error))
        handle.start()  # subscribes; the listener is called on pydeephaven-ticking's own thread
        try:
            for n in range(1, args.updates + 1):
                try:
                    update = updates.get(timeout=10)
                except queue.Empty:
                    print(f"no update within 10 s after {n - 1}")
                    return 1
                if isinstance(update, Exception):
                    raise update
                print(f"update {n}: {rows(update.added())} added, {rows(update.removed())} removed, "
                      f"{rows(update.modified())} modified")
        finally:
            handle.stop()
    finally:
        session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
