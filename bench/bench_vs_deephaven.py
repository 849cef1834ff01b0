"""Streaming side by side: tickwire and a real Deephaven 42.7, the same producer and the same client.

Each server runs in its own process with a producer inside it that appends `--rate` rows per
second to an append-only table `t` (columns Seq, Ts, Px), one batch about every cycle (on deadlines
a little over a cycle apart, so that over the measured seconds the batches meet every phase of
the cycle once: `producer_period`), stamping `Ts` with the wall-clock time of the write: in
tickwire an engine write, in Deephaven a `table_publisher` batch through `blink_to_append_only` (the interop extra's
deephaven-server, with `PeriodicUpdateGraph.targetCycleDurationMillis` and
`barrage.minUpdateInterval` set to the cycle). The client is Deephaven's own pydeephaven-ticking
(`listen`), `--subscribers` subscriptions of the whole table spread over `--client-procs` client
processes (the server's CPU is measured alone, from /proc). The producers start
once the subscriptions are in, so both tables start empty.

Seen here: against Deephaven 42.7 at a 10 ms cycle, pydeephaven-ticking 42.7 gives up with
"There is excess data in the chunk" from about 500 rows per cycle (it keeps up at 100 per cycle,
and at 20,000 per 100 ms cycle); the bench then says so for Deephaven and reports tickwire alone.

Latency of an update = its arrival in the listener minus the newest `Ts` among the rows it adds
(change -> client, the cycle wait included). Reported per server: p50 and p99 over `--seconds`
after a warm-up, the server process's CPU (user + system) per million rows produced, and its RSS
at the end; then the ratios tickwire / Deephaven, all measured in the same run. Beside each
server's figures: how often the machine itself stalled over those seconds (bench/machine_stalls.py);
on a virtual machine whose host takes the CPU away for bursts, a 10 ms cycle's p99 measures them.

    python bench/bench_vs_deephaven.py --interval-ms 10 --rate 200000
    python bench/bench_vs_deephaven.py --interval-ms 10 --rate 10000 --subscribers 50
"""
from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench_fanout import deadlines, producer_period  # noqa: E402 - the streaming benches' producer schedule
from machine_stalls import StallProbe  # noqa: E402 - the machine's own stalls over the measured seconds
from procstat import cpu_seconds  # noqa: E402

DH_SCRIPT = r'''
import threading, time
import numpy as np
from deephaven import dtypes as dht, new_table
from deephaven.column import long_col, double_col
from deephaven.stream import blink_to_append_only
from deephaven.stream.table_publisher import table_publisher

_blink, _pub = table_publisher("bench", {"Seq": dht.int64, "Ts": dht.int64, "Px": dht.double}, chunk_size=1 << 16)
t = blink_to_append_only(_blink)

_go = threading.Event()  # set when the subscribers are in: both servers start from an empty table

def _produce():
    seq = 0
    n = ROWS_PER_TICK
    _go.wait()
    due = time.monotonic()
    while True:
        due += PERIOD_S  # a deadline per batch: the batches' phase against the cycle sweeps at a set pace
        time.sleep(max(0.0, due - time.monotonic()))
        ts = time.time_ns()
        s = np.arange(seq, seq + n, dtype=np.int64)
        _pub.add(new_table([long_col("Seq", s), long_col("Ts", np.full(n, ts, dtype=np.int64)),
                            double_col("Px", s * 0.5)]))
        seq += n

threading.Thread(target=_produce, daemon=True).start()
'''


def serve_tickwire(interval_ms: float, rows_per_tick: int, web: bool = True, period_s: float = 0.0) -> None:
    import pyarrow as pa

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec
    from tickwire.server.process_gc import freeze_startup, tune_gc

    schema = pa.schema([("Seq", pa.int64()), ("Ts", pa.int64()), ("Px", pa.float64())])
    tune_gc()  # the collector as `tickwire serve` sets it (tickwire.server.process_gc)
    engine = Engine(interval_ms=interval_ms)
    table = engine.create(TableSpec("t", "append", schema))
    # web=False: gRPC alone on its port (`tickwire serve --no-web`); by default the port is shared
    # with the web side and gRPC is reached through its splitter
    server = TickwireServer(engine, port=0, web=web).start()
    freeze_startup()  # as `tickwire serve` does once its server has started
    stop = threading.Event()

    go = threading.Event()

    def produce():
        seq = 0
        go.wait()
        for _ in deadlines(period_s or interval_ms / 1000.0, stop):  # as the Deephaven producer's
            s = np.arange(seq, seq + rows_per_tick, dtype=np.int64)
            engine.write(table, pa.table({"Seq": s, "Ts": np.full(rows_per_tick, time.time_ns(), dtype=np.int64),
                                          "Px": s * 0.5}, schema=schema), wait=False)
            seq += rows_per_tick

    threading.Thread(target=produce, daemon=True).start()
    print(server.port, flush=True)
    sys.stdin.readline()  # "go": the subscribers are in
    go.set()
    sys.stdin.read()
    stop.set()
    server.stop()
    engine.stop()


def tree_cpu(pid: int) -> float:
    """CPU of `pid` and its descendants (Deephaven's server is a JVM under a Python launcher)."""
    total = cpu_seconds(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return total + sum(tree_cpu(int(c)) for c in children)


def tree_rss_mb(pid: int) -> float:
    kb = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                kb = int(line.split()[1])
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return kb / 1024 + sum(tree_rss_mb(int(c)) for c in children)


def client(port: int, subscribers: int, warmup: float, seconds: float) -> None:
    """A client process: `subscribers` pydeephaven-ticking listeners of `t`. Prints "ready" once
    they are in, waits for "go" on stdin, then records latencies for `seconds` after `warmup` and
    prints them (JSON): {"lat": [...ms], "error": first listener error or None}."""
    from pydeephaven import Session
    from pydeephaven_ticking.table_listener import listen

    lat: list[float] = []
    errors: list = []
    state = {"from": time.time_ns() + 10**15}
    lock = threading.Lock()

    def on_update(u) -> None:
        now = time.time_ns()
        if now < state["from"]:
            return
        ts = u.added(["Ts"])["Ts"]
        if len(ts):
            newest = int(np.max(np.asarray(ts)))
            with lock:
                lat.append((now - newest) / 1e6)

    sessions, handles = [], []
    try:
        for _ in range(subscribers):
            s = Session(host="127.0.0.1", port=port)
            sessions.append(s)
            h = listen(s.open_table("t"), on_update, errors.append)
            h.start()
            handles.append(h)
        print("ready", flush=True)
        sys.stdin.readline()
        time.sleep(warmup)
        state["from"] = time.time_ns()
        time.sleep(seconds)
        state["from"] = time.time_ns() + 10**15
    finally:
        for h in handles:
            try:
                h.stop()
            except Exception:  # noqa: BLE001 - stopping anyway
                pass
        for s in sessions:
            s.close()
    with lock:
        out = list(lat)
    print(json.dumps({"lat": out, "error": str(errors[0]).split(":")[0] if errors else None}), flush=True)


def measure(port: int, pid: int, subscribers: int, procs: int, warmup: float, seconds: float, rate: float,
            go: Callable[[], None]) -> dict:
    """Latencies of `subscribers` listeners of `t` spread over `procs` client processes, the
    server's CPU per million rows produced, its RSS. `go()` starts the server's producer once
    every subscription is in."""
    shares = [subscribers * (i + 1) // procs - subscribers * i // procs for i in range(procs)]
    children = [subprocess.Popen([sys.executable, __file__, "--client", str(port), "--client-subscribers", str(n),
                                  "--warmup", str(warmup), "--seconds", str(seconds)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for n in shares if n]
    try:
        for ch in children:
            assert ch.stdout is not None
            if ch.stdout.readline().strip() != "ready":
                raise RuntimeError("a client process failed to subscribe")
        go()
        for ch in children:
            assert ch.stdin is not None
            ch.stdin.write("go\n")
            ch.stdin.flush()
        time.sleep(warmup)
        cpu0, t0 = tree_cpu(pid), time.monotonic()
        probe = StallProbe().start()
        time.sleep(seconds)
        cpu = tree_cpu(pid) - cpu0
        stalls = probe.stop().summary()
        elapsed = time.monotonic() - t0
        rss = tree_rss_mb(pid)
        lat: list[float] = []
        errors = []
        for ch in children:
            assert ch.stdout is not None
            line = ch.stdout.readline()
            if not line:
                raise RuntimeError("a client process died")
            r = json.loads(line)
            lat += r["lat"]
            if r["error"]:
                errors.append(r["error"])
    finally:
        for ch in children:
            end_child(ch)
    if errors:  # the client gave up on the stream: said, not measured
        return {"error": f"{errors[0]} ({len(errors)} client process(es) saw their listener fail)"}
    a = np.array(lat)
    return {"p50": float(np.percentile(a, 50)) if a.size else float("nan"),
            "p99": float(np.percentile(a, 99)) if a.size else float("nan"),
            "updates": int(a.size), "cpu_per_mrow": cpu / (rate * elapsed / 1e6), "cpu_share": cpu / elapsed,
            "rss_mb": rss, "stalls": stalls}


def end_child(proc: subprocess.Popen) -> None:
    """Ends a server child: its stdin closed is its signal to stop; killed if it has not in 10 s."""
    if proc.stdin is not None:
        proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    if proc.poll() is None:
        proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval-ms", type=float, default=10.0, help="the servers' cycle (and the producer's tick)")
    ap.add_argument("--rate", type=float, default=200_000, help="rows appended per second")
    ap.add_argument("--subscribers", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--client-procs", type=int, default=0,
                    help="client processes the subscribers are spread over (default: one per 10, at most 4)")
    ap.add_argument("--only", choices=["tickwire", "deephaven"], help="run one server only")
    ap.add_argument("--no-web", action="store_true",
                    help="tickwire serves gRPC alone on its port (no shared port, no splitter hop)")
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--client-subscribers", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows-per-tick", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--period-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows_per_tick = max(1, int(round(args.rate * args.interval_ms / 1000.0)))
    if args.serve:
        serve_tickwire(args.interval_ms, args.rows_per_tick, web=not args.no_web, period_s=args.period_s)
        return 0
    if args.client is not None:
        client(args.client, args.client_subscribers, args.warmup, args.seconds)
        return 0
    procs = args.client_procs or max(1, min(4, args.subscribers // 10))
    period = producer_period(args.interval_ms, args.seconds)
    rate = rows_per_tick / period
    print(f"append {rate:,.0f} rows/s ({rows_per_tick:,} per {args.interval_ms:g} ms cycle), {args.subscribers} "
          f"pydeephaven-ticking subscriber(s) in {procs} client process(es), {args.seconds:g} s after "
          f"{args.warmup:g} s of warm-up")
    results: dict[str, dict] = {}
    if args.only in (None, "tickwire"):
        proc = subprocess.Popen([sys.executable, __file__, "--serve", "--interval-ms", str(args.interval_ms),
                                 "--rows-per-tick", str(rows_per_tick), "--period-s", repr(period)]
                                + (["--no-web"] if args.no_web else []),
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())

            def go() -> None:
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()

            results["tickwire"] = measure(port, proc.pid, args.subscribers, procs, args.warmup, args.seconds, rate,
                                          go)
        finally:
            end_child(proc)
    if args.only in (None, "deephaven"):
        from tests.interop.dh_server import start_dh_server

        script = DH_SCRIPT.replace("ROWS_PER_TICK", str(rows_per_tick)).replace("PERIOD_S", repr(period))
        cycle = str(int(args.interval_ms))
        with start_dh_server(free_port(), script, heap="2g",
                             extra_jvm_args=[f"-DPeriodicUpdateGraph.targetCycleDurationMillis={cycle}",
                                             f"-Dbarrage.minUpdateInterval={cycle}",
                                             # the JIT's every tier, as a Deephaven server runs (the
                                             # test helper stops at C1 to start faster)
                                             "-XX:TieredStopAtLevel=4"]) as dh:
            results["deephaven"] = measure(dh.port, dh.proc.pid, args.subscribers, procs, args.warmup, args.seconds,
                                           rate, lambda: dh.run_script("_go.set()"))
    for k, r in list(results.items()):
        if "error" in r:
            print(f"  {k:9s}: pydeephaven-ticking failed: {r['error']}")
            del results[k]
            continue
        print(f"  {k:9s}: p50 {r['p50']:6.1f} ms, p99 {r['p99']:6.1f} ms ({r['updates']:,} updates); server CPU "
              f"{r['cpu_per_mrow']:.2f} s per million rows ({r['cpu_share'] * 100:.0f}% of a core); RSS "
              f"{r['rss_mb']:.0f} MB")
        print(f"             {StallProbe.describe(r['stalls'], args.seconds)}")
    if len(results) == 2:
        t, d = results["tickwire"], results["deephaven"]
        print(f"  tickwire / Deephaven: p50 {t['p50'] / d['p50']:.2f}, p99 {t['p99'] / d['p99']:.2f}, CPU per row "
              f"{t['cpu_per_mrow'] / d['cpu_per_mrow']:.2f}, RSS {t['rss_mb'] / d['rss_mb']:.2f}")
    print(json.dumps({"interval_ms": args.interval_ms, "rate": rate, "subscribers": args.subscribers,
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
