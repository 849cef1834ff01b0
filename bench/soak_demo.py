"""The demo under everything a long-running server meets, for an hour (--minutes), sampled every
--sample seconds: does anything grow that should not?

The server is `tickwire demo` (Spark feeding it unless --no-spark) in a process of its own, with a
durable data directory and its web side. Its append tables (ticking_append, spark_trades) keep
their last --append-rows rows (20,000; 0 keeps every row): a table that keeps every row grows by
design, and the question here is whether anything else does. This process drives, in threads:

- churn: a keyed input table (pydeephaven, as Deephaven's clients make one) of --live keys whose
  keys are replaced at --churn keys a second (inserts and deletes; the batch grows when a round
  trip takes longer than a tenth of a second), each row stamped with the time it was written;
- followers: tickwire clients subscribing to the demo tables and the churned table, full and
  viewport, each kept a few seconds to a minute, then closed; one reconnecting subscriber follows
  the churned table all along and measures latency (its rows' stamps against their arrival);
- browsers: websocket clients (the JS API's transport on http) that log in, subscribe over the
  websocket a while and go;
- uploads and operations: DoPuts of small tables and pydeephaven table operations (where, sort,
  agg_by) made and released;
- abandoned sessions: sessions opened with an export and never used again, left to expire
  (`session_duration_ms`, Deephaven's five minutes by default).

Every --sample seconds: the server's RSS (and its anonymous and file-backed parts), open file
descriptors and threads (from /proc, with the threads' kernel names), Arrow's, Python's and the C
heap's allocations and the Python threads by name (from its /metrics), its resident anonymous
memory by kind of mapping (glibc's brk heap and other arenas, Python's arenas, the rest: from
/proc/PID/smaps), the data directory's bytes,
latency p50/p99 of the last period, and the counts of the clients' work.
At the end: a least-squares slope of RSS, descriptors and threads over the last 40 minutes (the
last two thirds of a shorter run), as a share of the mean per hour (flat: within the noise
stated; Arrow's, Python's and the C heap's slopes are reported too: the engine's numpy arrays are
in the C heap's "in use"; and what is resident outside that heap), the threads whose count
changed between the first sample and the last, by name, the disk's peak, latency at the end
against the start, every follower's state against the server's, and the churned table against
what the driver acknowledged. Printed, and written as JSON (--report).

`--memtrace FILE`: the server also writes its memory by holder each sample (each table, publisher, the
sessions, the web side), and with --memtrace-python where Python allocated it
(server/observability/memtrace.py).

`--quick` (5 minutes, 20 s samples, no Spark) is the short form tests/test_soak_demo.py runs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_stats(pid: int) -> dict:
    # RSS, and its anonymous and file-backed parts (mapped files: checkpoints, journals, libraries)
    out = {"rss_mb": float("nan"), "rss_anon_mb": float("nan"), "rss_file_mb": float("nan"), "fds": -1,
           "threads": -1}
    fields = {"VmRSS:": "rss_mb", "RssAnon:": "rss_anon_mb", "RssFile:": "rss_file_mb"}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                name = line.split(None, 1)[0] if line.strip() else ""
                if name in fields:
                    out[fields[name]] = int(line.split()[1]) / 1024
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


def anon_by_mapping(pid: int) -> dict:
    """Resident anonymous memory (MB) by the kind of mapping it is in, from /proc/PID/smaps: the
    brk heap (glibc's main arena), glibc's other arenas (each a 64 MiB reservation: a read-write
    part followed by an inaccessible rest), Python's object arenas (mappings of 256 KiB to
    1 MiB), and the rest (large allocations glibc or numpy mapped on their own, thread stacks)."""
    out = {"anon_brk_mb": 0.0, "anon_arenas_mb": 0.0, "anon_pyarenas_mb": 0.0, "anon_other_mb": 0.0}
    maps: list[list] = []  # [lo, hi, perms, name, anonymous kB]
    try:
        with open(f"/proc/{pid}/smaps") as fh:
            for line in fh:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):  # a mapping's first line
                    parts = line.split()
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    maps.append([lo, hi, parts[1], parts[5] if len(parts) > 5 else "", 0])
                elif head == "Anonymous:" and maps:
                    maps[-1][4] = int(line.split()[1])
    except OSError:  # the server exited between samples: nothing of it is resident
        return out
    for i, (lo, hi, perms, name, kb) in enumerate(maps):
        nxt = maps[i + 1] if i + 1 < len(maps) else None
        if name == "[heap]":
            key = "anon_brk_mb"
        elif (nxt is not None and nxt[2].startswith("---") and nxt[0] == hi and nxt[1] - lo == 64 << 20) or \
                (perms.startswith("rw") and hi - lo == 64 << 20):
            key = "anon_arenas_mb"
        elif (256 << 10) <= hi - lo <= (1 << 20) and not name:
            key = "anon_pyarenas_mb"
        else:
            key = "anon_other_mb"
        out[key] += kb / 1024
    return out


def native_thread_names(pid: int) -> dict:
    """The process's threads by the name the kernel knows (gRPC's and Arrow's name their own; a
    Python thread shows as its interpreter's name), digits dropped."""
    out: dict = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as fh:
                    name = "".join("N" if c.isdigit() else c for c in fh.read().strip())
            except OSError:
                continue
            out[name] = out.get(name, 0) + 1
    except OSError:
        pass
    return out


def tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (Spark's JVM is a child of the demo)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo += [int(c) for c in fh.read().split()]
        except OSError:
            pass
    return out


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def slope_per_hour(ts: list[float], ys: list[float]) -> tuple[float, float]:
    """(least-squares slope per hour, as a share of the mean; the residuals' spread, same units)."""
    t = np.asarray(ts, dtype=float) / 3600.0
    y = np.asarray(ys, dtype=float)
    if t.size < 3 or not np.isfinite(y).all() or y.mean() == 0:
        return float("nan"), float("nan")
    a, b = np.polyfit(t, y, 1)
    resid = y - (a * t + b)
    return float(a / y.mean()), float(resid.std() / y.mean())


class Soak:
    def __init__(self, args):
        self.args = args
        self.stop = threading.Event()
        self.port = free_port()
        self.web_port = free_port()
        self.data = Path(tempfile.mkdtemp(prefix="tw_soak_"))
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.counts = {"churn_batches": 0, "churn_keys": 0, "followers": 0, "browsers": 0, "uploads": 0,
                       "operations": 0, "abandoned_sessions": 0, "errors": 0}
        self.errors: list[str] = []
        self.acked: dict[int, int] = {}  # churned key -> the value acknowledged last (live keys)
        self.samples: list[dict] = []
        self.converged: list[bool] = []

    # -- the server ------------------------------------------------------------------------------
    def start_server(self) -> None:
        cmd = [sys.executable, "-m", "tickwire", "demo", "--port", str(self.port), "--web-port", str(self.web_port),
               "--data-dir", str(self.data), "--host", "127.0.0.1"]
        if self.args.no_spark:
            cmd.append("--no-spark")
        if self.args.append_rows:   # the demo's append tables hold their last rows only
            cmd += ["--append-rows", str(self.args.append_rows)]
        self.log = open(self.data.parent / (self.data.name + ".log"), "wb")
        env = dict(os.environ)
        if self.args.memtrace:  # the server traces its memory (server/observability/memtrace.py)
            env["TICKWIRE_MEMTRACE"] = str(Path(self.args.memtrace).resolve())
            env["TICKWIRE_MEMTRACE_SECONDS"] = str(self.args.sample)
            env["TICKWIRE_MEMTRACE_PYTHON"] = "1" if self.args.memtrace_python else "0"
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                     env=env)
        from tickwire.clients.client import BarrageClient

        end = time.monotonic() + 300
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the demo exited with {self.proc.returncode}")
            try:
                with BarrageClient(f"127.0.0.1:{self.port}") as c:
                    if "ticking_keyed" in c.tables():
                        return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(1)
        raise RuntimeError("the demo did not come up in 300 s")

    def stop_server(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except Exception:  # noqa: BLE001
            os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.data, ignore_errors=True)

    # -- load ------------------------------------------------------------------------------------
    def _error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.counts["errors"] += 1
            if len(self.errors) < 50:
                self.errors.append(f"{where}: {type(exc).__name__}: {exc}"[:300])

    def churn(self) -> None:
        from pydeephaven import Session

        live, rate = self.args.live, self.args.churn
        session = Session(host="127.0.0.1", port=self.port)
        schema = pa.schema([("Key", pa.int64()), ("Value", pa.int64()), ("Stamp", pa.int64())])
        from pydeephaven.ticket import SharedTicket

        table = session.input_table(schema=schema, key_cols=["Key"])
        shared = SharedTicket.random_ticket()
        session.publish_table(shared, table)  # the other clients' sessions reach it by this ticket
        self.churn_session, self.churn_table = session, table  # held: a collected Table releases its export
        self.churned = shared.bytes
        keys = np.arange(live, dtype=np.int64)
        nxt = live
        batch = max(1, rate // 10)  # ten batches a second
        for start in range(0, live, 50_000):
            part = keys[start:start + 50_000]
            stamps = np.full(part.size, time.time_ns())
            t = session.import_table(pa.table({"Key": part, "Value": part, "Stamp": stamps}, schema=schema))
            table.add(t)
        with self.lock:
            self.acked = {int(k): int(k) for k in keys}
        rng = np.random.default_rng(7)
        # the rate is kept by the batch size: each round replaces the keys due since the start (at
        # most a second's worth), so round trips that take longer than 0.1 s make bigger batches
        t_start, done = time.monotonic(), 0
        while not self.stop.is_set():
            t0 = time.monotonic()
            due = int(rate * (t0 - t_start)) - done
            if due > 2 * rate:  # after a stall: no burst to catch up, the rate goes on from here
                done += due - rate
                due = rate
            if due < max(1, rate // 10):
                self.stop.wait(0.02)
                continue
            batch = min(due, rate, live // 4)
            try:
                pick = rng.choice(keys.size, batch, replace=False)
                gone = keys[pick]
                new = np.arange(nxt, nxt + batch, dtype=np.int64)
                nxt += batch
                dt = session.import_table(pa.table({"Key": gone}))
                table.delete(dt)
                stamps = np.full(batch, time.time_ns())
                at = session.import_table(pa.table({"Key": new, "Value": new * 2, "Stamp": stamps}, schema=schema))
                table.add(at)
                keys[pick] = new
                with self.lock:
                    for k in gone.tolist():
                        self.acked.pop(k, None)
                    for k in new.tolist():
                        self.acked[k] = k * 2
                    self.counts["churn_batches"] += 1
                    self.counts["churn_keys"] += batch
                session.release(dt)
                session.release(at)
            except Exception as exc:  # noqa: BLE001 - counted, the soak goes on
                self._error("churn", exc)
            done += batch

    def latency_follower(self) -> None:
        """A reconnecting full subscription to the churned table: each update's added rows' stamps
        against the time it arrived."""
        from tickwire.clients.client import BarrageClient

        while not self.stop.is_set() and getattr(self, "churned", None) is None:
            time.sleep(0.2)
        def on_update(u) -> None:
            if u.is_snapshot or u.added.num_rows == 0:
                return
            now = time.time_ns()
            stamps = u.added.column("Stamp").to_numpy()
            with self.lock:
                self.latencies.extend(((now - stamps) / 1e6).tolist())

        client = BarrageClient(f"127.0.0.1:{self.port}")
        self.follower_client = client
        self.follower = client.subscribe(self.churned, on_update=on_update, reconnect=True)
        self.stop.wait()

    def followers(self) -> None:
        from tickwire.clients.client import BarrageClient

        rng = random.Random(3)
        tables = ["ticking_append", "ticking_keyed", "ticking_ring", "ticking_sorted", "blink"]
        with BarrageClient(f"127.0.0.1:{self.port}") as client:
            while not self.stop.is_set():
                name = rng.choice(tables)
                try:
                    if rng.random() < 0.5:
                        sub = client.subscribe(name)
                    else:
                        first = rng.randrange(0, 50)
                        sub = client.subscribe(name, viewport=[(first, first + 20)])
                    self.stop.wait(rng.uniform(2, 20))
                    sub.close()
                    with self.lock:
                        self.counts["followers"] += 1
                except Exception as exc:  # noqa: BLE001
                    self._error("follower", exc)

    def browsers(self) -> None:
        import asyncio

        from tickwire.clients.websocket import WebsocketChannel
        from tickwire.protocol.opening import exchange_opening, subscription_request

        rng = random.Random(5)
        flight = "/arrow.flight.protocol.FlightService/"
        anon = {"authorization": "Anonymous"}

        async def one() -> None:
            async with await WebsocketChannel.connect(f"http://127.0.0.1:{self.web_port}") as ch:
                await ch.unary("/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants", b"", anon)
                opening = list(exchange_opening(subscription_request(b"s/ticking_keyed")))
                stream = await ch.open(flight + "DoExchange", anon)
                for m in opening:
                    await stream.send(m)
                got = 0
                end = time.monotonic() + rng.uniform(2, 15)
                while time.monotonic() < end and not self.stop.is_set():
                    try:
                        await asyncio.wait_for(stream.__anext__(), 2)
                        got += 1
                    except asyncio.TimeoutError:
                        pass

        while not self.stop.is_set():
            try:
                asyncio.run(one())
                with self.lock:
                    self.counts["browsers"] += 1
            except Exception as exc:  # noqa: BLE001
                self._error("browser", exc)
                self.stop.wait(1)

    def uploads_and_operations(self) -> None:
        from pydeephaven import Session, agg

        rng = random.Random(9)
        while not self.stop.is_set():
            try:
                session = Session(host="127.0.0.1", port=self.port)
                try:
                    for _ in range(10):
                        if self.stop.is_set():
                            break
                        n = rng.randrange(10, 2000)
                        data = pa.table({"x": np.arange(n), "y": np.random.default_rng(n).random(n)})
                        up = session.import_table(data)
                        with self.lock:
                            self.counts["uploads"] += 1
                        src = session.open_table("ticking_append")
                        derived = src.where(["Price > 100"]).sort(["Size"]).agg_by([agg.avg(["Price"])], by=["Sym"])
                        derived.to_arrow()
                        session.release(derived)
                        session.release(src)
                        session.release(up)
                        with self.lock:
                            self.counts["operations"] += 1
                        self.stop.wait(rng.uniform(0.5, 3))
                finally:
                    session.close()
            except Exception as exc:  # noqa: BLE001
                self._error("operations", exc)
                self.stop.wait(1)

    def abandoned_sessions(self) -> None:
        """A session with an export, never used again: it must expire and take its export along."""
        import grpc

        from tickwire.protocol.proto import session_pb2, table_pb2, ticket_pb2

        while not self.stop.is_set():
            try:
                with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
                    new = ch.unary_unary("/io.deephaven.proto.backplane.grpc.SessionService/NewSession",
                                         request_serializer=session_pb2.HandshakeRequest.SerializeToString,
                                         response_deserializer=session_pb2.HandshakeResponse.FromString)
                    resp = new(session_pb2.HandshakeRequest(), metadata=(("authorization", "Anonymous"),), timeout=60)
                    token = resp.session_token.decode()
                    fetch = ch.unary_unary("/io.deephaven.proto.backplane.grpc.TableService/FetchTable",
                                           request_serializer=table_pb2.FetchTableRequest.SerializeToString,
                                           response_deserializer=table_pb2.ExportedTableCreationResponse.FromString)
                    req = table_pb2.FetchTableRequest(
                        source_id=table_pb2.TableReference(ticket=ticket_pb2.Ticket(ticket=b"s/ticking_keyed")),
                        result_id=ticket_pb2.Ticket(ticket=b"e\x01\x00\x00\x00"))
                    fetch(req, metadata=(("authorization", f"Bearer {token}"),), timeout=60)
                with self.lock:
                    self.counts["abandoned_sessions"] += 1
            except Exception as exc:  # noqa: BLE001
                self._error("abandoned", exc)
            self.stop.wait(5)

    # -- sampling --------------------------------------------------------------------------------
    def sample(self, t: float) -> None:
        pids = tree_pids(self.proc.pid)
        server = {**proc_stats(self.proc.pid), **anon_by_mapping(self.proc.pid)}
        rest = [proc_stats(p) for p in pids[1:]]
        with self.lock:
            lat, self.latencies = self.latencies, []
            counts = dict(self.counts)
        mem = self.scrape_memory()
        # resident memory outside glibc's heap: Python's arenas, Arrow's jemalloc, stacks, code
        mem["outside_heap_mb"] = server["rss_mb"] - mem["heap_in_use_mb"] - mem["heap_free_mb"]
        row = {"t": t, **server, **mem, "native_threads": native_thread_names(self.proc.pid),
               "children_rss_mb": sum(r["rss_mb"] for r in rest if r["rss_mb"] == r["rss_mb"]),
               "disk_mb": dir_bytes(self.data) / 2**20,
               "lat_p50_ms": float(np.percentile(lat, 50)) if lat else float("nan"),
               "lat_p99_ms": float(np.percentile(lat, 99)) if lat else float("nan"), "lat_n": len(lat), **counts}
        self.samples.append(row)
        print(f"{t / 60:6.1f} min  RSS {row['rss_mb']:7.1f} MB  fds {row['fds']:4d}  threads {row['threads']:3d}  "
              f"arrow {row['arrow_mb']:6.1f} MB  py blocks {row['py_blocks']:9.0f}  "
              f"C heap {row['heap_in_use_mb']:6.1f} used {row['heap_free_mb']:6.1f} free MB  "
              f"disk {row['disk_mb']:7.1f} MB  latency p50 {row['lat_p50_ms']:6.1f} p99 {row['lat_p99_ms']:6.1f} ms  "
              f"{counts}", flush=True)

    def scrape_memory(self) -> dict:
        """Arrow's, Python's and the C heap's share of the server's memory and its Python threads by
        name, from its /metrics."""
        out: dict = {"arrow_mb": float("nan"), "py_blocks": float("nan"), "heap_in_use_mb": float("nan"),
                     "heap_free_mb": float("nan"), "py_threads": {}}
        mb = {"tickwire_arrow_allocated_bytes": "arrow_mb", "tickwire_malloc_in_use_bytes": "heap_in_use_mb",
              "tickwire_malloc_free_bytes": "heap_free_mb"}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/metrics", timeout=30) as r:
                for line in r.read().decode().splitlines():
                    name, _, value = line.rpartition(" ")
                    if name in mb:
                        out[mb[name]] = float(value) / 2**20
                    elif name == "tickwire_python_allocated_blocks":
                        out["py_blocks"] = float(value)
                    elif name.startswith('tickwire_threads{name="'):
                        out["py_threads"][name[len('tickwire_threads{name="'):-2]] = int(float(value))
        except Exception as exc:  # noqa: BLE001
            self._error("metrics", exc)
        return out

    def check_converged(self) -> dict:
        """The churn stops; the reconnecting follower and a fresh snapshot must equal what was acknowledged."""
        time.sleep(3)
        from tickwire.clients.client import BarrageClient

        want = dict(self.acked)
        out = {}
        with BarrageClient(f"127.0.0.1:{self.port}") as c:
            snap = c.snapshot(self.churned)
        got = dict(zip(snap.column("Key").to_pylist(), snap.column("Value").to_pylist()))
        out["snapshot_equals_acknowledged"] = got == want
        out["acknowledged_keys"] = len(want)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            t = self.follower.table
            if dict(zip(t.column("Key").to_pylist(), t.column("Value").to_pylist())) == want:
                break
            time.sleep(0.5)
        t = self.follower.table
        held = dict(zip(t.column("Key").to_pylist(), t.column("Value").to_pylist()))
        out["follower_equals_acknowledged"] = held == want
        out["follower_reconnects"] = self.follower.reconnects
        return out

    def run(self) -> dict:
        self.start_server()
        drivers = {"churn": (self.churn, self.latency_follower), "followers": (self.followers,),
                   "browsers": (self.browsers,), "uploads": (self.uploads_and_operations,),
                   "abandoned": (self.abandoned_sessions,)}
        chosen = [d for d in drivers if d in self.args.drivers.split(",")]
        threads = [threading.Thread(target=f, daemon=True, name=f.__name__) for d in chosen for f in drivers[d]]
        for th in threads:
            th.start()
        t0 = time.monotonic()
        total = self.args.minutes * 60
        try:
            while True:
                left = t0 + total - time.monotonic()
                if left <= 0:
                    break
                time.sleep(min(self.args.sample, left))
                self.sample(time.monotonic() - t0)
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}")
            self.stop.set()
            for th in threads:
                if th.name != "latency_follower":
                    th.join(60)
            result = self.check_converged() if "churn" in chosen else {}
        finally:
            self.stop.set()
            self.stop_server()
        return self.report(result)

    def report(self, converged: dict) -> dict:
        s = self.samples
        # the slopes: over the last 40 minutes of a run that long, else over its last two thirds
        start = s[-1]["t"] - 40 * 60 if s and s[-1]["t"] > 45 * 60 else (s[-1]["t"] / 3 if s else 0)
        tail = [r for r in s if r["t"] >= start] if len(s) >= 6 else s
        ts = [r["t"] for r in tail]
        out: dict = {"minutes": self.args.minutes, "samples": len(s), "counts": dict(self.counts),
                     "errors": self.errors[:20], **converged}
        for key in ("rss_mb", "rss_anon_mb", "rss_file_mb", "fds", "threads", "arrow_mb", "py_blocks",
                    "heap_in_use_mb", "heap_free_mb", "outside_heap_mb", "anon_brk_mb", "anon_arenas_mb",
                    "anon_pyarenas_mb", "anon_other_mb"):
            slope, noise = slope_per_hour(ts, [r[key] for r in tail])
            out[f"{key}_slope_per_hour"] = slope
            out[f"{key}_noise"] = noise
        if s:  # which threads came or went between the first sample and the last, by name
            for key in ("native_threads", "py_threads"):
                a, b = s[0][key], s[-1][key]
                out[f"{key}_changed"] = {n: [a.get(n, 0), b.get(n, 0)] for n in sorted(set(a) | set(b))
                                         if a.get(n, 0) != b.get(n, 0)}
        out["disk_peak_mb"] = max((r["disk_mb"] for r in s), default=float("nan"))
        if s:  # what the churn driver achieved (keys deleted and as many inserted, a second)
            out["churn_keys_per_s"] = s[-1]["churn_keys"] / s[-1]["t"]
        first = [r["lat_p99_ms"] for r in s[:3] if r["lat_n"]]
        last = [r["lat_p99_ms"] for r in s[-3:] if r["lat_n"]]
        if first and last:
            out["latency_p99_end_over_start"] = statistics.median(last) / statistics.median(first)
        out["series"] = s
        print(json.dumps({k: v for k, v in out.items() if k != "series"}, indent=1, default=str))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--live", type=int, default=100_000, help="live keys of the churned table")
    ap.add_argument("--churn", type=int, default=10_000, help="keys replaced a second")
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--append-rows", type=int, default=20_000,
                    help="the demo's append tables keep their last N rows (`tickwire demo --append-rows`; full "
                    "within 7 minutes at the demo's 50 rows a second each), so that its live rows stop growing "
                    "and RSS can be flat; 0: every row, and RSS grows with them by design")
    ap.add_argument("--quick", action="store_true", help="5 minutes, 20 s samples, no Spark")
    ap.add_argument("--drivers", default="churn,followers,browsers,uploads,abandoned",
                    help="which kinds of load run (comma-separated; all by default): to find which one a "
                    "growth follows")
    ap.add_argument("--memtrace", help="the server writes a memory trace (JSON lines, one a sample) here: its "
                    "memory by holder (each table, publisher, the sessions, the web side) and, with "
                    "--memtrace-python, where Python allocated it")
    ap.add_argument("--memtrace-python", action="store_true",
                    help="the trace also runs tracemalloc, which slows the server: for finding a leak in "
                    "Python objects, not for the latency figures")
    ap.add_argument("--report", help="write the report (with every sample) as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.minutes, args.sample, args.no_spark = min(args.minutes, 5.0), min(args.sample, 20.0), True
    out = Soak(args).run()
    if args.report:
        Path(args.report).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
