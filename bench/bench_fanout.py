"""Fan-out: many Barrage subscribers to one ticking table.

A tickwire server (its own process) serves `fanout`, a keyed table of --keys rows whose engine
cycles every 100 ms; a producer thread upserts --rows-per-tick random keys about every 100 ms (on
deadlines a little over a cycle apart, so that the writes meet every phase of the cycle), stamping
each row's `Ts` column with the wall-clock time of the change. Client processes hold --full full
subscriptions and --viewport viewport subscriptions (each a window of --window rows at one of
--pages page offsets, the way many grid users look at a few pages of one table), all over
grpc.aio DoExchange; each decodes only what the latency needs, to leave the machine's CPU to the
server.

Latency of a message = its arrival time at the client minus the newest `Ts` among the rows it
adds or modifies (change -> client, including the cycle wait). Reported: p50/p99 per kind,
messages/s received, server CPU (user + system, % of one core) and client CPU, over --seconds
after a warm-up. The reference printed beside it is the same latency with a single full
subscriber, measured in the same run.

With --fanout-workers N the subscribers are served by N worker processes on one port, as
`tickwire serve --fanout-workers N` sets them up (tickwire.server.worker), and the server CPU is
that of the engine process and every worker; the kernel spreads client connections over the
workers, so --per-connection (subscribers per connection) decides how evenly.

The server process sets Python's garbage collector as `tickwire serve` does
(tickwire.server.process_gc); so do the client processes, each of which stands in for hundreds of
clients. With Python's defaults the server's full collections (every 1.5 s, 75-135 ms each)
delayed every subscriber's message of one cycle in 15, which was the whole of the p99.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
from machine_stalls import StallProbe
from procstat import cpu_seconds

TABLE = "fanout"


# -- the server process ----------------------------------------------------------------------------
def producer_period(interval_ms: float, seconds: float) -> float:
    """Seconds between the producer's writes: a little over the cycle, so that over the measured
    `seconds` the writes meet every phase of the cycle once and the cycle wait in each latency is
    spread evenly from 0 to one cycle. With a period of one cycle a run keeps the phase it
    started with, and its percentiles measure that phase: at a 100 ms cycle the same server gave
    a p50 of 47 or 75 ms with its startup 25 ms longer (bench_vs_deephaven)."""
    interval = interval_ms / 1000.0
    return interval + interval * interval / max(seconds, interval)


def deadlines(period_s: float, stop: threading.Event):
    """Yields at deadlines `period_s` apart (a late write does not push the next ones back),
    until `stop` is set."""
    due = time.monotonic()
    while True:
        due += period_s
        if stop.wait(max(0.0, due - time.monotonic())):
            return
        yield


def serve(keys: int, rows_per_tick: int, interval_ms: float, log_path: str = "", period_s: float = 0.0,
          fanout_workers: int = 0) -> None:
    import logging

    import pyarrow as pa

    from tickwire.cli import start_workers, stop_workers
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec
    from tickwire.server.process_gc import freeze_startup, tune_gc

    if log_path:  # each subscription's start and end (with how it ended), to tell who ended a call
        logging.basicConfig(filename=log_path, level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
    schema = pa.schema([("Key", pa.int64()), ("Value", pa.float64()), ("Ts", pa.int64())])
    tune_gc()  # the collector as `tickwire serve` sets it (tickwire.server.process_gc)
    engine = Engine(interval_ms=interval_ms)
    table = engine.create(TableSpec(TABLE, "keyed", schema, keys=("Key",)))
    rng = np.random.default_rng(1)
    engine.write(table, pa.table({"Key": np.arange(keys, dtype=np.int64), "Value": rng.random(keys),
                                  "Ts": np.full(keys, time.time_ns(), dtype=np.int64)}, schema=schema), wait=False)
    # with workers (as `tickwire serve --fanout-workers N`) this process serves them only, gRPC alone
    server = TickwireServer(engine, port=0, workers=4, web=not fanout_workers).start()
    procs, port = [], server.port
    if fanout_workers:
        procs, (_host, port) = start_workers(fanout_workers, server.target, ("127.0.0.1", 0),
                                             interval_ms=interval_ms, log_level="warning")
    freeze_startup()  # as `tickwire serve` does once its server has started
    stop = threading.Event()

    def produce():
        for _ in deadlines(period_s or interval_ms / 1000.0, stop):
            k = rng.choice(keys, rows_per_tick, replace=False).astype(np.int64)
            # queued, not waited for: the producer keeps its own pace (one write per cycle)
            engine.write(table, pa.table({"Key": k, "Value": rng.random(rows_per_tick),
                                          "Ts": np.full(rows_per_tick, time.time_ns(), dtype=np.int64)},
                                         schema=schema), wait=False)

    threading.Thread(target=produce, daemon=True).start()
    print(json.dumps({"port": port, "pids": [os.getpid()] + [p.pid for p in procs]}), flush=True)
    sys.stdin.read()
    stop.set()
    stop_workers(procs)
    server.stop()
    engine.stop()


# -- a client process --------------------------------------------------------------------------------
TS_BUFFER = 5  # Key, Value, Ts: (validity, data) buffers each; Ts's data buffer is the sixth


async def _subscribe(channel, viewport, stats, kind, state, ready):
    """One subscriber over grpc.aio DoExchange. It reads every FlightData; of each record batch it
    decodes only the header and the `Ts` buffer (pyarrow.flight's reader cannot be used: it
    rejects Barrage batches, whose unsent columns are shorter than the batch)."""
    from tickwire.protocol import barrage
    from tickwire.protocol.batches import HEADER_RECORD_BATCH, read_message_header
    from tickwire.protocol.flight import (
        FlightDescriptor,
        decode_flight_data,
        encode_flight_data,
    )

    vp = None if viewport is None else np.array([viewport], dtype=np.int64)
    req = barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/" + TABLE.encode(), viewport=vp,
                                                   options=barrage.SubscriptionOptions()))
    msgs = [encode_flight_data(b"", None, descriptor=FlightDescriptor.for_command(b"dphn")),
            encode_flight_data(b"", req)]
    done = asyncio.Event()

    async def requests():
        for m in msgs:
            yield m
        await done.wait()

    call = channel.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")(
        requests(), metadata=(("authorization", "Anonymous"),))
    out = stats[kind]
    snapshot = True
    try:
        async for raw in call:
            now = time.time_ns()
            fd = decode_flight_data(raw)
            if not fd.data_header:
                continue
            info = read_message_header(fd.data_header)
            if info.header_type != HEADER_RECORD_BATCH:
                continue
            if snapshot:  # the first batch is the initial snapshot
                snapshot = False
                ready()
                continue
            off, length = (int(x) for x in info.buffers[TS_BUFFER])
            if length and now >= state["started"]:
                newest = int(np.frombuffer(fd.data_body, dtype="<i8", count=length // 8, offset=off).max())
                out.append((now - newest) / 1e6)
            if state["stop"]:
                break
    except Exception as exc:
        if snapshot:  # which subscriber, and the status its call ended with
            print(f"client: a {kind} subscriber failed before its snapshot: {exc!r} "
                  f"call status {await call.code()} {await call.details()!r} "
                  f"trailing {await call.trailing_metadata()!r}", file=sys.stderr, flush=True)
        raise
    finally:
        done.set()
        call.cancel()


def client(port: int, full: int, viewports: list, warmup: float, seconds: float, per_connection: int = 100) -> None:
    import grpc

    from tickwire.server.process_gc import tune_gc

    # hundreds of subscribers share this process, where each would have one of its own: its
    # collections (up to 60 ms each with Python's defaults) would stall all of them at once
    tune_gc()

    async def main():
        stats = {"full": [], "viewport": []}
        state = {"stop": False, "started": time.time_ns() + 10**15}
        count = [0]
        total = full + len(viewports)
        all_ready = asyncio.Event()

        def ready():
            count[0] += 1
            if count[0] == total:
                all_ready.set()

        # a connection per `per_connection` subscribers: channels of one target and options share
        # one connection (gRPC's global subchannel pool) unless each has a pool of its own
        channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1),
                                                                          ("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(max(1, total // per_connection))]
        tasks = [asyncio.create_task(_subscribe(channels[i % len(channels)], None, stats, "full", state, ready))
                 for i in range(full)]
        tasks += [asyncio.create_task(_subscribe(channels[(full + i) % len(channels)], vp, stats, "viewport",
                                                 state, ready)) for i, vp in enumerate(viewports)]
        try:
            await asyncio.wait_for(all_ready.wait(), 120)
        except asyncio.TimeoutError:
            ended = sum(1 for t in tasks if t.done())
            print(f"client: {count[0]} of {total} subscribers ready after 120 s, {ended} ended (reported above)",
                  file=sys.stderr, flush=True)
            raise
        await asyncio.sleep(warmup)
        cpu0 = time.process_time()
        state["started"] = time.time_ns()
        await asyncio.sleep(seconds)
        state["stop"] = True
        cpu = time.process_time() - cpu0
        print(json.dumps({"full": stats["full"], "viewport": stats["viewport"], "cpu": cpu}), flush=True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()

    asyncio.run(main())


# -- the driver --------------------------------------------------------------------------------------
def page_viewports(keys: int, window: int, pages: int, count: int) -> list[tuple[int, int]]:
    """`count` viewports of `window` rows, each at one of `pages` page offsets of a `keys`-row
    table, drawn with a fixed seed (bench_publish uses the same ones)."""
    rng = np.random.default_rng(3)
    starts = (np.arange(pages) * window) % max(1, keys - window)
    return [(int(s), int(s) + window - 1) for s in rng.choice(starts, count)]


def run(port: int, server_pids: list, full: int, viewports: list, procs: int, warmup: float, seconds: float,
        per_connection: int = 100):
    """Runs the subscribers in `procs` client processes; returns latencies and CPU figures."""
    shares = []
    for p in range(procs):
        shares.append((full * (p + 1) // procs - full * p // procs,
                       viewports[len(viewports) * p // procs: len(viewports) * (p + 1) // procs]))
    children = [subprocess.Popen([sys.executable, __file__, "--client", str(port), "--client-full", str(f),
                                  "--client-viewports", json.dumps(v), "--warmup", str(warmup),
                                  "--seconds", str(seconds), "--per-connection", str(per_connection)],
                                 stdout=subprocess.PIPE, text=True)
                for f, v in shares if f or v]
    # server CPU over the measured window: from the end of the warm-up to the deadline
    time.sleep(max(0.0, warmup))
    cpu0, t0 = sum(cpu_seconds(p) for p in server_pids), time.monotonic()
    probe = StallProbe().start()  # the driver waits meanwhile: the machine's own stalls over the run
    out = {"full": [], "viewport": [], "client_cpu": 0.0}
    for ch in children:
        line = ch.stdout.readline()
        ch.wait()
        if not line:
            raise RuntimeError("a client process failed")
        r = json.loads(line)
        out["full"] += r["full"]
        out["viewport"] += r["viewport"]
        out["client_cpu"] += r["cpu"]
    elapsed = time.monotonic() - t0
    out["stalls"], out["seconds"] = probe.stop().summary(), elapsed
    out["server_cpu"] = (sum(cpu_seconds(p) for p in server_pids) - cpu0) / elapsed
    out["client_cpu"] /= seconds
    return out


def describe(name: str, lat: list, seconds: float) -> str:
    if not lat:
        return f"{name}: no messages"
    a = np.array(lat)
    return (f"{name}: {a.size / seconds:,.0f} messages/s, latency change->client p50 {np.percentile(a, 50):.1f} ms, "
            f"p99 {np.percentile(a, 99):.1f} ms")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", type=int, default=100)
    ap.add_argument("--viewport", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rows-per-tick", type=int, default=500)
    ap.add_argument("--window", type=int, default=50)
    ap.add_argument("--pages", type=int, default=20)
    ap.add_argument("--procs", type=int, default=2, help="client processes")
    ap.add_argument("--interval-ms", type=float, default=100.0, help="the engine's cycle and the producer's tick")
    ap.add_argument("--quick", action="store_true", help="10 full + 100 viewport subscribers for 5 s")
    ap.add_argument("--server-log", default="", help="the server process logs here at INFO (subscriptions' "
                    "starts and ends)")
    ap.add_argument("--fanout-workers", type=int, default=0, help="serve the subscribers from N worker "
                    "processes on one port, as `tickwire serve --fanout-workers N` (server CPU: all processes)")
    ap.add_argument("--per-connection", type=int, default=100, help="subscribers per client connection (the "
                    "kernel spreads connections, not subscribers, over the workers)")
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--period-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--client", type=int)
    ap.add_argument("--client-full", type=int, default=0)
    ap.add_argument("--client-viewports", default="[]")
    args = ap.parse_args()
    if args.serve:
        serve(args.keys, args.rows_per_tick, args.interval_ms, args.server_log, args.period_s, args.fanout_workers)
        return 0
    if args.client is not None:
        client(args.client, args.client_full, [tuple(v) for v in json.loads(args.client_viewports)],
               args.warmup, args.seconds, args.per_connection)
        return 0
    if args.quick:
        args.full, args.viewport, args.seconds = 10, 100, 5.0

    server = subprocess.Popen([sys.executable, __file__, "--serve", "--keys", str(args.keys),
                               "--rows-per-tick", str(args.rows_per_tick), "--interval-ms", str(args.interval_ms),
                               "--server-log", args.server_log,
                               "--period-s", repr(producer_period(args.interval_ms, args.seconds)),
                               "--fanout-workers", str(args.fanout_workers)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(server.stdout.readline())
        port, pids = started["port"], started["pids"]
        viewports = page_viewports(args.keys, args.window, args.pages, args.viewport)
        ref = run(port, pids, 1, [], 1, args.warmup, args.seconds)  # every phase, as the main run
        res = run(port, pids, args.full, viewports, args.procs, args.warmup, args.seconds, args.per_connection)
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"table: {args.keys:,} keyed rows, {args.rows_per_tick} upserts per {args.interval_ms:g} ms cycle; "
          f"{args.full} full + {args.viewport} viewport subscribers ({args.window}-row windows on {args.pages} pages), "
          f"{args.procs} client processes, {args.seconds:.0f} s"
          + (f"; {args.fanout_workers} fan-out workers" if args.fanout_workers else "; one server process"))
    print("  " + describe("full", res["full"], args.seconds))
    print("  " + describe("viewport", res["viewport"], args.seconds))
    print(f"  server CPU {res['server_cpu'] * 100:.0f}% of one core; client processes {res['client_cpu'] * 100:.0f}%")
    print("  " + StallProbe.describe(res["stalls"], round(res["seconds"])))
    print("  reference, one full subscriber alone: " + describe("full", ref["full"], args.seconds)
          + f"; server CPU {ref['server_cpu'] * 100:.0f}%")
    if res["full"] and ref["full"]:
        print(f"  p50 latency ratio, fan-out full / single subscriber: "
              f"{np.percentile(res['full'], 50) / np.percentile(ref['full'], 50):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
