"""What the server holds for sessions' exports and for subscribers that stop reading, each as a
ratio to the size of the data itself (its Arrow size, measured in the same run). These are the
figures the correctness tests used to bound; the tests now check the behaviour behind them
(tests/test_exports_lifecycle.py: released tables leave the engine and nothing keeps them;
tests/test_hostile_requests.py: stalled subscribers hold shared messages and coalesce changes).

1. DoPut exports. A tickwire server (in this process, on a socket) takes --exports uploads of a
   --rows-row table as exports of one session (raw DoPut, tickwire's protocol.opening), then
   releases them. Python's traced memory (tracemalloc: Python objects and the numpy arrays of the
   tables' columns) is read before, while they are held and after Release. Printed: held /
   uploaded (the uploads' Arrow size; at least 0.9: the uploads are held, whatever the engine's
   own layout adds) and left over after Release / one upload (target < 1: the memory comes back).

2. Stalled subscribers. The server serves a keyed table of --big-rows rows; client processes open
   full subscriptions and never read (no BDP probing: HTTP/2's 64 KiB window stalls them). The
   server process's resident size (after a GC and malloc_trim) is read before, with one stalled
   subscriber and with --stalled, the table then ticking. Printed: what each subscriber after the
   first adds / the snapshot's Arrow size (target <= 0.2: they share one snapshot; one copy each
   would be about 1), and what the first costs / the snapshot.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa

from tickwire.protocol.opening import put_batches, put_opening
from tickwire.protocol.proto import config_pb2, session_pb2
from tickwire.protocol.proto.methods import METHODS
from tickwire.protocol.tickets import export_ticket
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests/stalled_clients.py
from tests import stalled_clients  # noqa: E402

ANON = (("authorization", "Anonymous"),)
SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int64())])
BIG = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def unary(ch, path: str, request, metadata):
    m = METHODS[path]
    fn = ch.unary_unary(path, request_serializer=m.request.SerializeToString,
                        response_deserializer=m.response.FromString)
    return fn.with_call(request, metadata=metadata)


def exports(n_exports: int, n_rows: int) -> None:
    rng = np.random.default_rng(1)
    data = pa.table({"Sym": pa.array(np.char.add("K", np.arange(n_rows).astype(str)).astype(object)),
                     "Price": rng.uniform(0, 1, n_rows), "Size": rng.integers(0, 9, n_rows)}, schema=SCHEMA)
    engine = Engine(interval_ms=3_600_000)  # cycles when this runs one
    srv = TickwireServer(engine, port=0, start_engine=False).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            _r, call = unary(ch, "/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants",
                             config_pb2.ConfigurationConstantsRequest(), ANON)
            md = (("authorization", dict(call.initial_metadata())["authorization"]),)
            put = ch.stream_stream("/arrow.flight.protocol.FlightService/DoPut")
            gc.collect()
            tracemalloc.start()
            try:
                tables0, bytes0 = len(engine.tables(hidden=True)), tracemalloc.get_traced_memory()[0]
                for i in range(1, n_exports + 1):
                    list(put(iter(put_opening(["export", str(i)], data.schema) + put_batches(data)), metadata=md))
                engine.run_cycle()  # the uploads' rows enter their tables
                assert len(engine.tables(hidden=True)) == tables0 + n_exports
                gc.collect()
                grown = tracemalloc.get_traced_memory()[0] - bytes0
                for i in range(1, n_exports + 1):
                    req = session_pb2.ReleaseRequest()
                    req.id.ticket = export_ticket(i)
                    unary(ch, "/io.deephaven.proto.backplane.grpc.SessionService/Release", req, md)
                assert len(engine.tables(hidden=True)) == tables0

                def left_over() -> int:
                    gc.collect()
                    return tracemalloc.get_traced_memory()[0] - bytes0

                # a server thread still ending the last call may hold a table a moment longer
                deadline = time.monotonic() + 10
                while left_over() >= data.nbytes and time.monotonic() < deadline:
                    time.sleep(0.1)
                left = left_over()
            finally:
                tracemalloc.stop()
    finally:
        srv.stop()
        engine.stop()
    uploaded = n_exports * data.nbytes
    print(f"{n_exports} DoPut exports x {n_rows:,} rows ({uploaded / 1e6:.1f} MB of Arrow data): "
          f"held {grown / 1e6:.1f} MB, ratio held/uploaded {grown / uploaded:.2f} (>= 0.9); "
          f"after Release {left / 1e6:+.2f} MB, ratio left/one upload {left / data.nbytes:.2f} (target < 1)")


def rss_mb() -> float:
    """The process's resident size once garbage is collected and freed memory handed back to the
    system (pyarrow's pool and malloc's), so what is measured is what is still held."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def stalled_subscribers(n_rows: int, n_stalled: int) -> None:
    k = np.arange(n_rows, dtype=np.int64)
    first = pa.table({"k": k, "v": k * 1.5, "s": pa.array([f"r{x}" for x in k.tolist()])}, schema=BIG)
    snapshot = first.nbytes / 1e6
    engine = Engine(interval_ms=100)
    big = engine.create(TableSpec("big", "keyed", BIG, keys=["k"]))
    engine.write(big, first, wait=False)
    del first
    engine.run_cycle()
    srv = TickwireServer(engine, port=0, session_duration_ms=60_000).start()
    stop = threading.Event()
    procs = []

    def writer() -> None:
        v = 0
        while not stop.wait(0.05):
            v += 1
            start = v * 7 % n_rows
            kk = np.arange(start, start + 10, dtype=np.int64) % n_rows
            engine.write(big, pa.table({"k": kk, "v": kk * 1.5 + v, "s": pa.array([f"r{x}" for x in kk.tolist()])},
                                       schema=BIG), wait=False)

    def stalled(n: int) -> None:
        procs.append(stalled_clients.start(srv.target, n))

    def settle(n: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            subs = srv.registry.subscriptions
            if len(subs) >= n and all(s.messages > 0 and s.pending() > 0 for s in subs):
                break
            time.sleep(0.1)
        time.sleep(2.0)

    try:
        time.sleep(1.0)
        base = rss_mb()
        stalled(1)
        settle(1)
        one = rss_mb() - base
        stalled(n_stalled - 1)
        settle(n_stalled)
        threading.Thread(target=writer, daemon=True).start()
        time.sleep(2.0)
        many = rss_mb() - base
        subs = srv.registry.subscriptions
        shared = len({id(m) for s in subs for m in list(s.outbox)})
        per_extra = (many - one) / (n_stalled - 1)
        print(f"{n_stalled} stalled subscribers of a {n_rows:,}-row table (snapshot {snapshot:.1f} MB): one costs "
              f"{one:.1f} MB (ratio {one / snapshot:.2f}), {n_stalled} cost {many:.1f} MB; each after the first "
              f"{per_extra * 1e3:.0f} KB, ratio per extra/snapshot {per_extra / snapshot:.3f} (target <= 0.2); "
              f"{shared} distinct messages held, {sum(s.coalesced > 0 for s in subs)} subscribers coalescing")
    finally:
        stop.set()
        for p in procs:
            p.kill()
            p.wait()
        srv.stop()
        engine.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="50 exports, 20 stalled subscribers")
    ap.add_argument("--exports", type=int, default=200)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--big-rows", type=int, default=130_000)
    ap.add_argument("--stalled", type=int, default=50)
    args = ap.parse_args()
    if args.quick:
        args.exports, args.stalled = 50, 20
    exports(args.exports, args.rows)
    stalled_subscribers(args.big_rows, args.stalled)


if __name__ == "__main__":
    main()
