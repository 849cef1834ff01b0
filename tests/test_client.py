"""tickwire's Barrage client against tickwire's services stepped by the test.

Snapshots, subscriptions, view changes and errors go through the services in process
(tests.harness.Services); what depends on the real transport stays on sockets: the pre-shared key
in grpcio's headers, grpc:// URLs, and a connection lost or a server restarted on its port (the
reconnection's difference is in tests/test_client_reconnect.py, in process)."""
from __future__ import annotations

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tests.harness import Services, until
from tickwire.clients.client import BarrageClient, ClientError
from tickwire.protocol.rowset import keys_to_ranges
from tickwire.server.adapters.demo import DemoTicker, static_mixed
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec


@pytest.fixture()
def served():
    with Services() as s:
        ticker = DemoTicker(s.engine, rows_per_tick=9, seed=3)
        for _ in range(4):
            ticker.tick()
            s.cycle()
        yield s, ticker


def plain(t: pa.Table) -> pa.Table:
    return pa.table({f.name: t.column(i) for i, f in enumerate(t.schema)})


def test_snapshots_whole_and_partial(served):
    s, _ = served
    c = s.client()
    assert {"static_mixed", "ticking_keyed", "blink"} <= set(c.tables())
    assert plain(c.snapshot("static_mixed")).equals(static_mixed())
    part = c.snapshot("static_mixed", columns=["Str", "I32"], viewport=[(2, 4), (10, 10)])
    assert part.column_names == ["Str", "I32"]
    assert part.to_pydict() == static_mixed().take([2, 3, 4, 10]).select(["Str", "I32"]).to_pydict()
    tail = c.snapshot("ticking_append", viewport=[(0, 2)], reverse=True)
    assert tail.column("Seq").to_pylist() == [33, 34, 35]
    with pytest.raises(ClientError) as e:
        c.snapshot("nope")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_full_subscription_follows_every_step_with_callbacks(served):
    s, ticker = served
    c = s.client()
    seen = []
    sub = c.subscribe("ticking_keyed", on_update=seen.append)
    assert s.wait_for(sub, lambda x: x.update_count >= 1)
    for step in range(5):
        ticker.tick()
        s.cycle()
        _s, expected = s.engine.snapshot(ticker.keyed)
        assert s.wait_for(sub, lambda x: x.last_seq == s.engine.step), f"step {step}"
        assert plain(sub.table).equals(expected)
    assert seen[0].is_snapshot and not seen[-1].is_snapshot
    assert len(seen) == 6  # the snapshot, then one update a step
    last = seen[-1]
    assert last.last_seq == s.engine.step and last.table_size == 20
    assert set(last.modified_columns) <= {"Timestamp", "Price", "Size", "Seq"}
    assert all(len(v) == int((r[:, 1] - r[:, 0] + 1).sum()) for v, r in
               zip(last.modified.values(), last.modified_rows.values()))
    sub.close()
    assert sub.closed


def test_viewport_subscription_reverse_columns_and_view_changes(served):
    s, ticker = served
    c = s.client()
    sub = c.subscribe("ticking_append", viewport=[(0, 4)], reverse=True, columns=["Seq", "Sym"])
    it = sub.updates(timeout=30)  # the bound only stops a hang
    first = next(it)
    assert first.is_snapshot and sub.table.column_names == ["Seq", "Sym"]
    ticker.tick()
    s.cycle()
    u = next(it)
    n = ticker.append.size
    assert u.table_size == n == sub.size
    assert sub.table.column("Seq").to_pylist() == list(range(n - 5, n))
    assert u.removed.num_rows == 5 and u.added.num_rows == 5  # the window slid by a whole tick
    sub.set_view(viewport=[(0, 1), (10, 11)], reverse=False)
    u = next(it)
    assert u.is_snapshot
    assert sub.table.column("Seq").to_pylist() == [0, 1, 10, 11]
    with pytest.raises(ClientError, match="full subscription"):
        c.subscribe("blink").set_view(viewport=[(0, 1)])


def test_updates_called_late_starts_with_the_state_then_and_misses_nothing(served):
    s, ticker = served
    c = s.client()
    sub = c.subscribe("ticking_keyed", columns=["Sym", "Seq"])
    assert s.wait_for(sub, lambda x: x.update_count >= 1)
    ticker.tick()
    s.cycle()
    assert s.wait_for(sub, lambda x: x.last_seq == s.engine.step)  # two updates before the call
    it = sub.updates(timeout=30)
    first = next(it)
    assert first.is_snapshot and first.last_seq == s.engine.step and first.removed.num_rows == 0
    assert first.added.equals(sub.table) and first.table_size == sub.size
    assert np.array_equal(first.added_rows, keys_to_ranges(sub.state.keys))
    held = {r["Sym"]: r["Seq"] for r in first.added.to_pylist()}
    for _ in range(3):
        ticker.tick()
        s.cycle()
        u = next(it)
        assert not u.is_snapshot and u.last_seq == s.engine.step  # each later step, none twice
        for r in u.removed.to_pylist():
            del held[r["Sym"]]
        for r in u.added.to_pylist():
            held[r["Sym"]] = r["Seq"]
        for col, rows in u.modified_rows.items():
            if col == "Seq":
                pos = np.searchsorted(sub.state.keys, np.concatenate([np.arange(a, b + 1) for a, b in rows]))
                syms = sub.table.column("Sym").take(pa.array(pos)).to_pylist()
                held.update(zip(syms, u.modified["Seq"].to_pylist()))
    assert held == {r["Sym"]: r["Seq"] for r in sub.table.to_pylist()}
    sub.close()
    late = c.subscribe("ticking_keyed")
    assert s.wait_for(late, lambda x: x.update_count >= 1)
    late.close()
    assert list(late.updates(timeout=1)) == []  # an ended subscription's iterator is empty


def test_errors_reach_the_subscriber(served):
    s, _ticker = served
    c = s.client()
    sub = c.subscribe("missing_table")
    assert until(lambda: sub.closed)  # the server's answer ends it
    assert not sub.wait_for(lambda x: True, 5)  # no data ever came
    assert sub.error is not None and sub.error.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ClientError, match="no columns"):
        c.subscribe("blink", columns=["Nope"])


def test_psk_authentication():
    """On a socket: the key as grpcio carries it in the headers."""
    engine = Engine(interval_ms=3_600_000)
    engine.create(TableSpec("t", "static", data=pa.table({"x": np.arange(5)})))
    srv = TickwireServer(engine, port=0, psk="k1", start_engine=False).start()
    try:
        with BarrageClient(srv.target, psk="k1") as c:
            assert c.snapshot("t").column("x").to_pylist() == [0, 1, 2, 3, 4]
        with pytest.raises(ClientError) as e:
            BarrageClient(srv.target, psk="wrong")
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        srv.stop()


def test_targets_may_be_pyarrow_style_urls():
    from tickwire.clients.client import ClientError, parse_target

    assert parse_target("localhost:10000") == ("localhost:10000", False)
    assert parse_target("grpc://localhost:10000") == ("localhost:10000", False)
    assert parse_target("grpc+tcp://h:1/") == ("h:1", False)
    assert parse_target("grpc+tls://h:443") == ("h:443", True)
    for bad in ("http://h:1", "grpc://", "grpc://h:1/path"):
        with pytest.raises(ClientError):
            parse_target(bad)


def test_a_grpc_url_connects(served_for_url):
    from tickwire.clients.client import BarrageClient

    with BarrageClient(f"grpc://{served_for_url.target}") as client:
        assert client.snapshot("url_t").column("a").to_pylist() == [1, 2, 3]


@pytest.fixture()
def served_for_url():
    import pyarrow as pa

    from tickwire import TickwireServer

    engine = Engine(interval_ms=50)
    engine.create(TableSpec("url_t", "static", data=pa.table({"a": [1, 2, 3]})))
    srv = TickwireServer(engine, port=0, start_engine=False).start()
    yield srv
    srv.stop()


def test_a_reconnecting_subscription_follows_the_table_across_a_server_restart():
    """On a socket: the server stops (grpcio's UNAVAILABLE) and starts again on its port."""
    from tests.serving import start_again
    from tickwire import TickwireServer
    from tickwire.clients.client import BarrageClient

    engine = Engine(interval_ms=20).start()
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    table = engine.create(TableSpec("kv", "keyed", schema, keys=["k"]))
    engine.write(table, pa.table({"k": np.arange(50), "v": np.zeros(50, np.int64)}, schema=schema))
    srv = TickwireServer(engine, port=0).start()
    port = srv.port  # the restart listens on it again
    states: list[str] = []
    client = BarrageClient(f"grpc://127.0.0.1:{port}")

    def same(sub) -> bool:
        try:
            got = sub.table.sort_by("k")
        except Exception:  # noqa: BLE001 - no data yet
            return False
        return got.equals(engine.snapshot(table)[1].sort_by("k"))

    try:
        sub = client.subscribe("kv", reconnect=True, on_connection=states.append, backoff=(0.05, 0.5))
        assert sub.wait_for(same, 20)
        srv.stop()
        assert until(lambda: any(s.startswith("disconnected") for s in states)), states
        engine.write(table, pa.table({"k": np.arange(25, 75), "v": np.full(50, 7, np.int64)}, schema=schema))
        # the client tries again while the server is down, and fails (it says so before each try)
        tried = len(states)
        assert until(lambda: "reconnecting" in states[tried:] and states[-1].startswith("disconnected")), states
        srv = start_again(lambda: TickwireServer(engine, port=port).start())
        assert sub.wait_for(same, 30), (states, sub.error)
        # counted and reported once the new stream is open, which may be after its reader delivered
        assert until(lambda: sub.reconnects >= 1 and states[-1] == "connected"), (sub.reconnects, states)
        assert not sub.closed
        engine.write(table, pa.table({"k": [1], "v": [99]}, schema=schema))  # and it keeps following
        assert sub.wait_for(same, 20)
    finally:
        client.close()
        srv.stop()
        engine.stop()


def test_without_reconnect_a_lost_connection_ends_the_subscription():
    """On a socket: the connection is lost when the server stops."""
    from tickwire import TickwireServer
    from tickwire.clients.client import BarrageClient

    engine = Engine(interval_ms=20).start()
    engine.create(TableSpec("t", "static", data=pa.table({"a": np.arange(10)})))
    srv = TickwireServer(engine, port=0).start()
    client = BarrageClient(srv.target)
    try:
        sub = client.subscribe("t")
        assert sub.wait_for(lambda s: s.table.num_rows == 10, 20)
        srv.stop()
        assert sub.wait_for(lambda s: s.closed, 20) and sub.error is not None
    finally:
        client.close()
        engine.stop()
