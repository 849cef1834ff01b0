"""The web side's costs: gRPC through the port splitter, and Barrage over the browsers' websocket.

1. Bulk DoGet through the splitter. `big_static` (--rows rows x 5 numeric columns) is served by
   two tickwire servers, each in its own process: `splitter` is the default server (one port for
   gRPC and browsers: HTTP/2 connections are spliced to grpcio on a private Unix socket) and
   `direct` is `web=False` (grpcio on the TCP port itself: the reference). The client is plain
   pyarrow.flight in this process; runs alternate between the two servers (A/B, to cancel
   drift) and the median is reported, with each server's CPU time per DoGet (user + system, from
   /proc, the splice threads included). Then --concurrent clients (each its own FlightClient,
   so its own connection, in threads of this process) DoGet at once, the aggregate throughput
   reported the same way. Prints splitter / direct (target: 1.0 within noise).

2. Viewport subscribers: --subscribers browsers' websockets against as many gRPC clients. A
   server process (`web_port=0`: grpcio directly on its port, the reference, and aiohttp on a
   port of its own) serves `ticking`, a keyed table of --keys rows. A writer thread drives the
   engine: every --interval-ms it upserts --per-view random rows inside each subscriber's
   viewport plus --background random rows anywhere, each row's `Ts` holding time.time_ns() at
   write time, and runs the cycle at once (so the latency is the server's publish + the
   transport + the client's decode, not the wait for the next cycle). In a client process (one
   asyncio loop), each subscriber holds a --window-row viewport over its own DoExchange:
     * grpc: a grpc.aio channel per subscriber (own connection, as separate users have), the raw
       stream_stream DoExchange, no serializers;
     * ws:   a WebsocketChannel per subscriber (own websocket, as separate browser tabs have),
       the same DoExchange over `grpc-websockets-multiplex`.
   Both decode every FlightData with the same StreamDecoder. Latency of a message = its arrival
   time minus the newest `Ts` among the rows it adds or modifies. The two kinds run in separate
   phases (never at once), A/B repeated --repeats times; reported: p50/p99 per kind, messages/s,
   server and client CPU, and ws / grpc latency ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

TABLE = "ticking"
DOEXCHANGE = "/arrow.flight.protocol.FlightService/DoExchange"
ANON = {"authorization": "Anonymous"}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop_child(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# == 1. bulk DoGet =====================================================================================
def serve_static(kind: str, rows: int) -> None:
    from tickwire.server.adapters.demo import big_static
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=100)
    engine.create(TableSpec("big_static", "static", data=big_static(rows)))
    server = TickwireServer(engine, port=0, web=(kind == "splitter")).start()
    assert (server.splitter is not None) == (kind == "splitter")
    print(server.port, flush=True)
    sys.stdin.read()
    server.stop()
    engine.stop()


def doget_bench(rows: int, runs: int, concurrent: int, concurrent_runs: int) -> dict:
    import pyarrow.flight as fl

    from tickwire.server.adapters.demo import big_static

    options = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    ticket = fl.Ticket(b"s/big_static")
    expected = big_static(rows)
    nbytes = expected.nbytes
    kinds = ("direct", "splitter")
    servers = {}
    try:
        for k in kinds:
            proc = subprocess.Popen([sys.executable, __file__, "--serve-static", k, "--rows", str(rows)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            servers[k] = (proc, int(proc.stdout.readline()))
        clients = {k: fl.FlightClient(f"grpc://127.0.0.1:{port}") for k, (_, port) in servers.items()}
        for k in kinds:  # warm-up, and a check that both serve the table
            got = clients[k].do_get(ticket, options).read_all()
            if not got.equals(expected):
                raise RuntimeError(f"{k}: DoGet result differs from big_static")
            del got
        del expected
        times = {k: [] for k in kinds}
        cpu = {k: [] for k in kinds}
        for i in range(runs):
            for k in (kinds if i % 2 == 0 else kinds[::-1]):
                proc = servers[k][0]
                c0 = cpu_seconds(proc.pid)
                t0 = time.perf_counter()
                got = clients[k].do_get(ticket, options).read_all()
                times[k].append(time.perf_counter() - t0)
                cpu[k].append(cpu_seconds(proc.pid) - c0)
                assert got.num_rows == rows
                del got

        ctimes = {k: [] for k in kinds}
        ccpu = {k: [] for k in kinds}
        if concurrent > 1 and concurrent_runs > 0:
            pools = {k: [fl.FlightClient(f"grpc://127.0.0.1:{port}") for _ in range(concurrent)]
                     for k, (_, port) in servers.items()}

            def one_round(k: str) -> float:
                barrier = threading.Barrier(concurrent + 1)
                errors = []

                def worker(c):
                    barrier.wait()
                    try:
                        t = c.do_get(ticket, options).read_all()
                        if t.num_rows != rows:
                            errors.append(f"{t.num_rows} rows")
                    except Exception as exc:  # noqa: BLE001 (any failure is reported below)
                        errors.append(repr(exc))

                threads = [threading.Thread(target=worker, args=(c,)) for c in pools[k]]
                for t in threads:
                    t.start()
                barrier.wait()
                t0 = time.perf_counter()
                for t in threads:
                    t.join()
                if errors:
                    raise RuntimeError(f"{k}: concurrent DoGet failed: {errors[0]}")
                return time.perf_counter() - t0

            for k in kinds:  # warm-up: connects every client
                one_round(k)
            for i in range(concurrent_runs):
                for k in (kinds if i % 2 == 0 else kinds[::-1]):
                    proc = servers[k][0]
                    c0 = cpu_seconds(proc.pid)
                    ctimes[k].append(one_round(k))
                    ccpu[k].append(cpu_seconds(proc.pid) - c0)
    finally:
        for proc, _ in servers.values():
            stop_child(proc)
    return {"nbytes": nbytes, "times": times, "cpu": cpu, "ctimes": ctimes, "ccpu": ccpu}


def report_doget(r: dict, rows: int, runs: int, concurrent: int, concurrent_runs: int) -> None:
    nbytes = r["nbytes"]
    print(f"1. Bulk DoGet of big_static, {rows:,} rows x 5 columns ({nbytes / 1e6:.0f} MB), pyarrow.flight client; "
          f"median of {runs} A/B-interleaved runs")
    print(f"   {'server':22s} {'ms/DoGet':>9s} {'MB/s':>8s} {'min..max MB/s':>15s} {'server CPU ms/DoGet':>20s}")
    med = {}
    for k, label in (("direct", "direct (web=False)"), ("splitter", "splitter (shared port)")):
        t = r["times"][k]
        med[k] = statistics.median(t)
        print(f"   {label:22s} {med[k] * 1e3:9.1f} {nbytes / med[k] / 1e6:8.0f} "
              f"{nbytes / max(t) / 1e6:7.0f}..{nbytes / min(t) / 1e6:<7.0f} "
              f"{statistics.median(r['cpu'][k]) * 1e3:20.0f}")
    print(f"   DoGet throughput ratio splitter / direct: {med['direct'] / med['splitter']:.2f} "
          f"(target 1.0, no slower)")
    if r["ctimes"]["direct"]:
        print(f"   {concurrent} concurrent DoGets (each client its own connection), "
              f"median of {concurrent_runs} rounds:")
        cmed = {}
        for k, label in (("direct", "direct (web=False)"), ("splitter", "splitter (shared port)")):
            cmed[k] = statistics.median(r["ctimes"][k])
            print(f"   {label:22s} {cmed[k] * 1e3:9.1f} ms for all, {concurrent * nbytes / cmed[k] / 1e6:6.0f} MB/s "
                  f"aggregate; server CPU {statistics.median(r['ccpu'][k]) * 1e3:.0f} ms per round")
        print(f"   concurrent DoGet throughput ratio splitter / direct: {cmed['direct'] / cmed['splitter']:.2f}")


# == 2. viewport subscribers ===========================================================================
def viewports(keys: int, n: int, window: int) -> list[tuple[int, int]]:
    step = max(window, keys // max(1, n))
    return [(i * step, i * step + window - 1) for i in range(n)]


def serve_ticking(keys: int, subscribers: int, window: int, per_view: int, background: int,
                  interval_ms: float) -> None:
    import pyarrow as pa

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    schema = pa.schema([("Key", pa.int64()), ("Value", pa.float64()), ("Ts", pa.int64())])
    engine = Engine(interval_ms=interval_ms)  # stepped by the writer thread below, not by its own
    table = engine.create(TableSpec(TABLE, "keyed", schema, keys=("Key",)))
    rng = np.random.default_rng(1)
    engine.write(table, pa.table({"Key": np.arange(keys, dtype=np.int64), "Value": rng.random(keys),
                                  "Ts": np.full(keys, time.time_ns(), dtype=np.int64)}, schema=schema), wait=False)
    engine.run_cycle()
    server = TickwireServer(engine, port=0, web_port=0, start_engine=False).start()
    assert server.splitter is None and server.web_port not in (None, server.port)
    starts = np.array([a for a, _ in viewports(keys, subscribers, window)], dtype=np.int64)
    stop = threading.Event()

    def write_and_cycle():
        next_at = time.monotonic()
        while not stop.is_set():
            next_at += interval_ms / 1000.0
            delay = next_at - time.monotonic()
            if delay > 0 and stop.wait(delay):
                break
            inside = (starts[:, None] + rng.integers(0, window, (len(starts), per_view))).ravel()
            k = np.unique(np.concatenate([inside, rng.integers(0, keys, background)]))
            n = len(k)
            ts = np.array([time.time_ns() for _ in range(n)], dtype=np.int64)  # write time, per row
            engine.write(table, pa.table({"Key": k, "Value": rng.random(n), "Ts": ts}, schema=schema), wait=False)
            engine.run_cycle()

    writer = threading.Thread(target=write_and_cycle, name="bench-writer", daemon=True)
    writer.start()
    print(json.dumps({"grpc": server.port, "ws": server.web_port}), flush=True)
    sys.stdin.read()
    stop.set()
    writer.join(5)
    server.stop()


async def _consume(messages, dec, ts_col: int, state, lat: list, ready) -> None:
    """Feeds every FlightData to `dec`; the first complete message is the viewport's snapshot."""
    snapshot = True
    async for raw in messages:
        now = time.time_ns()
        u = dec.feed(raw)
        if u is None:
            continue
        if snapshot:
            snapshot = False
            ready()
            continue
        newest = None
        for part in (u.added, u.modified):
            if part and len(part[ts_col]):
                m = int(np.max(part[ts_col].to_numpy(zero_copy_only=False)))
                newest = m if newest is None else max(newest, m)
        if newest is not None and now >= state["started"]:
            lat.append((now - newest) / 1e6)
        if state["stop"]:
            break


async def _grpc_subscriber(port: int, vp, state, lat, ready) -> None:
    import grpc

    from tickwire.protocol.opening import exchange_opening, subscription_request
    from tickwire.protocol.update import StreamDecoder

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1),
                                                                       ("grpc.use_local_subchannel_pool", 1)])
    opening = exchange_opening(subscription_request(b"s/" + TABLE.encode(), viewport=[vp]))
    done = asyncio.Event()

    async def requests():
        for m in opening:
            yield m
        await done.wait()

    call = channel.stream_stream(DOEXCHANGE, request_serializer=None, response_deserializer=None)(
        requests(), metadata=tuple(ANON.items()))
    try:
        await _consume(call, StreamDecoder(), 2, state, lat, ready)
    finally:
        done.set()
        call.cancel()
        await channel.close()


async def _ws_subscriber(url: str, vp, state, lat, ready) -> None:
    from tickwire.clients.websocket import WebsocketChannel
    from tickwire.protocol.opening import exchange_opening, subscription_request
    from tickwire.protocol.update import StreamDecoder

    ch = await WebsocketChannel.connect(url)
    try:
        call = await ch.open(DOEXCHANGE, ANON)
        for m in exchange_opening(subscription_request(b"s/" + TABLE.encode(), viewport=[vp])):
            await call.send(m)
        await _consume(call, StreamDecoder(), 2, state, lat, ready)
    finally:
        await ch.close()


def client(kind: str, port: int, vps: list, warmup: float, seconds: float) -> None:
    async def main():
        state = {"stop": False, "started": time.time_ns() + 10**15}
        lat: list = []
        count = [0]
        all_ready = asyncio.Event()

        def ready():
            count[0] += 1
            if count[0] == len(vps):
                all_ready.set()

        if kind == "grpc":
            tasks = [asyncio.create_task(_grpc_subscriber(port, tuple(vp), state, lat, ready)) for vp in vps]
        else:
            url = f"http://127.0.0.1:{port}"
            tasks = [asyncio.create_task(_ws_subscriber(url, tuple(vp), state, lat, ready)) for vp in vps]
        waiter = asyncio.create_task(all_ready.wait())
        await asyncio.wait([waiter, *tasks], timeout=60, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            if t.done() and t.exception() is not None:
                raise t.exception()
        if not all_ready.is_set():
            raise RuntimeError(f"only {count[0]} of {len(vps)} subscribers got their snapshot")
        await asyncio.sleep(warmup)
        print("measuring", flush=True)
        cpu0 = time.process_time()
        state["started"] = time.time_ns()
        await asyncio.sleep(seconds)
        state["stop"] = True
        cpu = time.process_time() - cpu0
        print(json.dumps({"lat": lat, "cpu": cpu}), flush=True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


def run_phase(kind: str, port: int, server_pid: int, vps: list, warmup: float, seconds: float) -> dict:
    child = subprocess.Popen([sys.executable, __file__, "--client", kind, "--port", str(port),
                              "--viewports", json.dumps(vps), "--warmup", str(warmup), "--seconds", str(seconds)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        if line.strip() != "measuring":
            raise RuntimeError(f"{kind} client process failed")
        cpu0, t0 = cpu_seconds(server_pid), time.monotonic()
        line = child.stdout.readline()
        elapsed = time.monotonic() - t0
        server_cpu = (cpu_seconds(server_pid) - cpu0) / elapsed
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if not line:
        raise RuntimeError(f"{kind} client process failed")
    r = json.loads(line)
    return {"lat": r["lat"], "client_cpu": r["cpu"] / seconds, "server_cpu": server_cpu}


def subscribers_bench(args) -> dict:
    vps = viewports(args.keys, args.subscribers, args.window)
    server = subprocess.Popen([sys.executable, __file__, "--serve-ticking", "--keys", str(args.keys),
                               "--subscribers", str(args.subscribers), "--window", str(args.window),
                               "--per-view", str(args.per_view), "--background", str(args.background),
                               "--interval-ms", str(args.interval_ms)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    phases = []
    try:
        ports = json.loads(server.stdout.readline())
        for _ in range(args.repeats):
            for kind in ("grpc", "ws"):
                phases.append((kind, run_phase(kind, ports[kind], server.pid, vps, args.warmup, args.seconds)))
    finally:
        stop_child(server)
    return {"phases": phases}


def report_subscribers(r: dict, args) -> None:
    print(f"2. {args.subscribers} viewport subscribers ({args.window}-row windows) of a {args.keys:,}-row keyed table; "
          f"every {args.interval_ms:.0f} ms {args.per_view} upserts in each window + {args.background} elsewhere, "
          f"then the cycle; {args.seconds:.0f} s per phase after {args.warmup:.0f} s warm-up, "
          f"phases A/B x {args.repeats}")
    print(f"   {'phase':6s} {'msgs/s':>8s} {'p50 ms':>7s} {'p90 ms':>7s} {'p99 ms':>7s} {'max ms':>7s} "
          f"{'server CPU':>10s} {'client CPU':>10s}")
    by = {"grpc": [], "ws": []}
    for kind, p in r["phases"]:
        a = np.array(p["lat"]) if p["lat"] else np.array([np.nan])
        by[kind].append(p)
        print(f"   {kind:6s} {len(p['lat']) / args.seconds:8.0f} {np.percentile(a, 50):7.2f} "
              f"{np.percentile(a, 90):7.2f} {np.percentile(a, 99):7.2f} {np.max(a):7.1f} "
              f"{p['server_cpu'] * 100:9.0f}% {p['client_cpu'] * 100:9.0f}%")
    allk = {k: np.concatenate([np.array(p["lat"]) for p in v]) for k, v in by.items()}
    for k, label in (("grpc", "grpc (grpc.aio, direct port)"), ("ws", "ws (WebsocketChannel)")):
        a = allk[k]
        print(f"   all {label:29s}: {a.size:,} messages, p50 {np.percentile(a, 50):.2f} ms, "
              f"p99 {np.percentile(a, 99):.2f} ms")
    if allk["grpc"].size and allk["ws"].size:
        print(f"   latency ratio ws / grpc: p50 {np.percentile(allk['ws'], 50) / np.percentile(allk['grpc'], 50):.2f}, "
              f"p99 {np.percentile(allk['ws'], 99) / np.percentile(allk['grpc'], 99):.2f} (target <= 1.0-ish; "
              f"> 2 at p99 would be a problem)")
        sc = {k: statistics.mean(p["server_cpu"] for p in v) for k, v in by.items()}
        cc = {k: statistics.mean(p["client_cpu"] for p in v) for k, v in by.items()}
        print(f"   server CPU ratio ws / grpc: {sc['ws'] / sc['grpc']:.2f}; "
              f"client CPU ratio: {cc['ws'] / cc['grpc']:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1M rows, 3 runs; 5 s phases, one A/B")
    ap.add_argument("--only", choices=["doget", "subscribers"])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--concurrent", type=int, default=4)
    ap.add_argument("--concurrent-runs", type=int, default=5)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--subscribers", type=int, default=50)
    ap.add_argument("--window", type=int, default=60)
    ap.add_argument("--per-view", type=int, default=3)
    ap.add_argument("--background", type=int, default=500)
    ap.add_argument("--interval-ms", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=2)
    # internal: the child processes
    ap.add_argument("--serve-static", choices=["direct", "splitter"])
    ap.add_argument("--serve-ticking", action="store_true")
    ap.add_argument("--client", choices=["grpc", "ws"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--viewports", default="[]")
    args = ap.parse_args()
    if args.serve_static:
        serve_static(args.serve_static, args.rows)
        return 0
    if args.serve_ticking:
        serve_ticking(args.keys, args.subscribers, args.window, args.per_view, args.background, args.interval_ms)
        return 0
    if args.client:
        client(args.client, args.port, json.loads(args.viewports), args.warmup, args.seconds)
        return 0
    if args.quick:
        args.rows, args.runs, args.concurrent_runs = 1_000_000, 3, 2
        args.seconds, args.repeats = 5.0, 1
    if args.only != "subscribers":
        r = doget_bench(args.rows, args.runs, args.concurrent, args.concurrent_runs)
        report_doget(r, args.rows, args.runs, args.concurrent, args.concurrent_runs)
    if args.only != "doget":
        r = subscribers_bench(args)
        report_subscribers(r, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
