"""Replication: tickwire tables that follow another Barrage server's tables.

Upstream tables get random traffic (removes, shifts, adds, modifies); a replica follows over
Barrage, and a second replica follows the first (a chain). After the traffic settles every
table in the chain equals the origin: same rows, same row keys, same values. Killing the upstream
mid-stream leaves the replica serving its last state; when the upstream comes back, the replica
resynchronises to it."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from tests.scripted import random_update, scripted_table
from tests.serving import start_again
from tests.waiting import wait_until
from tickwire.clients.client import BarrageClient
from tickwire.server.adapters.replica import ReplicaTable, Replicator, parse_replicate
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec


def _state(engine, table) -> tuple[np.ndarray, pa.Table]:
    """(row keys, rows) of a table of `engine`, at one cycle boundary."""
    with engine.reading():
        keys = table.rowset.keys()
        return keys, table.gather(None, keys)


def _same(engine_a, a, engine_b, b) -> bool:
    ka, va = _state(engine_a, a)
    kb, vb = _state(engine_b, b)
    return ka.size == kb.size and bool(np.array_equal(ka, kb)) and va.equals(vb)


@pytest.fixture
def origin():
    engine = Engine(interval_ms=20)
    table = scripted_table(engine, "src")
    server = TickwireServer(engine, port=0).start()
    yield engine, table, server
    server.stop()
    engine.stop()


def _traffic(engine, table, rng, keys, steps: int, *, pause: float = 0.0):
    for _ in range(steps):
        upd, vals, keys = random_update(rng, keys, max_add=40)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        if pause:
            time.sleep(pause)
    return keys


def test_parse_replicate():
    assert parse_replicate("h:1/a, h2:2/b") == [("h:1", "a", "a"), ("h2:2", "b", "b")]
    both = parse_replicate("a:1/trades=trades_a,b:2/trades = trades_b")
    assert both == [("a:1", "trades", "trades_a"), ("b:2", "trades", "trades_b")]
    assert [str(u) for u in both] == ["a:1/trades=trades_a", "b:2/trades=trades_b"]
    assert parse_replicate(",".join(map(str, both))) == both  # what the CLI hands the server reads back
    for bad in ("h:1", "/t", "nohost/t", "h:1/t=", "h:1/=x"):
        with pytest.raises(ValueError, match="HOST:PORT/TABLE"):
            parse_replicate(bad)
    with pytest.raises(ValueError, match="names no table"):
        parse_replicate(" , ")
    for clash in ("a:1/trades,b:2/trades", "a:1/x=t,b:2/t", "a:1/t=u,b:2/v=u"):
        with pytest.raises(ValueError, match="would both be served as"):
            parse_replicate(clash)


def test_a_replica_follows_two_upstream_tables_of_one_name_under_local_names():
    ups = []
    try:
        for seed in (5, 6):
            engine = Engine(interval_ms=20)
            table = scripted_table(engine, "trades")
            ups.append((engine, table, TickwireServer(engine, port=0).start(), np.random.default_rng(seed)))
        keys = [_traffic(e, t, rng, np.empty(0, dtype=np.int64), 5) for e, t, _s, rng in ups]
        (ea, ta, sa, ra), (eb, tb, sb, rb) = ups
        with pytest.raises(ValueError, match="would both be served as 'trades'"):
            TickwireServer(port=0, replicate=(f"{sa.target}/trades", f"{sb.target}/trades"))
        local = TickwireServer(port=0, replicate=(f"{sa.target}/trades=trades_a", f"{sb.target}/trades=trades_b"))
        local.start()
        try:
            assert wait_until(lambda: len(local.replicas) == 2 and all(r.table is not None for r in local.replicas), 20)
            rep_a, rep_b = local.replicas
            le = local.engine
            for round_ in range(3):
                keys = [_traffic(ea, ta, ra, keys[0], 8, pause=0.002), _traffic(eb, tb, rb, keys[1], 8, pause=0.002)]
                assert wait_until(lambda: _same(ea, ta, le, rep_a.table) and _same(eb, tb, le, rep_b.table), 20), \
                    f"round {round_}: the two local tables did not each converge to their upstream"
            assert not _same(ea, ta, le, rep_b.table)  # two tables, not one fed twice
            assert {"trades_a", "trades_b"} <= set(BarrageClient(local.target).tables())
            assert le.resolve("trades") is None
            # the same refusals from Python
            with pytest.raises(ValueError, match=r"already replicated as 'trades_a'.*another local name"):
                local.replicate(sb.target, "trades", local_name="trades_a")
            le.create(TableSpec("mine", "append", pa.schema([("x", pa.int64())])))
            with pytest.raises(ValueError, match="'mine' that is not a replica exists"):
                local.replicate(sb.target, "trades", local_name="mine")
            assert len(local.replicas) == 2  # nothing refused was started
            rep_a.stop()  # a stopped replica's name is free again
            again = local.replicate(sb.target, "trades", local_name="trades_a")
            assert wait_until(lambda: _same(eb, tb, le, again.table), 20)
        finally:
            local.stop()
    finally:
        for e, _t, srv, _r in ups:
            srv.stop()
            e.stop()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_chain_of_two_replicas_converges_to_the_origin(origin, seed):
    engine, src, server = origin
    rng = np.random.default_rng(seed)
    keys = _traffic(engine, src, rng, np.empty(0, dtype=np.int64), 5)
    engine1 = Engine(interval_ms=10).start()
    r1 = Replicator(engine1, server.target, "src").start()
    s1 = TickwireServer(engine1, port=0).start()
    engine2 = Engine(interval_ms=10).start()
    r2 = Replicator(engine2, s1.target, "src", local_name="copy").start()
    try:
        for round_ in range(6):
            keys = _traffic(engine, src, rng, keys, 15, pause=0.002)
            assert wait_until(lambda: _same(engine, src, engine1, r1.table) and _same(engine, src, engine2, r2.table),
                              20), f"replay: seed {seed} round {round_}: the chain did not converge"
        assert isinstance(engine2.resolve("copy"), ReplicaTable) and r1.status == r2.status == "connected"
        # the chain's own subscribers see the same table
        with BarrageClient(s1.target) as c:
            assert c.snapshot("src").equals(_state(engine, src)[1])
    finally:
        r2.stop(), s1.stop(), r1.stop(), engine1.stop(), engine2.stop()


def test_replica_survives_the_upstream_going_away_and_resynchronises():
    engine = Engine(interval_ms=20)
    src = scripted_table(engine, "src")
    rng = np.random.default_rng(9)
    keys = _traffic(engine, src, rng, np.empty(0, dtype=np.int64), 10)
    upstream = TickwireServer(engine, port=0).start()
    port = upstream.port  # it comes back on the same port
    local = Engine(interval_ms=10).start()
    rep = Replicator(local, f"127.0.0.1:{port}", "src", backoff=(0.05, 0.5)).start()
    try:
        keys = _traffic(engine, src, rng, keys, 10, pause=0.002)
        assert wait_until(lambda: _same(engine, src, local, rep.table), 20)
        upstream.stop()  # the upstream dies mid-stream ...
        assert wait_until(lambda: rep.status.startswith("disconnected"), 10)
        held = _state(local, rep.table)
        keys = _traffic(engine, src, rng, keys, 25)  # ... and changes while it is away
        time.sleep(0.3)
        now = _state(local, rep.table)  # the replica keeps serving its last consistent state
        assert np.array_equal(now[0], held[0]) and now[1].equals(held[1])
        syncs = rep.syncs
        upstream = start_again(lambda: TickwireServer(engine, port=port).start())
        assert wait_until(lambda: rep.syncs > syncs and _same(engine, src, local, rep.table), 20), \
            "the replica did not resynchronise after the upstream came back"
        keys = _traffic(engine, src, rng, keys, 10, pause=0.002)
        assert wait_until(lambda: _same(engine, src, local, rep.table), 20)
        assert rep.failures >= 1 and rep.status == "connected"
    finally:
        rep.stop()
        upstream.stop()
        local.stop()
        engine.stop()


def test_resynchronising_emits_only_the_net_difference():
    """After a reconnection to an upstream whose table changed, the replica's update holds just
    the rows that went, came, or changed value."""
    engine = Engine(interval_ms=20)
    schema = pa.schema([("k", pa.int64()), ("v", pa.string())])
    src = engine.create(TableSpec("kv", "keyed", schema, keys=["k"]))
    engine.write(src, pa.table({"k": np.arange(100), "v": [f"a{i}" for i in range(100)]}, schema=schema), wait=False)
    engine.run_cycle()
    upstream = TickwireServer(engine, port=0).start()
    port = upstream.port  # it comes back on the same port
    local = Engine(interval_ms=10).start()
    rep = Replicator(local, f"127.0.0.1:{port}", "kv", backoff=(0.05, 0.5)).start()
    seen = []
    try:
        assert wait_until(lambda: _same(engine, src, local, rep.table), 20)
        rep.table.add_listener(lambda t, u, step: seen.append(u))
        upstream.stop()
        assert wait_until(lambda: rep.status.startswith("disconnected"), 10)
        engine.write(src, pa.table({"k": [7, 200], "v": ["changed", "new"]}, schema=schema),
                     delete=pa.table({"k": [3, 4]}))  # one cycle applies both
        upstream = start_again(lambda: TickwireServer(engine, port=port).start())
        assert wait_until(lambda: _same(engine, src, local, rep.table), 20)
        time.sleep(0.1)
        assert len(seen) == 1
        u = seen[0]
        assert u.removed.keys().tolist() == [3, 4]
        assert len(u.added) == 1 and len(u.modified) == 1
        assert list(u.modified_columns) == ["v"]
    finally:
        rep.stop()
        upstream.stop()
        local.stop()
        engine.stop()


def test_stop_waits_for_a_sync_in_progress_then_marks_the_table_stopped_and_frees_its_name(origin, monkeypatch):
    engine, table, server = origin
    _traffic(engine, table, np.random.default_rng(9), np.empty(0, dtype=np.int64), 3)
    local = Engine(interval_ms=20)
    local.start()
    inside, go_on = threading.Event(), threading.Event()
    real_write = local.write

    def slow_write(t, data, **kw):  # the replicator's snapshot write, held until the test lets it go
        if isinstance(data, tuple) and data and data[0] == "sync":
            inside.set()
            go_on.wait(30)
        return real_write(t, data, **kw)

    monkeypatch.setattr(local, "write", slow_write)
    rep = Replicator(local, server.target, "src", local_name="copy").start(wait=False)
    try:
        assert inside.wait(30)  # the replicator is writing its first snapshot

        stopped = threading.Event()
        stopper = threading.Thread(target=lambda: (rep.stop(), stopped.set()))
        stopper.start()
        assert wait_until(rep._stop.is_set, 30)  # stop() has begun
        assert not stopped.is_set()  # and waits for the write in progress (held until go_on)
        with pytest.raises(ValueError, match="already replicated as 'copy'"):
            Replicator(local, server.target, "src", local_name="copy").start(wait=False)
        go_on.set()
        stopper.join(30)
        assert stopped.is_set()
        assert rep.table.status == "stopped"  # not "connected": the sync ended before stop() marked it
        again = Replicator(local, server.target, "src", local_name="copy").start(wait=False)  # the name is free
        again.stop()
    finally:
        go_on.set()
        rep.stop()
        local.stop()
