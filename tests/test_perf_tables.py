"""The performance tables (tickwire.server.engine.perf_tables) read as any client reads
tables: tickwire's own client subscribes to them and DoGets them while a ticking table is
subscribed and read, and their rows are checked against what was written and read. They are not
listed unless the server is started with show_system_tables, and an idle server's performance
tables stay still however many cycles run."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from tests import waiting
from tickwire.clients.client import BarrageClient
from tickwire.clock import ManualClock
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, EngineConfig, TableSpec
from tickwire.server.engine.perf_tables import (
    BARRAGE_PERFORMANCE,
    BARRAGE_SCHEMA,
    NAMES,
    SNAPSHOT_PERFORMANCE,
    SNAPSHOT_SCHEMA,
    UPDATE_PERFORMANCE,
    UPDATE_SCHEMA,
    PerfTablesConfig,
)

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("sym", pa.string())])
ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")], timeout=30)
PERF = PerfTablesConfig(capacity=2_000, barrage_interval_s=0.1, flush_interval_s=0.05)


def batch(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 0.5, "sym": [f"s{i % 7}" for i in ids]}, schema=SCHEMA)


def wait_until(predicate, timeout: float = 15.0) -> bool:
    return waiting.wait_until(predicate, timeout)


def of_table(t: pa.Table, name: str) -> pa.Table:
    return t.filter(pc.equal(t["TableName"], name))


def serve(clock=None, **kwargs) -> tuple[Engine, TickwireServer]:
    """An engine with the performance tables of PERF, served; with a `clock` (a ManualClock) the
    engine's cycles are the test's to run (`engine.run_cycle()`), else they run every 20 ms."""
    engine = Engine(EngineConfig(interval_ms=20, perf_tables=PERF), clock=clock)
    srv = TickwireServer(engine, port=0, web=False, start_engine=clock is None, **kwargs).start()
    return engine, srv


def list_tables(target: str) -> list[dict]:
    client = fl.FlightClient(f"grpc://{target}")
    try:
        (result,) = list(client.do_action(fl.Action("list-tables", b""), ANON))
        return json.loads(result.body.to_pybytes())
    finally:
        client.close()


def test_clients_subscribe_to_and_read_the_performance_tables():
    engine, srv = serve()
    ticks, _ = engine.get_or_create(TableSpec("ticks", "append", SCHEMA))
    client = BarrageClient(srv.target)
    try:
        # the performance tables, subscribed before the traffic they describe
        upl = client.subscribe(UPDATE_PERFORMANCE)
        bpl = client.subscribe(BARRAGE_PERFORMANCE)
        assert upl.wait_for(lambda s: s.table.schema.names == UPDATE_SCHEMA.names, 15)
        sub = client.subscribe("ticks")
        assert sub.wait_for(lambda s: s.table.num_rows == 0, 15)
        sizes = [50, 120, 7, 300, 23]
        start = 0
        for n in sizes:
            engine.write(ticks, batch(start, n))
            start += n
        total = sum(sizes)
        assert sub.wait_for(lambda s: s.size == total, 15)

        # one row per cycle in which "ticks" changed: its rows added add up to what was written
        def ticks_rows():
            return of_table(upl.table, "ticks")
        assert upl.wait_for(lambda s: pc.sum(of_table(s.table, "ticks")["RowsAdded"]).as_py() == total, 15), \
            ticks_rows().to_pylist()
        rows = ticks_rows()
        assert rows.num_rows == len(sizes)  # engine.write waits for the cycle that applies it: a cycle each
        assert rows["RowsAdded"].to_pylist() == sizes
        assert rows["TableSize"].to_pylist() == list(np.cumsum(sizes))
        assert set(rows["TableKind"].to_pylist()) == {"append"}
        assert pc.min(rows["UsageNanos"]).as_py() > 0
        assert all(r["UsageNanos"] <= r["IntervalDurationNanos"] for r in rows.to_pylist())
        assert pc.sum(rows["RowsRemoved"]).as_py() == pc.sum(rows["RowsModified"]).as_py() == 0
        steps = rows["Step"].to_pylist()
        assert steps == sorted(steps) and len(set(steps)) == len(steps) and steps[-1] <= engine.step

        # DoGet and a snapshot request of "ticks", then the snapshot table read by DoGet
        assert client.snapshot("ticks").num_rows == total
        assert client.snapshot("ticks", columns=["id", "sym"], viewport=[(0, 9)]).num_rows == 10

        def snaps():
            return of_table(client.snapshot(SNAPSHOT_PERFORMANCE), "ticks")
        assert wait_until(lambda: {"doget", "snapshot", "subscription"} <= set(snaps()["Kind"].to_pylist()))
        got = snaps()
        assert got.schema.names == SNAPSHOT_SCHEMA.names
        by_kind = {r["Kind"]: r for r in got.to_pylist()}
        doget = by_kind["doget"]
        assert (doget["Rows"], doget["Columns"]) == (total, 3)
        assert doget["Bytes"] > total * 8 and doget["Messages"] >= 2 and doget["Step"] > 0
        assert doget["SnapshotNanos"] > 0 and doget["WriteNanos"] > 0
        snap = by_kind["snapshot"]
        assert (snap["Rows"], snap["Columns"]) == (10, 2)
        initial = by_kind["subscription"]  # the subscription's initial snapshot, of the empty table
        assert initial["Rows"] == 0 and initial["Columns"] == 3 and initial["WriteNanos"] is None

        # the subscription's figures per interval: every row sent is counted once
        def subs():
            return of_table(bpl.table, "ticks")
        assert bpl.wait_for(lambda s: pc.sum(of_table(s.table, "ticks")["Rows"]).as_py() == total, 15), \
            subs().to_pylist()
        figures = subs()
        assert figures.schema.names == BARRAGE_SCHEMA.names
        assert set(figures["Kind"].to_pylist()) == {"full"}
        assert len(set(figures["SubscriptionId"].to_pylist())) == 1
        assert pc.sum(figures["Messages"]).as_py() >= 1 + 1  # the snapshot and at least one update
        assert pc.sum(figures["SnapshotMessages"]).as_py() == 1
        assert pc.sum(figures["Bytes"]).as_py() > total * 8
        assert not any(figures["Ended"].to_pylist())

        # a viewport subscription: its own rows, and its snapshot of the window
        vp = client.subscribe("ticks", viewport=[(0, 4)], columns=["id"])
        assert vp.wait_for(lambda s: s.table.num_rows == 5, 15)
        assert bpl.wait_for(lambda s: "viewport" in of_table(s.table, "ticks")["Kind"].to_pylist(), 15)
        assert wait_until(lambda: [5, 1] in [[r["Rows"], r["Columns"]] for r in snaps().to_pylist()
                                             if r["Kind"] == "subscription"])
        vp.close()
        sub.close()
        assert bpl.wait_for(lambda s: any(of_table(s.table, "ticks")["Ended"].to_pylist()), 15)

        # nothing about the performance tables themselves, though they were subscribed and read
        for name in NAMES:
            for t in (upl.table, bpl.table, client.snapshot(SNAPSHOT_PERFORMANCE)):
                assert of_table(t, name).num_rows == 0
    finally:
        client.close()
        srv.stop()
        engine.stop()


def test_performance_tables_are_listed_only_with_the_switch():
    for show in (False, True):
        engine, srv = serve(show_system_tables=show)
        engine.get_or_create(TableSpec("plain", "append", SCHEMA))
        client = BarrageClient(srv.target)
        try:
            listed = client.tables()
            actions = {t["name"]: t for t in list_tables(srv.target)}
            assert "plain" in listed and not actions["plain"]["system"]
            for name in NAMES:
                assert (name in listed) == show
                assert (name in actions) == show and (not show or actions[name]["system"])
                assert (name in srv.ctx.scope.names_now()) == show
                # listed or not, the name reaches the table
                assert client.snapshot(name).schema.names == {UPDATE_PERFORMANCE: UPDATE_SCHEMA,
                                                               BARRAGE_PERFORMANCE: BARRAGE_SCHEMA,
                                                               SNAPSHOT_PERFORMANCE: SNAPSHOT_SCHEMA}[name].names
        finally:
            client.close()
            srv.stop()
            engine.stop()


def test_an_idle_server_records_nothing_while_its_performance_tables_are_watched():
    clock = ManualClock()  # the engine's time moves only here: 20 ms a cycle, a barrage interval every 5
    engine, srv = serve(clock)

    def cycle(seconds: float = 0.02) -> int:
        clock.advance(seconds)
        engine.run_cycle()
        return engine.step

    ticks, _ = engine.get_or_create(TableSpec("ticks", "append", SCHEMA))
    client = BarrageClient(srv.target)
    try:
        watchers = [client.subscribe(name) for name in NAMES]  # each table's own subscriber, all the time
        sub = client.subscribe("ticks")
        engine.write(ticks, batch(0, 40), wait=False)
        cycle()
        assert sub.wait_for(lambda s: s.size == 40, 15)
        client.snapshot("ticks")

        def sizes():
            return tuple(w.size for w in watchers)

        (served,) = [s for s in srv.registry.subscriptions if s.publisher.table.name == "ticks"]

        def recorded() -> bool:
            """Every row the traffic above causes has reached the watchers: the write's cycle, the
            two snapshots, and the subscription's figures up to its last message (no later interval
            has anything to say about it: no message, nothing coalesced, nothing queued)."""
            upd = of_table(watchers[0].table, "ticks")
            bar = of_table(watchers[1].table, "ticks")
            snap = of_table(watchers[2].table, "ticks")
            return (upd.num_rows >= 1 and pc.sum(upd["RowsAdded"]).as_py() == 40
                    and upd["TableSize"][-1].as_py() == 40
                    and bar.num_rows >= 1 and pc.sum(bar["Messages"]).as_py() == served.messages
                    and pc.sum(bar["Rows"]).as_py() == served.rows
                    and (pc.sum(bar["Coalesced"]).as_py() or 0) == served.coalesced
                    and sorted(snap["Kind"].to_pylist()) == ["doget", "subscription"]
                    and sizes() == (upd.num_rows, bar.num_rows, snap.num_rows))
        # once the last interval with traffic has been recorded (a cycle of the engine's clock per
        # look), nothing more comes
        assert wait_until(lambda: cycle() and recorded(), 30), \
            ([w.table.to_pylist() for w in watchers], served.messages, served.rows)
        settled = sizes()
        sent = {s.id: s.messages for s in srv.registry.subscriptions}  # the watchers' and the ticks one
        step = engine.step
        for _ in range(75):  # 1.5 s of the engine's clock: 75 cycles, 15 barrage intervals
            cycle()
        assert engine.step - step == 75
        assert {s.id: s.messages for s in srv.registry.subscriptions} == sent  # nothing queued for anyone
        assert sizes() == settled
        assert tuple(client.snapshot(name).num_rows for name in NAMES) == settled
        assert settled[0] > 0 and settled[1] > 0 and settled[2] >= 2
        for name in NAMES:
            for w in watchers:
                assert of_table(w.table, name).num_rows == 0
    finally:
        client.close()
        srv.stop()
        engine.stop()


@pytest.mark.parametrize("capacity", [0, -1])
def test_config_refuses_no_capacity(capacity):
    with pytest.raises(ValueError):
        PerfTablesConfig(capacity=capacity)


@pytest.mark.parametrize("flag, listed", [("--show-system-tables", True), ("--no-show-system-tables", False)])
def test_the_command_line_switch_reaches_the_server(flag, listed):
    from tests.serving import serve_process

    with serve_process("--no-web", flag, env={"TICKWIRE_SHOW_SYSTEM_TABLES": "true"}) as port:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        names = {i.descriptor.path[1].decode() for i in client.list_flights(options=ANON)}
        assert (set(NAMES) <= names) is listed and (not set(NAMES) & names) is not listed
        # listed or not, a performance table answers DoGet by name
        assert client.do_get(fl.Ticket(b"s/" + UPDATE_PERFORMANCE.encode()), options=ANON).read_all().schema \
            .names == UPDATE_SCHEMA.names


def test_a_subscriptions_log_lines_and_performance_rows_share_its_id(caplog):
    import logging

    engine, srv = serve()
    ticks, _ = engine.get_or_create(TableSpec("ticks", "append", SCHEMA))
    caplog.set_level(logging.INFO, logger="tickwire.server.services.flight_service")
    client = BarrageClient(srv.target)
    try:
        bpl = client.subscribe(BARRAGE_PERFORMANCE)
        sub = client.subscribe("ticks")
        engine.write(ticks, batch(0, 40))
        assert sub.wait_for(lambda s: s.size == 40, 15)
        started = [r for r in caplog.records if getattr(r, "event", "") == "subscription_start"
                   and getattr(r, "table", "") == "ticks"]
        assert len(started) == 1
        sub_id = started[0].subscription
        assert bpl.wait_for(lambda s: sub_id in of_table(s.table, "ticks")["SubscriptionId"].to_pylist(), 15), \
            (sub_id, of_table(bpl.table, "ticks").to_pylist())
    finally:
        client.close()
        srv.stop()
        engine.stop()


def test_rows_shifted_counts_the_rows_the_shifts_moved():
    """Against a reference that counts, per shift, the surviving rows (the table's rows less the
    added ones) in its destination range; on a sorted table whose rows move as prices change."""
    from tickwire.server.engine.perf_tables import rows_shifted

    engine = Engine()
    prices, _ = engine.get_or_create(TableSpec("prices", "keyed", pa.schema([("k", pa.int64()), ("p", pa.float64())]),
                                               keys=("k",)))
    ranked = prices.sort(["p"])
    seen = []
    ranked.add_listener(lambda t, u, step: seen.append((u, t.rowset)))
    rng = np.random.default_rng(3)
    engine.write(prices, pa.table({"k": np.arange(200), "p": rng.random(200)}), wait=False)
    engine.run_cycle()
    for _ in range(30):
        keys = rng.choice(400, 25, replace=False)
        engine.write(prices, pa.table({"k": keys, "p": rng.random(25)}), wait=False)
        engine.run_cycle()
    moved = 0
    for update, rows in seen:
        want = 0
        if not update.shifted.is_empty():
            kept = rows.minus(update.added).keys()
            for s, e, d in zip(update.shifted.starts, update.shifted.ends, update.shifted.deltas):
                want += int(((kept >= s + d) & (kept <= e + d)).sum())
        assert rows_shifted(update, rows) == want
        moved += want
    assert moved > 0  # the case was exercised


def test_the_rows_of_an_interval_are_written_together_once_it_has_passed():
    """The cycles' and the snapshots' rows are kept and written once every flush interval of the
    engine's clock (one write a table, not one a cycle), in the order recorded; nothing is lost in
    between, and what is kept when the recording stops is written then."""
    from tickwire.server.engine.publishing import PublisherRegistry

    clock = ManualClock()
    config = PerfTablesConfig(capacity=1_000, barrage_interval_s=100.0, flush_interval_s=0.1)
    engine = Engine(EngineConfig(interval_ms=10, perf_tables=config), clock=clock)
    ticks, _ = engine.get_or_create(TableSpec("ticks", "append", SCHEMA))
    registry = PublisherRegistry(engine)
    engine.perf.attach(registry)
    upl = engine.perf.tables[UPDATE_PERFORMANCE]
    snl = engine.perf.tables[SNAPSHOT_PERFORMANCE]

    def written(table) -> pa.Table:
        return of_table(engine.snapshot(table)[1], "ticks")

    def cycle(n: int = 0, seconds: float = 0.01) -> None:
        if n:
            engine.write(ticks, batch(0, n), wait=False)
        clock.advance(seconds)
        engine.run_cycle()

    sizes = [3, 5, 8, 13, 21, 34, 55, 89]  # eight cycles, 80 ms of the engine's clock: under one interval
    for n in sizes:
        cycle(n)
    engine.perf.snapshot(ticks, "doget", rows=7, columns=3, nbytes=99, messages=2, snapshot_s=0.001,
                         write_s=0.002, step=engine.step)
    assert written(upl).num_rows == 0 and written(snl).num_rows == 0
    cycle(seconds=0.019)  # 99 ms: still under the interval
    assert written(upl).num_rows == 0
    cycle(seconds=0.0015)  # the interval has passed: this cycle writes all eight rows, the next applies them
    cycle()
    rows = written(upl)
    assert rows["RowsAdded"].to_pylist() == sizes
    assert rows["TableSize"].to_pylist() == list(np.cumsum(sizes))
    steps = rows["Step"].to_pylist()
    assert steps == sorted(steps) and len(set(steps)) == len(sizes)
    assert written(snl)["Rows"].to_pylist() == [7]
    # a cycle's row, then the recording stops before the interval has passed: written at the stop
    cycle(4)
    assert written(upl).num_rows == len(sizes)
    engine.perf.detach(registry)
    cycle()
    assert written(upl)["RowsAdded"].to_pylist() == sizes + [4]
