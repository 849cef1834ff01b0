"""DoGet throughput of `big_static` (1,000,000 rows x 5 numeric columns): tickwire against a
pyarrow.flight C++ server (`FlightServerBase` answering with a `RecordBatchStream` of the same
table), measured in the same run: tickwire on its default port (shared with the web side, gRPC
reached through the port splitter) and with gRPC alone on its port (`--no-web`), each with DoGets
of the unchanged table sharing one encoding (the default) and with every DoGet encoded (what a
table's first DoGet costs).

Each server runs in its own process; the client is plain `pyarrow.flight` in this process, so
both servers are read by the same C++ client. Runs alternate between the two servers; the
median of the runs is reported, with each server's CPU time per DoGet (user + system, read from
/proc). Prints tickwire's throughput as a ratio to the reference (targets: >= 0.8 through the
shared port, >= 1.0 on gRPC's own).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.flight as fl
from procstat import cpu_seconds

ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])


def serve_tickwire(rows: int, web: bool = True, share: bool = True) -> None:
    from tickwire.server.adapters.demo import big_static
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=100)
    engine.create(TableSpec("big_static", "static", data=big_static(rows)))
    # web=False: gRPC alone on the port, grpcio's own listener (`tickwire serve --no-web`); by
    # default the port is shared with the web side and gRPC is reached through its splitter
    # share=False: every DoGet gathers and encodes (ServerConfig.doget_cache_bytes=0), the cost of
    # a table's first DoGet; by default DoGets of an unchanged table share one encoding
    server = TickwireServer(engine, port=0, web=web, doget_cache_bytes=(256 << 20) if share else 0).start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()
    engine.stop()


def serve_reference(rows: int) -> None:
    from tickwire.server.adapters.demo import big_static

    table = big_static(rows).combine_chunks()

    class Reference(fl.FlightServerBase):
        def do_get(self, context, ticket):
            return fl.RecordBatchStream(table)

    server = Reference("grpc://127.0.0.1:0")
    print(server.port, flush=True)
    sys.stdin.read()
    server.shutdown()


def start(kind: str, rows: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--rows", str(rows)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, port


def one_get(client: fl.FlightClient, ticket: bytes, options) -> tuple[float, pa.Table]:
    t0 = time.perf_counter()
    table = client.do_get(fl.Ticket(ticket), options).read_all()
    return time.perf_counter() - t0, table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", choices=["tickwire", "tickwire-grpc", "tickwire-unshared", "tickwire-grpc-unshared",
                                        "reference"])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="3 runs")
    args = ap.parse_args()
    if args.serve and args.serve.startswith("tickwire"):
        serve_tickwire(args.rows, web="grpc" not in args.serve, share="unshared" not in args.serve)
        return 0
    if args.serve == "reference":
        serve_reference(args.rows)
        return 0
    runs = 3 if args.quick else args.runs

    from tickwire.server.adapters.demo import big_static
    expected = big_static(args.rows)
    kinds = ["tickwire", "tickwire-grpc", "tickwire-unshared", "tickwire-grpc-unshared", "reference"]
    servers = {k: start(k, args.rows) for k in kinds}
    targets = dict.fromkeys(kinds, (b"s/big_static", ANON))
    targets["reference"] = (b"big_static", fl.FlightCallOptions())
    try:
        clients = {k: fl.FlightClient(f"grpc://127.0.0.1:{port}") for k, (_, port) in servers.items()}
        times: dict[str, list[float]] = {k: [] for k in servers}
        cpu: dict[str, list[float]] = {k: [] for k in servers}
        nbytes = expected.nbytes
        for k in servers:  # warm-up, and a check that both serve the same table
            _, got = one_get(clients[k], *targets[k])
            if not got.equals(expected):
                print(f"{k}: DoGet result differs from big_static", file=sys.stderr)
                return 1
        for _ in range(runs):
            for k, (proc, _) in servers.items():
                before = cpu_seconds(proc.pid)
                elapsed, got = one_get(clients[k], *targets[k])
                cpu[k].append(cpu_seconds(proc.pid) - before)
                times[k].append(elapsed)
                assert got.num_rows == args.rows
        med = {k: statistics.median(v) for k, v in times.items()}
        for k in servers:
            print(f"{k:22s}: DoGet {args.rows:,} rows x 5 columns ({nbytes / 1e6:.0f} MB) in {med[k] * 1e3:.1f} ms "
                  f"(median of {runs}); {args.rows / med[k] / 1e6:.1f} M rows/s, {nbytes / med[k] / 1e9:.2f} GB/s; "
                  f"server CPU {statistics.median(cpu[k]) * 1e3:.0f} ms per DoGet")
        for k, what, target in [
                ("tickwire", "the default (shared) port", ">= 0.8"),
                ("tickwire-grpc", "gRPC alone on its port (--no-web)", ">= 1.0"),
                ("tickwire-unshared", "the default port, every DoGet encoded (a table's first)", ""),
                ("tickwire-grpc-unshared", "gRPC alone, every DoGet encoded", "")]:
            print(f"DoGet throughput ratio {k} / pyarrow.flight C++ server, {what}: "
                  f"{med['reference'] / med[k]:.2f}" + (f" (target {target})" if target else ""))
    finally:
        for proc, _ in servers.values():
            proc.stdin.close()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
