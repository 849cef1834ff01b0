"""The interop harness against the real thing: Deephaven's Java Barrage client (tests/interop/
java_barrage.py) subscribing to a real Deephaven server (tests/interop/dh_server.py), both from
the PyPI package deephaven-server. What the Java client holds must equal what the server serves
through plain Arrow Flight DoGet."""
from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from .interop.dh_server import DH_PSK, deephaven_server_available
from .interop.java_barrage import run_java_client

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)

TABLES = ["static_mixed", "ticking_append", "ticking_keyed"]
SECONDS = 3.0


def doget(dh, name: str) -> pa.Table:
    client = fl.connect(f"grpc://{dh.target}")
    try:
        options = fl.FlightCallOptions(headers=[dh.auth_header])
        return client.do_get(fl.Ticket(b"s/" + name.encode()), options).read_all()
    finally:
        client.close()


@pytest.fixture(scope="module")
def dh(deephaven_server):
    return deephaven_server  # DEFAULT_TABLES


@pytest.fixture(scope="module")
def run(dh):
    started = time.time()
    results = run_java_client(dh.target, TABLES, seconds=SECONDS, timeout=120)
    return results, started, time.time()


def _ok(results, key):
    res = results[key]
    assert res.error is None, res.error
    assert res.table is not None
    return res


def test_every_request_succeeded(run):
    results, started, ended = run
    assert set(results) == {(t, m) for t in TABLES for m in ("full", "viewport", "snapshot")}
    for key, res in results.items():
        _ok(results, key)
        assert res.complete_s is not None and 0 <= res.complete_s < 30, key
        assert started <= res.request_wall <= res.read_wall <= ended, key
        assert res.refreshing is (key[1] != "snapshot"), key
        assert res.columns == res.table.column_names, key


def test_static_full_and_snapshot_equal_doget(dh, run):
    results, _, _ = run
    expected = doget(dh, "static_mixed")
    assert expected.num_rows == 1000
    # The table carries nulls in every column, so equality covers null handling.
    assert all(col.null_count > 0 for col in expected.columns)
    for mode in ("full", "snapshot"):
        got = _ok(results, ("static_mixed", mode)).table
        assert got.schema.types == expected.schema.types, mode
        assert got.column_names == expected.column_names, mode
        assert [c.null_count for c in got.columns] == [c.null_count for c in expected.columns], mode
        assert got.equals(expected), mode


def test_static_viewport_is_first_ten_rows(dh, run):
    results, _, _ = run
    expected = doget(dh, "static_mixed").slice(0, 10)
    got = _ok(results, ("static_mixed", "viewport")).table
    assert got.num_rows == 10
    assert got.equals(expected)
    assert got.column("I8").null_count == 1  # row 0 is the all-null row


def test_ticking_append_state(dh, run):
    results, _, _ = run
    full = _ok(results, ("ticking_append", "full"))
    snap = _ok(results, ("ticking_append", "snapshot"))
    view = _ok(results, ("ticking_append", "viewport"))
    names = ["Timestamp", "Seq", "Sym", "Px", "Qty"]
    for res in (full, snap, view):
        assert res.table.column_names == names
    # one row per 0.1 s since the server started; the client lags by at most a few cycles
    assert 10 <= full.size <= snap.size <= doget(dh, "ticking_append").num_rows
    seq = full.table.column("Seq").to_numpy()
    assert (seq == range(full.size)).all()
    px = pc.add(pc.multiply(full.table.column("Seq").cast(pa.float64()), 0.5), 100.0)
    assert pc.all(pc.equal(full.table.column("Px"), px)).as_py()
    # append-only: the later snapshot extends what the client held
    assert snap.table.slice(0, full.size).equals(full.table)
    assert view.size == 10
    assert view.table.column("Seq").to_pylist() == list(range(10))
    assert full.updates >= 1  # rows kept arriving after the initial snapshot


def test_ticking_keyed_state(dh, run):
    results, _, _ = run
    full = _ok(results, ("ticking_keyed", "full"))
    snap = _ok(results, ("ticking_keyed", "snapshot"))
    view = _ok(results, ("ticking_keyed", "viewport"))
    for res in (full, snap, view):
        assert res.table.column_names == ["Key", "Timestamp", "Val", "Cnt"]
    assert full.size == snap.size == 20
    assert full.table.column("Key").to_pylist() == list(range(20))
    assert view.table.column("Key").to_pylist() == list(range(10))
    cnt = full.table.column("Cnt").to_numpy()
    assert (cnt % 20 == range(20)).all()
    # the snapshot was taken after the subscription was read: every key's counter is not behind
    assert (snap.table.column("Cnt").to_numpy() >= cnt).all()
    assert full.updates >= 1


def test_psk_auth(deephaven_psk_server):
    with deephaven_psk_server.tables(
        "from deephaven import empty_table\n"
        "small = empty_table(7).update(['X = i * 3'])\n"
    ) as server:
        good = run_java_client(server.target, ["small"], modes=("snapshot", "full"), seconds=0.5,
                               auth=DH_PSK, timeout=90)
        for mode in ("snapshot", "full"):
            res = _ok(good, ("small", mode))
            assert res.table.column("X").to_pylist() == [0, 3, 6, 9, 12, 15, 18]
        bad = run_java_client(server.target, ["small"], modes=("snapshot",), seconds=0.5, auth="wrong", timeout=90)
        res = bad[("small", "snapshot")]
        assert res.table is None
        assert "UNAUTHENTICATED" in res.error
