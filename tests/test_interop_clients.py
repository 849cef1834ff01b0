"""Real clients against a running tickwire server: plain pyarrow.flight, pydeephaven and
pydeephaven-ticking (Deephaven's C++ Barrage client), unmodified.

The engine is stepped by the tests (no cycle thread), so each comparison is at a known
step: a client's state after it received step s must equal the server's snapshot at step s."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire.server.adapters.demo import TRADES, DemoTicker, static_mixed
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.perf_tables import NAMES as PERF_TABLES

pytestmark = pytest.mark.interop

ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])


@pytest.fixture(scope="module")
def served():
    engine = Engine(interval_ms=3_600_000)  # stepped by hand
    ticker = DemoTicker(engine, rows_per_tick=7, seed=11)
    for _ in range(3):
        ticker.tick()
        engine.run_cycle()
    server = TickwireServer(engine, port=0, start_engine=False).start()
    lock = threading.Lock()  # tests that step the engine do it one at a time
    yield server, engine, ticker, lock
    server.stop()


@pytest.fixture()
def client(served):
    server = served[0]
    c = fl.FlightClient(f"grpc://{server.target}")
    yield c
    c.close()


def wait_until(cond, timeout=10.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def plain(t: pa.Table) -> pa.Table:
    """Values only: drop schema and field metadata."""
    return pa.table({f.name: t.column(i) for i, f in enumerate(t.schema)})


def all_names(engine) -> set[str]:
    """The names of every table of the engine, hidden and system ones included."""
    return {t.name for t in engine.tables(hidden=True)}


def snapshot(engine, name: str) -> tuple[int, pa.Table]:
    """(step, contents) of the table `name`."""
    return engine.snapshot(engine.resolve(name))


# -- pyarrow.flight ------------------------------------------------------------------------------------

def test_pyarrow_list_flights_describes_every_table(served, client):
    _server, engine, _t, _l = served
    infos = {tuple(p.decode() for p in i.descriptor.path): i for i in client.list_flights(options=ANON)}
    # "__": hidden; the performance tables are listed only when asked for
    assert set(infos) == {("scope", n) for n in all_names(engine) if not n.startswith("__") and n not in PERF_TABLES}
    static = infos[("scope", "static_mixed")]
    assert static.total_records == 1000 and static.total_bytes == -1
    assert infos[("scope", "ticking_append")].total_records == -1
    assert static.endpoints[0].ticket.ticket == b"s/static_mixed"
    assert static.schema.names == static_mixed().schema.names


def test_pyarrow_get_flight_info_and_schema_match_doget(served, client):
    desc = fl.FlightDescriptor.for_path("scope", "ticking_keyed")
    info = client.get_flight_info(desc, ANON)
    schema = client.get_schema(desc, ANON).schema
    got = client.do_get(info.endpoints[0].ticket, ANON).read_all()
    assert info.schema.equals(schema, check_metadata=True)
    assert got.schema.equals(schema, check_metadata=True)
    assert schema.field("Sym").metadata[b"deephaven:type"] == b"java.lang.String"


def test_pyarrow_doget_static_equals_the_table(client):
    got = client.do_get(fl.Ticket(b"s/static_mixed"), ANON).read_all()
    assert plain(got).equals(static_mixed())


def test_pyarrow_doget_ticking_equals_the_snapshot(served, client):
    _server, engine, ticker, lock = served
    with lock:
        ticker.tick()
        engine.run_cycle()
        for name in ("ticking_append", "ticking_keyed", "blink", "ticking_ring"):
            step, expected = snapshot(engine, name)
            reader = client.do_get(fl.Ticket(f"s/{name}".encode()), ANON)
            got = reader.read_all()
            assert plain(got).equals(expected), name


def test_pyarrow_big_static_doget_streams_in_batches(served, client):
    _server, engine, _t, _l = served
    n = 300_000
    data = pa.table({f"c{i}": np.arange(n, dtype=np.int64) * (i + 1) for i in range(5)})
    if engine.resolve("big_test") is None:
        engine.create(TableSpec("big_test", "static", data=data))
    reader = client.do_get(fl.Ticket(b"s/big_test"), ANON)
    batches = [c.data for c in reader]
    assert len(batches) > 1
    assert pa.Table.from_batches(batches).equals(data)


def _status(call) -> str:
    """The gRPC status line pyarrow reports for a failing call."""
    with pytest.raises(Exception) as e:
        call()
    text = str(e.value)
    return text + " | " + text.upper().replace(" ", "_")  # pyarrow spells some codes in words


def test_pyarrow_errors_have_the_right_status(client):
    with pytest.raises(fl.FlightUnauthenticatedError):
        client.do_get(fl.Ticket(b"s/static_mixed")).read_all()
    msg = _status(lambda: client.do_get(fl.Ticket(b"s/missing"), ANON).read_all())
    assert "NOT_FOUND" in msg and "variable 'missing' not found" in msg
    msg = _status(lambda: client.do_get(fl.Ticket(b"zz"), ANON).read_all())
    assert "PRECONDITION" in msg and "no resolver for route" in msg
    msg = _status(lambda: client.do_get(fl.Ticket(b"e\x01\x00"), ANON).read_all())
    assert "PRECONDITION" in msg and "export ticket" in msg
    msg = _status(lambda: list(client.list_flights(b"x", options=ANON)))
    assert "INVALID_ARGUMENT" in msg and "Criteria expressions are not supported" in msg
    msg = _status(lambda: client.get_flight_info(fl.FlightDescriptor.for_command(b"s/static_mixed"), ANON))
    assert "PRECONDITION" in msg and "only PATH" in msg


def test_pyarrow_do_action_lists_tables(served, client):
    _server, _engine, _t, _l = served
    actions = {a.type for a in client.list_actions(ANON)}
    assert "list-tables" in actions
    (result,) = list(client.do_action(fl.Action("list-tables", b""), ANON))
    tables = {t["name"]: t for t in json.loads(result.body.to_pybytes())}
    assert tables["static_mixed"]["rows"] == 1000 and not tables["static_mixed"]["refreshing"]
    assert tables["ticking_keyed"]["kind"] == "KeyedTable"
    msg = _status(lambda: list(client.do_action(fl.Action("nope", b""), ANON)))
    assert "UNIMPLEMENTED" in msg and "unknown action" in msg


def test_pyarrow_do_put_creates_and_appends(served, client):
    _server, engine, _t, lock = served
    data = pa.table({"x": pa.array([1, 2, 3], pa.int64()), "s": ["a", None, "c"]})
    desc = fl.FlightDescriptor.for_path("scope", "uploaded")
    writer, reader = client.do_put(desc, data.schema, ANON)
    writer.write_table(data)
    writer.write_table(data.slice(1))
    writer.close()
    with lock:
        engine.run_cycle()
        got = client.do_get(fl.Ticket(b"s/uploaded"), ANON).read_all()
    assert plain(got).equals(pa.concat_tables([data, data.slice(1)]))
    # a keyed upload upserts by its key columns
    keyed = pa.table({"k": ["a", "b", "a"], "v": pa.array([1, 2, 3], pa.int64())})
    schema = keyed.schema.with_metadata({b"tickwire:keys": b"k"})
    writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "uploaded_keyed"), schema, ANON)
    writer.write_table(keyed.replace_schema_metadata(schema.metadata))
    writer.close()
    with lock:
        engine.run_cycle()
        got = client.do_get(fl.Ticket(b"s/uploaded_keyed"), ANON).read_all()
    assert plain(got).sort_by("k").to_pydict() == {"k": ["a", "b"], "v": [3, 2]}
    # a mismatched schema into an existing table is refused with the reason
    bad = pa.table({"x": ["not an int"]})
    writer, _ = client.do_put(desc, bad.schema, ANON)
    def put_bad():
        writer.write_table(bad)
        writer.close()
    msg = _status(put_bad)
    assert "INVALID_ARGUMENT" in msg and "uploaded" in msg


# -- pydeephaven --------------------------------------------------------------------------------------------

def test_pydeephaven_open_table_to_arrow(served):
    from pydeephaven import Session

    server, engine, ticker, lock = served
    s = Session(host="127.0.0.1", port=server.port)
    try:
        assert {n for n in all_names(engine) if not n.startswith("__")} - {"big_test", "uploaded", "uploaded_keyed"} \
            - set(PERF_TABLES) \
            <= set(s.tables)
        assert plain(s.open_table("static_mixed").to_arrow()).equals(static_mixed())
        with lock:
            ticker.tick()
            engine.run_cycle()
            _step, expected = snapshot(engine, "ticking_keyed")
            got = s.open_table("ticking_keyed").to_arrow()
        assert plain(got).equals(expected)
        with pytest.raises(Exception) as e:
            s.open_table("no_such_table")
        assert "variable 'no_such_table' not found" in repr(e.value.__cause__ or e.value) + str(e.value)
    finally:
        s.close()
    assert server.sessions.count >= 0


# -- pydeephaven-ticking ---------------------------------------------------------------------------------------

def _current(update) -> pa.Table:
    cur = update.update.current
    names = cur.schema.names if hasattr(cur.schema, "names") else [f.name for f in cur.schema]
    rows = cur.get_row_sequence()
    cols = {}
    for name in names:
        col = cur.get_column_by_name(name, True)
        cols[name] = col.get_chunk(rows)
    return pa.table(cols)


@pytest.mark.parametrize("name", ["ticking_append", "ticking_keyed", "blink", "ticking_ring", "ticking_sorted",
                                  "static_mixed"])
def test_pydeephaven_ticking_state_equals_snapshot_at_each_step(served, name):
    from pydeephaven import Session
    from pydeephaven_ticking.table_listener import listen

    server, engine, ticker, lock = served
    updates, errors = [], []
    s = Session(host="127.0.0.1", port=server.port)
    try:
        with lock:
            handle = listen(s.open_table(name), lambda u: updates.append(_current(u)), errors.append)
            handle.start()
            try:
                wait_until(lambda: updates or errors, what=f"the snapshot of {name}")
                assert not errors, errors
                _step, expected = snapshot(engine, name)
                assert updates[-1].equals(plain(expected).cast(updates[-1].schema)), f"{name} snapshot"
                if name == "static_mixed":
                    return
                for step in range(6):
                    n = len(updates)
                    ticker.tick()
                    engine.run_cycle()
                    _step, expected = snapshot(engine, name)
                    wait_until(lambda n=n: len(updates) > n or errors, what=f"{name} step {step}")
                    assert not errors, errors
                    got = updates[-1]
                    assert got.num_rows == expected.num_rows, f"{name} step {step}"
                    assert got.equals(plain(expected).cast(got.schema)), f"{name} step {step}"
            finally:
                handle.stop()
    finally:
        s.close()
    assert TRADES.names == [f.name for f in TRADES]


def test_a_pydeephaven_session_of_a_stopped_server_is_closed_for_good():
    """pydeephaven's close() raises when its server is gone and leaves the session marked connected,
    its keep-alive thread still refreshing (minutes later it raises inside some other test);
    `close_dh_session` leaves it closed."""
    from pydeephaven import DHError, Session

    from tests.interop import close_dh_session

    engine = Engine(interval_ms=3_600_000)
    server = TickwireServer(engine, port=0).start()
    sessions = [Session(host="127.0.0.1", port=server.port) for _ in range(2)]
    server.stop()
    engine.stop()
    with pytest.raises(DHError):
        sessions[0].close()
    assert sessions[0].is_connected  # what pydeephaven leaves
    close_dh_session(sessions[0])
    close_dh_session(sessions[1])
    assert not sessions[0].is_connected and not sessions[1].is_connected
