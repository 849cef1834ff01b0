"""List a Barrage server's tables and DoGet one with pyarrow.flight alone (no tickwire code).

    python examples/pyarrow_doget.py [--url grpc://127.0.0.1:10000] [--table static_mixed] [--psk KEY]

Every call carries the `authorization` header (Anonymous, or the pre-shared key); tables are
global-scope variables, read with the ticket `s/<name>`. Works against tickwire and Deephaven.
"""
from __future__ import annotations

import argparse

import pyarrow.flight as flight

PSK_HANDLER = "io.deephaven.authentication.psk.PskAuthenticationHandler"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="grpc://127.0.0.1:10000", help="grpc://host:port or grpc+tls://host:port")
    parser.add_argument("--table", default="static_mixed", help="the table to read")
    parser.add_argument("--psk", help="the server's pre-shared key (default: anonymous)")
    parser.add_argument("--rows", type=int, default=3, help="how many rows to print")
    args = parser.parse_args(argv)

    auth = f"{PSK_HANDLER} {args.psk}" if args.psk else "Anonymous"
    options = flight.FlightCallOptions(headers=[(b"authorization", auth.encode())])
    client = flight.FlightClient(args.url)
    try:
        names = sorted(info.descriptor.path[-1].decode() for info in client.list_flights(options=options))
        print(f"{len(names)} tables: {', '.join(names)}")
        table = client.do_get(flight.Ticket(b"s/" + args.table.encode()), options).read_all()
    finally:
        client.close()
    print(f"{args.table}: {table.num_rows} rows x {table.num_columns} columns")
    shown = table.column_names[:5]
    print("  " + " | ".join(shown))
    for row in table.slice(0, args.rows).select(shown).to_pylist():
        print("  " + " | ".join(str(row[c]) for c in shown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
