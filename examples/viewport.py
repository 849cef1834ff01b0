"""A viewport subscription with tickwire's client: the last rows of a ticking table, then another window.

    python examples/viewport.py [--url grpc://127.0.0.1:10000] [--table ticking_append] [--rows 5]
                                [--updates 3] [--columns Seq,Sym,Price] [--psk KEY]

The server sends only the rows in the window (here the last `--rows`, counted from the end) and
then only the changes to them. After `--updates` updates the window moves to the table's first
rows on the same stream, and the script prints that window once and ends.
"""
from __future__ import annotations

import argparse

from tickwire import BarrageClient


def show(table) -> None:
    for row in table.to_pylist():
        print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="grpc://127.0.0.1:10000", help="grpc://host:port, grpc+tls://host:port "
                                                                        "or host:port")
    parser.add_argument("--table", default="ticking_append")
    parser.add_argument("--rows", type=int, default=5, help="the window's height")
    parser.add_argument("--updates", type=int, default=3, help="updates to print before moving the window")
    parser.add_argument("--columns", default="Seq,Sym,Price", help="comma-separated columns (empty: all)")
    parser.add_argument("--psk", help="the server's pre-shared key (default: anonymous)")
    args = parser.parse_args(argv)

    columns = [c for c in args.columns.split(",") if c] or None
    window = [(0, args.rows - 1)]
    with BarrageClient(args.url, psk=args.psk) as client:
        vp = client.subscribe(args.table, viewport=window, reverse=True, columns=columns)
        for n, update in enumerate(vp.updates(timeout=10), 1):  # ends if no update comes for 10 s
            kind = "snapshot" if update.is_snapshot else "update"
            print(f"{kind} {n}: the table has {update.table_size} rows; its last {vp.table.num_rows}:")
            show(vp.table)
            if n == args.updates:
                break
        else:
            print(f"no update within 10 s{': ' + str(vp.error) if vp.error else ''}")
            return 1
        vp.set_view(viewport=window, reverse=False)  # the first rows, on the same stream
        first = next((u for u in vp.updates(timeout=10) if u.is_snapshot), None)
        if first is None:
            print("the new window did not arrive within 10 s")
            return 1
        print(f"the first {vp.table.num_rows} rows:")
        show(vp.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
