"""Fan-out workers (tickwire.server.worker): a worker serves scope-table subscriptions from its own
replicas, checked by the engine process with the caller's credentials, and forwards every other
call, so that a client sees one server.

An engine process (a tickwire server on its own port) holds a keyed table; a worker (a tickwire
server with `worker_of` its target, its own engine of replicas) runs in the same test process.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Iterator

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tests.harness import QUOTES, quotes_server, until
from tickwire.clients.client import BarrageClient
from tickwire.protocol.opening import exchange_opening, subscription_request
from tickwire.protocol.proto import config_pb2, session_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE, FLIGHT_SERVICE, SESSION_SERVICE
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, EngineConfig
from tickwire.server.services.forward import FORWARDED_FOR, Forwarder, forwarded_peer

SCHEMA = QUOTES
EXCHANGE = f"/{FLIGHT_SERVICE}/DoExchange"


@pytest.fixture()
def main() -> Iterator[tuple[Engine, TickwireServer]]:
    with quotes_server() as (engine, srv):
        yield engine, srv


@pytest.fixture()
def worker(main) -> Iterator[TickwireServer]:
    # as `tickwire serve --worker-of` makes it: a cycle as each upstream update arrives
    w = TickwireServer(Engine(EngineConfig(interval_ms=60_000, cycle_on_write=True)), port=0,
                       worker_of=main[1].target).start()
    yield w
    w.stop()
    w.engine.stop()  # the server leaves its engine to whoever made it


def _rows(sub) -> dict[str, float]:
    t = sub.table
    return dict(zip(t.column("Sym").to_pylist(), t.column("Px").to_pylist()))


def test_a_scope_subscription_is_served_by_the_worker_from_its_replica(main, worker):
    engine, srv = main
    with BarrageClient(worker.target) as client:
        full = client.subscribe("quotes")
        view = client.subscribe("quotes", viewport=[(0, 1)])
        assert full.wait_for(lambda s: s.size == 3, 20)
        assert worker.router.counts == {"local": 2, "forwarded": 0}
        # the worker publishes both; the engine process has one subscriber: the worker's replica
        assert len(worker.registry.subscriptions) == 2
        assert len(srv.registry.subscriptions) == 1
        rng = np.random.default_rng(3)
        t = engine.resolve("quotes")
        for step in range(20):  # the engine's updates reach the worker's subscribers, every one
            syms = [f"S{int(i)}" for i in rng.integers(0, 8, 3)]
            engine.write(t, pa.table({"Sym": syms, "Px": rng.random(3).tolist()}, schema=SCHEMA))
            if step % 5 == 4:
                engine.write(t, delete=pa.table({"Sym": [syms[0]]}))
        engine.flush()
        with BarrageClient(srv.target) as direct:
            expected = direct.snapshot("quotes")
        want = dict(zip(expected.column("Sym").to_pylist(), expected.column("Px").to_pylist()))
        assert full.wait_for(lambda s: _rows(s) == want, 20)
        # the viewport: the first two rows in the engine's order
        assert view.wait_for(lambda s: s.table.num_rows == 2
                             and s.table.column("Sym").to_pylist() == expected.column("Sym").to_pylist()[:2], 20)


def test_every_other_call_is_forwarded_and_answered_by_the_engine_process(main, worker):
    pydeephaven = pytest.importorskip("pydeephaven")
    host, port = worker.target.rsplit(":", 1)
    s = pydeephaven.Session(host=host, port=int(port))
    try:
        assert sorted(s.open_table("quotes").to_arrow().column("Px").to_pylist()) == [1.0, 2.0, 3.0]
        assert s.empty_table(3).update(["X = i + 1"]).to_arrow().column("X").to_pylist() == [1, 2, 3]
        up = s.import_table(pa.table({"N": pa.array([4, 5], pa.int64())}))
        assert up.update(["M = N * 2"]).to_arrow().column("M").to_pylist() == [8, 10]
        # the session lives in the engine process, not in the worker
        assert main[1].sessions.count >= 1 and worker.sessions.count == 0
    finally:
        s.close()
    with BarrageClient(worker.target) as client:
        assert client.snapshot("quotes").num_rows == 3  # DoGet
        assert client.snapshot("quotes", viewport=[(0, 1)]).num_rows == 2  # a Barrage snapshot request
    assert worker.router.counts == {"local": 0, "forwarded": 1}


def _exchange_error(target: str, ticket: bytes, metadata=()) -> grpc.RpcError:
    hold = threading.Event()

    def requests():
        yield from exchange_opening(subscription_request(ticket))
        hold.wait(20)

    with grpc.insecure_channel(target) as ch:
        call = ch.stream_stream(EXCHANGE)(requests(), metadata=metadata, timeout=20)
        with pytest.raises(grpc.RpcError) as err:
            for _ in call:
                pass
    hold.set()
    return err.value


@pytest.mark.parametrize("ticket, metadata", [(b"s/quotes", ()), (b"s/nope", (("authorization", "Anonymous"),))],
                         ids=["no credentials", "no such table"])
def test_a_refused_subscription_is_refused_in_the_engine_process_words(main, worker, ticket, metadata):
    direct = _exchange_error(main[1].target, ticket, metadata)
    through = _exchange_error(worker.target, ticket, metadata)
    assert direct.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND)
    assert (through.code(), through.details()) == (direct.code(), direct.details())
    assert worker.router.counts["local"] == 0
    assert not worker.router.replicas  # nothing replicated for a call the engine refused


def test_a_worker_subscriber_that_leaves_is_released_by_the_worker(main, worker):
    with BarrageClient(worker.target) as client:
        sub = client.subscribe("quotes")
        assert sub.wait_for(lambda s: s.size == 3, 20)
        assert len(worker.registry.subscriptions) == 1
        sub.close()
        assert until(lambda: len(worker.registry.subscriptions) == 0, 20)
    # the replica stays for the next subscriber
    assert len(main[1].registry.subscriptions) == 1


def test_a_worker_subscription_stops_when_the_caller_s_session_ends(main, worker):
    """The caller's session lives in the engine process; when it is closed there, the worker stops
    the subscriptions it serves for it, as one process does (nothing more is sent; the call ends
    with OK when the client half-closes), and the subscriptions of other sessions go on."""
    with BarrageClient(worker.target) as a, BarrageClient(worker.target) as b:
        sa, sb = a.subscribe("quotes"), b.subscribe("quotes")
        assert sa.wait_for(lambda s: s.size == 3, 20) and sb.wait_for(lambda s: s.size == 3, 20)
        assert worker.router.counts["local"] == 2 and len(worker.registry.subscriptions) == 2
        with grpc.insecure_channel(worker.target) as ch:  # CloseSession, forwarded to the engine process
            ch.unary_unary(f"/{SESSION_SERVICE}/CloseSession")(
                session_pb2.HandshakeRequest().SerializeToString(), metadata=a.auth.metadata(), timeout=20)
        assert until(lambda: len(worker.registry.subscriptions) == 1, 20)
        engine = main[0]
        engine.write(engine.resolve("quotes"), pa.table({"Sym": ["S1"], "Px": [42.0]}, schema=SCHEMA))
        assert sb.wait_for(lambda s: _rows(s).get("S1") == 42.0, 20)
        assert _rows(sa).get("S1") != 42.0 and not sa.closed and not sb.closed
        sa.close()  # the client half-closes: OK
        assert until(lambda: sa.closed, 20) and sa.error is None


FORGED = "ipv4:203.0.113.7:4242"


def _session_peers(srv: TickwireServer, target: str, metadata=(), clients: int = 1) -> list[str]:
    """The peers the engine process `srv` recorded for sessions opened by calls to `target` from
    `clients` connections open at once (grpcio's channels share connections unless told not to)."""
    channels = [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(clients)]
    try:
        tokens = []
        for ch in channels:
            _r, call = ch.unary_unary(f"/{CONFIG_SERVICE}/GetConfigurationConstants").with_call(
                config_pb2.ConfigurationConstantsRequest().SerializeToString(),
                metadata=(("authorization", "Anonymous"),) + tuple(metadata), timeout=20)
            tokens.append(dict(call.initial_metadata())["authorization"].removeprefix("Bearer "))
    finally:
        for ch in channels:
            ch.close()
    peers = {s.token: s.peer for s in srv.sessions.live()}
    return [peers[t] for t in tokens]


def test_the_engine_process_names_the_client_a_worker_forwards_for():
    """A worker names the client of each call it forwards under the key it shares with the
    engine process, which records that client (in its sessions and logs) instead of the worker;
    the header is believed only under the key, and a client's own is never passed on."""
    with quotes_server(forward_key="k1") as (_engine, srv):
        # straight to the engine process: believed under the key only
        assert _session_peers(srv, srv.target, [(FORWARDED_FOR, f"k1 {FORGED}")]) == [FORGED]
        (direct,) = _session_peers(srv, srv.target, [(FORWARDED_FOR, f"k2 {FORGED}")])
        assert direct != FORGED and direct.startswith("ipv4:127.0.0.1:")
        for key in ("k1", None):  # a worker with the key, and one without
            w = TickwireServer(Engine(EngineConfig(interval_ms=60_000, cycle_on_write=True)), port=0,
                               worker_of=srv.target, forward_key=key).start()
            try:
                # the client's own header is dropped; the worker names the client itself: two
                # clients (two connections to the worker) are two peers, where without the key
                # both are the worker's one connection to the engine process
                peers = set(_session_peers(srv, w.target, [(FORWARDED_FOR, f"k1 {FORGED}")], clients=2))
                assert FORGED not in peers and all(p.startswith("ipv4:127.0.0.1:") for p in peers)
                assert len(peers) == (2 if key else 1), peers
            finally:
                w.stop()
                w.engine.stop()


def test_a_forwarder_names_each_call_s_client_under_its_key():
    class Context:
        def invocation_metadata(self):
            return (("authorization", "Bearer t"), (FORWARDED_FOR, f"k1 {FORGED}"), ("user-agent", "grpc"))

        def peer(self):
            return "ipv4:10.1.2.3:9"

    assert Forwarder("x:1", forwarded_key="k1").call_metadata(Context()) == [
        ("authorization", "Bearer t"), (FORWARDED_FOR, "k1 ipv4:10.1.2.3:9")]
    assert Forwarder("x:1").call_metadata(Context()) == [("authorization", "Bearer t")]
    assert forwarded_peer([(FORWARDED_FOR, "k1 ipv4:10.1.2.3:9")], "k1") == "ipv4:10.1.2.3:9"
    assert forwarded_peer([(FORWARDED_FOR, "k1 ipv4:10.1.2.3:9")], "k2") is None
    assert forwarded_peer([(FORWARDED_FOR, "k1 ipv4:10.1.2.3:9")], None) is None
    assert forwarded_peer([(FORWARDED_FOR, "k1")], "k1") is None


def _workers_of(port: int) -> list[int]:
    """Pids of the processes running `tickwire serve --worker-of ... --port PORT`."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"--worker-of" in argv and str(port).encode() in argv:
                out.append(int(d))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT and /proc: Linux")
def test_serve_with_fanout_workers_shares_the_port_and_ends_with_its_workers():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tickwire", "serve", "--fanout-workers", "2", "--port", str(port),
                             "--no-web", "--interval-ms", "20", "--duration", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "fan-out workers share port" in line:
                break
        assert f"2 fan-out workers share port {port}" in lines[-1], "".join(lines)
        assert len(_workers_of(port)) == 2
        # a write through the public port reaches the engine process; subscriptions over several
        # connections (the kernel spreads them over the workers) all see it
        c = flight.FlightClient(f"grpc://127.0.0.1:{port}")
        opts = flight.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
        data = pa.table({"a": pa.array([1, 2, 3], pa.int64())})
        writer, _ = c.do_put(flight.FlightDescriptor.for_path("scope", "t"), data.schema, opts)
        writer.write_table(data)
        writer.close()
        clients = [BarrageClient(f"127.0.0.1:{port}") for _ in range(6)]
        try:
            subs = [cl.subscribe("t") for cl in clients]
            assert all(s.wait_for(lambda s: s.size == 3, 30) for s in subs)
            assert all(sorted(s.table.column("a").to_pylist()) == [1, 2, 3] for s in subs)
        finally:
            for cl in clients:
                cl.close()
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert until(lambda: not _workers_of(port), 20)


def test_deephaven_clients_subscribing_to_a_fetched_table_are_served_by_the_worker(main, worker):
    """pydeephaven-ticking subscribes to the export `open_table` made (FetchTable: the scope table
    itself, as the engine's GetSchema says): served from the worker's replica. An export the
    engine derived (a sort) is the engine's to serve: forwarded."""
    pydeephaven = pytest.importorskip("pydeephaven")
    ticking = pytest.importorskip("pydeephaven_ticking.table_listener")
    engine, srv = main
    host, port = worker.target.rsplit(":", 1)
    s = pydeephaven.Session(host=host, port=int(port))
    seen: dict[str, list] = {"fetched": [], "sorted": []}
    handles = []
    try:
        def keep(into: list):
            return lambda update: into.extend(update.added().get("Sym", pa.array([])).to_pylist())

        for kind, table in (("fetched", s.open_table("quotes")), ("sorted", s.open_table("quotes").sort(["Px"]))):
            h = ticking.listen(table, keep(seen[kind]))
            h.start()
            handles.append(h)
        assert until(lambda: len(seen["fetched"]) == 3 and len(seen["sorted"]) == 3, 20)
        assert worker.router.counts == {"local": 1, "forwarded": 1}
        assert list(worker.router.replicas) == ["quotes"]
        t = engine.resolve("quotes")
        engine.write(t, pa.table({"Sym": ["D"], "Px": [4.0]}, schema=SCHEMA))
        assert until(lambda: "D" in seen["fetched"] and "D" in seen["sorted"], 20)
    finally:
        for h in handles:
            h.stop()
        s.close()


def test_a_replica_nobody_uses_is_dropped_and_made_again_when_needed(main):
    """Memory follows what is subscribed: a replica without calls for a minute (the worker
    engine's clock) is stopped and its table dropped; the next subscription makes a new one."""
    from tickwire.clock import ManualClock

    engine, srv = main
    clock = ManualClock()
    w = TickwireServer(Engine(EngineConfig(interval_ms=60_000, cycle_on_write=True), clock=clock), port=0,
                       worker_of=srv.target).start()
    try:
        with BarrageClient(w.target) as client:
            sub = client.subscribe("quotes")
            assert sub.wait_for(lambda s: s.size == 3, 20)
            sub.close()
            assert until(lambda: len(w.registry.subscriptions) == 0 and not w.router.in_use(), 20)
        assert list(w.router.replicas) == ["quotes"] and len(srv.registry.subscriptions) == 1
        clock.advance(30)  # not long enough
        clock.advance(10)
        assert list(w.router.replicas) == ["quotes"]
        clock.advance(31)
        assert until(lambda: not w.router.replicas and w.engine.resolve("quotes") is None, 20)
        assert until(lambda: len(srv.registry.subscriptions) == 0, 20)  # the worker's upstream subscription ended
        with BarrageClient(w.target) as client:
            sub = client.subscribe("quotes")
            assert sub.wait_for(lambda s: s.size == 3, 20)
            assert list(w.router.replicas) == ["quotes"] and w.router.counts["local"] == 2
    finally:
        w.stop()
        w.engine.stop()


def test_a_large_subscription_request_is_served_by_the_worker_too(main, worker):
    """A request over `inline_request_bytes` (a viewport of 1,001 scattered ranges) is parsed off
    the event loop, and served from the replica like any other."""
    ranges = [(0, 0)] + [(2 + i * 1_000_003, 2 + i * 1_000_003) for i in range(1000)]  # rows 0 and 2 of three
    request = exchange_opening(subscription_request(b"s/quotes", viewport=np.array(ranges)))[-1]
    assert len(request) > worker.config.inline_request_bytes
    with BarrageClient(worker.target) as client:
        sub = client.subscribe("quotes", viewport=ranges)
        assert sub.wait_for(lambda s: s.table.num_rows == 2, 20)
        assert worker.router.counts == {"local": 1, "forwarded": 0}
