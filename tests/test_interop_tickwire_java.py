"""Deephaven's Java Barrage client (from the deephaven-server package, unmodified) against a
running tickwire server: full subscriptions, viewport subscriptions (forward and reverse) and
snapshots of static and ticking tables, including a ticking table large enough that its full
snapshot arrives in pieces. What the client holds must equal what tickwire serves."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tickwire.server.adapters.demo import DemoTicker, static_mixed
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec

from .interop.dh_server import deephaven_server_available
from .interop.java_barrage import run_java_client

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)

BIG = 250_000  # x 3 columns: over the 500,000 cells of one snapshot piece
TABLES = ["static_mixed", "ticking_append", "ticking_keyed", "ticking_sorted", "big_ticking"]


def plain(t: pa.Table) -> pa.Table:
    return pa.table({f.name: t.column(i).combine_chunks() for i, f in enumerate(t.schema)})


def served_rows(engine, name: str) -> pa.Table:
    """What the table `name` holds now."""
    return engine.snapshot(engine.resolve(name))[1]


@pytest.fixture(scope="module")
def served():
    engine = Engine(interval_ms=100)
    ticker = DemoTicker(engine, rows_per_tick=5, interval_s=0.1)
    big = engine.create(TableSpec("big_ticking", "append",
                                  pa.schema([("Id", pa.int64()), ("X", pa.float64()), ("B", pa.int32())])))

    def rows(start, n):
        i = np.arange(start, start + n, dtype=np.int64)
        return pa.table({"Id": i, "X": i * 0.25, "B": (i % 97).astype(np.int32)})

    engine.write(big, rows(0, BIG), wait=False)
    engine.run_cycle()
    server = TickwireServer(engine, port=0).start()
    ticker.start()
    feed_stop = []

    def feed():  # the big table keeps growing while the client takes its snapshot
        import time
        n = BIG
        while not feed_stop:
            engine.write(big, rows(n, 50), wait=False)
            n += 50
            time.sleep(0.1)

    import threading
    t = threading.Thread(target=feed, daemon=True)
    t.start()
    yield server, engine
    feed_stop.append(1)
    ticker.stop()
    server.stop()
    engine.stop()


@pytest.fixture(scope="module")
def results(served):
    server, _engine = served
    return run_java_client(server.target, TABLES, seconds=3.0, timeout=150)


@pytest.fixture(scope="module")
def reverse_results(served):
    # ticking_keyed: Deephaven's Java client marks an append-only table add-only (from the
    # FetchTable schema) and then refuses the removals a sliding reverse window brings
    server, _engine = served
    return run_java_client(server.target, ["ticking_keyed"], modes=("viewport",), seconds=2.0, viewport=(0, 4),
                           reverse_viewport=True, timeout=120)


def _ok(res):
    assert res.error is None, res.error
    assert res.table is not None
    return plain(res.table)


def test_static_table_full_viewport_and_snapshot(results):
    expected = static_mixed()
    assert _ok(results[("static_mixed", "full")]).equals(expected)
    assert _ok(results[("static_mixed", "snapshot")]).equals(expected)
    assert _ok(results[("static_mixed", "viewport")]).equals(expected.slice(0, 10))


def test_append_table_subscriptions_hold_the_served_rows(served, results):
    _server, engine = served
    later = served_rows(engine, "ticking_append")
    for mode in ("full", "snapshot"):
        got = _ok(results[("ticking_append", mode)])
        assert got.num_rows >= 10
        assert got.column("Seq").to_pylist() == list(range(got.num_rows))
        assert got.equals(later.slice(0, got.num_rows)), mode  # appended rows never change
    vp = _ok(results[("ticking_append", "viewport")])
    assert vp.equals(later.slice(0, 10))
    assert results[("ticking_append", "full")].updates >= 1


def test_reverse_viewport_holds_the_last_rows(served, reverse_results):
    _server, engine = served
    got = _ok(reverse_results[("ticking_keyed", "viewport")])
    later = served_rows(engine, "ticking_keyed")
    assert got.num_rows == 5
    assert got.column("Sym").to_pylist() == later.column("Sym").to_pylist()[-5:]  # the last five rows, in order


def test_keyed_table_has_every_key_with_current_or_newer_values_on_the_server(served, results):
    _server, engine = served
    for mode in ("full", "snapshot"):
        got = _ok(results[("ticking_keyed", mode)])
        assert got.num_rows == 20 and len(set(got.column("Sym").to_pylist())) == 20, mode
        now = served_rows(engine, "ticking_keyed")
        later = dict(zip(now.column("Sym").to_pylist(), now.column("Seq").to_pylist()))
        for s, q in zip(got.column("Sym").to_pylist(), got.column("Seq").to_pylist()):
            assert later[s] >= q, (mode, s)  # the server is never behind what the client saw
    assert _ok(results[("ticking_keyed", "viewport")]).num_rows == 10


def test_sorted_table_with_shifts_is_applied_correctly(served, results):
    """ticking_sorted (latest trade per symbol, sorted on its changing price) moves rows every
    cycle, often as shifts: the Java client's table must be a consistent state: one row per symbol,
    in price order, each row the trade it claims to be."""
    _server, engine = served
    trades = served_rows(engine, "ticking_append")
    by_seq = dict(zip(trades.column("Seq").to_pylist(), zip(trades.column("Sym").to_pylist(),
                                                          trades.column("Price").to_pylist())))
    for mode in ("full", "viewport", "snapshot"):
        got = _ok(results[("ticking_sorted", mode)])
        syms, prices, seqs = (got.column(c).to_pylist() for c in ("Sym", "Price", "Seq"))
        assert len(set(syms)) == len(syms) and got.num_rows == (10 if mode == "viewport" else 20), mode
        assert prices == sorted(prices), f"{mode}: rows out of price order"
        for sym, price, seq in zip(syms, prices, seqs):
            assert by_seq[seq] == (sym, price), (mode, sym, seq)


def test_growing_snapshot_of_a_big_ticking_table_completes(served, results):
    _server, engine = served
    res = results[("big_ticking", "full")]
    got = _ok(res)
    assert res.complete_s is not None and res.complete_s < 60
    assert got.num_rows >= BIG
    assert got.column("Id").to_pylist() == list(range(got.num_rows))
    assert got.equals(served_rows(engine, "big_ticking").slice(0, got.num_rows))
