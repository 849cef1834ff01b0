"""tickwire's Python Barrage client (`tickwire.clients.BarrageClient`) against a real Deephaven
server (PyPI `deephaven-server`, tests/interop/dh_server.py). Every result is compared with the
server's own snapshot of the same table: a DoGet through plain `pyarrow.flight`.

Ticking tables are made by one script, run through pydeephaven just before the subscriptions
start, from a source the test itself writes to step by step (a DynamicTableWriter), ROWS rows in
all: after each step every subscription must catch up with the server, so how many updates of
each kind the subscriptions see does not depend on how fast the machine is. Once the source is
complete, each subscription must hold exactly the server's final snapshot (or its viewport
slice), and replaying the updates it delivered must give the same rows."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from tests.harness import until
from tickwire.clients.client import BarrageClient, ClientError, Subscription, Update

from .interop.dh_server import DH_CYCLE_MS, DH_PSK, assigned_names, deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")

CYCLE_MS = DH_CYCLE_MS  # the shared server's update-graph cycle (Deephaven's default is 1000 ms)

#: Static tables. static_types: 1000 rows of every column type the client converts, row 0 all
#: null and column k null where i % P_k == 0; BD_s / BI_s are the server's own renderings of the
#: BigDecimal / BigInteger values (the client turns Deephaven's binary encoding into decimals).
STATIC_TABLES = r'''
from deephaven import empty_table, time_table

static_types = empty_table(1000).update([
    "I8 = i % 17 == 0 ? NULL_BYTE : (byte) (i % 100 - 50)",
    "I16 = i % 19 == 0 ? NULL_SHORT : (short) (i * 7 - 3000)",
    "I32 = i % 23 == 0 ? NULL_INT : i * 1000003",
    "I64 = i % 29 == 0 ? NULL_LONG : ii * 10000000019L",
    "F32 = i % 31 == 0 ? NULL_FLOAT : (float) (i * 0.125)",
    "F64 = i % 37 == 0 ? NULL_DOUBLE : i * 1.25 - 100.0",
    "Bool = i % 13 == 0 ? null : (Boolean) (i % 2 == 0)",
    "Str = i % 11 == 0 ? null : `s` + i",
    "Ts = i % 41 == 0 ? null : '2024-01-01T00:00:00Z' + i * SECOND",
    "Ch = i % 43 == 0 ? NULL_CHAR : (char) (65 + i % 26)",
    "BD = i % 7 == 0 ? null : java.math.BigDecimal.valueOf(ii * 125 - 40000, 3)",
    "BI = i % 5 == 0 ? null : java.math.BigInteger.valueOf(ii * 1000000007L - 3)",
    "LD = i % 6 == 0 ? null : java.time.LocalDate.of(2024, 1, 1).plusDays(i)",
    "LT = i % 8 == 0 ? null : java.time.LocalTime.of(i % 24, i % 60, 7)",
    "IA = i % 9 == 0 ? null : new int[] {i, i + 1, NULL_INT}",
    "SA = i % 3 == 0 ? null : new String[] {`a` + i, null}",
    "BA = i % 10 == 0 ? null : new byte[] {(byte) i, (byte) 2}",
    "BD_s = BD == null ? null : BD.toPlainString()",
    "BI_s = BI == null ? null : BI.toString()",
])

big_static = empty_table(200_000).update(["X = ii", "Y = ii * 0.5", "S = `v` + (ii % 1000)"])

forever = time_table("PT0.1S").update(["Seq = ii"])
'''

HELPERS = ["BD_s", "BI_s"]

ROWS = 120  # rows of the ticking source in all
FIRST_ROWS = 10  # rows written before subscribing
STEP_ROWS = 5  # rows written at each step after that

#: Run in the server's scope just before subscribing. Seq = row number; `keyed` modifies rows
#: (last_by), `filtered` adds and removes them, `sorted` moves them (shifts in key space),
#: `flat` shifts dense keys, `ring` drops its oldest rows. `_write_src(first, count)` appends
#: the rows Seq = first .. first + count - 1.
LIVE_SCRIPT = '''
from deephaven import DynamicTableWriter, ring_table
import deephaven.dtypes as dht
_src_writer = DynamicTableWriter({"Seq": dht.int64})
src = _src_writer.table

def _write_src(first, count):
    for seq in range(first, first + count):
        _src_writer.write_row(seq)

app = src.update(["Sym = Seq % 3 == 0 ? `A` : `B`", "Px = Seq * 0.5", "Qty = Seq % 7 == 0 ? NULL_LONG : Seq * 100"])
keyed = src.update(["Key = (int) (Seq % 25)", "Val = (int) ((Seq * 37) % 101)", "Cnt = Seq"]).last_by("Key")
filtered = keyed.where("Val % 3 != 0")
sorted_t = keyed.sort("Val")
flat = sorted_t.flatten()
ring = ring_table(src, 25)
'''
LIVE_TABLES = ["src", "app", "keyed", "filtered", "sorted_t", "flat", "ring"]


@dataclass
class Spec:
    """One subscription of the live fixture; `change` is a set_view made while the source ticks."""

    table: str
    kw: dict = field(default_factory=dict)
    change: dict = field(default_factory=dict)

    def final_view(self) -> dict:
        view = {k: v for k, v in self.kw.items() if k in ("viewport", "reverse", "columns")}
        view.update(self.change)
        return view


SPECS = {
    "app_full": Spec("app"),
    "keyed_full": Spec("keyed"),
    "filtered_full": Spec("filtered"),
    "sorted_full": Spec("sorted_t"),
    "flat_full": Spec("flat"),
    "ring_full": Spec("ring"),
    "keyed_columns": Spec("keyed", {"columns": ["Cnt", "Key"]}),
    "app_viewport": Spec("app", {"viewport": [(0, 9), (50, 59), (200, 210)]}),
    "app_reverse": Spec("app", {"viewport": [(0, 9)], "reverse": True}),
    "sorted_viewport": Spec("sorted_t", {"viewport": [(3, 12)]}),
    "flat_reverse_columns": Spec("flat", {"viewport": [(0, 7)], "reverse": True, "columns": ["Val", "Key"]}),
    "ring_viewport": Spec("ring", {"viewport": [(5, 14)]}),
    # set_view while the source ticks
    "filtered_view_change": Spec("filtered", {"viewport": [(0, 4)]}, {"viewport": [(2, 9)], "columns": ["Key", "Val"]}),
    "sorted_turns_reverse": Spec("sorted_t", {"viewport": [(0, 4)]}, {"viewport": [(0, 5)], "reverse": True}),
    "keyed_full_columns_change": Spec("keyed", {"columns": ["Key"]}, {"columns": ["Key", "Val", "Cnt"]}),
}
#: subscriptions whose delivered updates are replayed (their columns do not change)
REPLAYED = [n for n, s in SPECS.items() if not s.change]


# -- the server's side ----------------------------------------------------------------------------------

def doget(dh, name: str) -> pa.Table:
    """The server's snapshot of a global-scope table, through plain Arrow Flight."""
    client = fl.connect(f"grpc://{dh.target}")
    try:
        return client.do_get(fl.Ticket(b"s/" + name.encode()),
                             fl.FlightCallOptions(headers=[dh.auth_header])).read_all()
    finally:
        client.close()


def stable_doget(dh, name: str, timeout: float = 30.0) -> pa.Table:
    """The server's snapshot once two taken three update cycles apart agree."""
    end = time.monotonic() + timeout
    last = doget(dh, name)
    while time.monotonic() < end:
        time.sleep(3 * CYCLE_MS / 1000)
        now = doget(dh, name)
        if now.equals(last):
            return now
        last = now
    raise AssertionError(f"{name} still changes after {timeout} s")


def positions(n: int, viewport, reverse: bool = False) -> np.ndarray:
    """Row positions of a viewport (inclusive position ranges) in a table of n rows, in table order."""
    idx = np.concatenate([np.arange(a, b + 1) for a, b in viewport])
    if reverse:
        idx = n - 1 - idx
    return np.unique(idx[(idx >= 0) & (idx < n)])


def view_of(table: pa.Table, *, viewport=None, reverse=False, columns=None) -> pa.Table:
    if viewport is not None:
        table = table.take(positions(table.num_rows, viewport, reverse))
    if columns is not None:
        table = table.select(columns)
    return table


def plain(t: pa.Table) -> pa.Table:
    """Values only (no schema or field metadata)."""
    return pa.table({f.name: t.column(i) for i, f in enumerate(t.schema)})


def natural(server: pa.Table, client_schema: pa.Schema) -> pa.Table:
    """The server's DoGet of static_types with its wire-encoded columns in the client's natural
    types: BigDecimal / BigInteger from the server's own text renderings (an exact cast, which
    fails if the client's decimal type cannot hold them), LocalDate from date64 (ms) to date32."""
    cols = {name: server.column(name) for name in server.column_names}
    cols["BD"] = pc.cast(server.column("BD_s"), client_schema.field("BD").type)
    cols["BI"] = pc.cast(server.column("BI_s"), client_schema.field("BI").type)
    cols["LD"] = pc.cast(server.column("LD"), pa.date32())
    return pa.table(cols)


# -- replaying delivered updates (independently of the client's TableState) -----------------------------

def _rows(ranges: np.ndarray) -> np.ndarray:
    if ranges.size == 0:
        return np.empty(0, dtype=np.int64)
    return np.concatenate([np.arange(a, b + 1, dtype=np.int64) for a, b in ranges])


def _set(table: pa.Table, name: str, pos: np.ndarray, values: pa.Array) -> pa.Table:
    arr = table.column(name).combine_chunks()
    src = np.arange(len(arr), dtype=np.int64)
    src[pos] = len(arr) + np.arange(pos.size)
    new = pa.concat_arrays([arr, values.cast(arr.type)]).take(pa.array(src))
    return table.set_column(table.schema.get_field_index(name), name, new)


def replay_full(updates: list[Update]) -> pa.Table:
    """Rows by row key: drop removed keys, move shifted ones, insert the added ones, set modified values."""
    keys = np.empty(0, dtype=np.int64)
    table = None
    for u in updates:
        table = u.added.slice(0, 0) if table is None else table
        removed = _rows(u.removed_rows)
        keep = ~np.isin(keys, removed)
        assert int((~keep).sum()) == removed.size == u.removed.num_rows
        keys, table = keys[keep], table.filter(pa.array(keep))
        before = keys.copy()
        for start, end, dest in u.shifts:
            moved = (before >= start) & (before <= end)
            keys[moved] = before[moved] + (dest - start)
        added = _rows(u.added_rows)
        assert added.size == u.added.num_rows
        keys = np.concatenate([keys, added])
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        table = pa.concat_tables([table, u.added.select(table.column_names)]).take(pa.array(order))
        assert np.all(np.diff(keys) > 0), "row keys collide"
        for name, ranges in u.modified_rows.items():
            rows = _rows(ranges)
            assert rows.size == len(u.modified[name])
            pos = np.searchsorted(keys, rows)
            assert np.array_equal(keys[pos], rows), "modified rows that are not held"
            if name in table.column_names:
                table = _set(table, name, pos, u.modified[name])
    return table


def replay_viewport(updates: list[Update]) -> pa.Table:
    """Rows by viewport index: removed indices are of the old window, added and modified of the new."""
    table = None
    for u in updates:
        table = u.added.slice(0, 0) if table is None else table
        keep = np.ones(table.num_rows, dtype=bool)
        keep[_rows(u.removed_rows)] = False
        table = table.filter(pa.array(keep))
        added = _rows(u.added_rows)
        assert added.size == u.added.num_rows
        n = table.num_rows + added.size
        new = np.zeros(n, dtype=bool)
        new[added] = True
        src = np.empty(n, dtype=np.int64)
        src[~new] = np.arange(table.num_rows)
        src[new] = table.num_rows + np.arange(added.size)
        table = pa.concat_tables([table, u.added.select(table.column_names)]).take(pa.array(src))
        for name, ranges in u.modified_rows.items():
            rows = _rows(ranges)
            assert rows.size == len(u.modified[name]) and (rows.size == 0 or rows[-1] < n)
            if name in table.column_names:
                table = _set(table, name, rows, u.modified[name])
    return table


# -- fixtures -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dh(deephaven_server):
    with deephaven_server.tables(STATIC_TABLES) as server:
        yield server
        server.forget(assigned_names(LIVE_SCRIPT))  # what the live fixture made


@pytest.fixture(scope="module")
def session(dh):
    host, port = dh.target.rsplit(":", 1)
    s = pydeephaven.Session(host=host, port=int(port))
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(dh):
    with BarrageClient(dh.target) as c:
        yield c


@pytest.fixture(scope="module")
def types_expected(dh, client):
    """(the server's DoGet of static_types, the client's snapshot of it)."""
    return doget(dh, "static_types"), client.snapshot("static_types")


@dataclass
class Live:
    subs: dict[str, Subscription]
    updates: dict[str, list[Update]]
    final: dict[str, pa.Table]
    readers: dict[str, list[threading.Thread]]  # the threads that delivered each subscription's updates


def divergence(sub: Subscription, expected: pa.Table, updates: list[Update]) -> str:
    """What a subscription that did not catch up holds against the server's state, and the last
    updates it applied (a failure of the live fixture is rare: this is what there is to read)."""
    got = sub.table
    lines = [f"held {got.num_rows} rows, the server {expected.num_rows}",
             f"held: {got.to_pylist()}", f"server: {expected.to_pylist()}"]
    for u in updates[-8:]:
        lines.append(f"update seq {u.first_seq}-{u.last_seq} snapshot={u.is_snapshot} size={u.table_size} "
                     f"added={u.added_rows.tolist()} removed={u.removed_rows.tolist()} "
                     f"modified={ {c: r.tolist() for c, r in u.modified_rows.items()} } shifts={u.shifts.tolist()} "
                     f"reconnected={u.reconnected}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def live(dh, session, client):
    """Writes the source in steps; after each one, waits until the server has all its rows and
    every subscription holds the server's new state (its view of it). The set_view calls are made
    once a third of the rows are written, and the next step is written right after them."""
    session.run_script(LIVE_SCRIPT)
    written = 0

    def write(count: int) -> None:
        nonlocal written
        session.run_script(f"_write_src({written}, {count})")
        written += count

    def server_has_all_rows() -> None:
        deadline = time.monotonic() + 30
        while doget(dh, "src").num_rows < written:
            assert time.monotonic() < deadline, f"the server did not get {written} source rows"
            time.sleep(0.05)

    write(FIRST_ROWS)
    server_has_all_rows()
    updates: dict[str, list[Update]] = {name: [] for name in SPECS}
    readers: dict[str, list[threading.Thread]] = {name: [] for name in SPECS}
    views = {name: {k: v for k, v in spec.kw.items() if k in ("viewport", "reverse", "columns")}
             for name, spec in SPECS.items()}

    def recorder(name: str):
        def record(u: Update) -> None:  # called on the reader thread of the stream that delivered `u`
            updates[name].append(u)
            if threading.current_thread() not in readers[name]:
                readers[name].append(threading.current_thread())
        return record

    subs = {name: client.subscribe(spec.table, on_update=recorder(name), min_update_interval_ms=CYCLE_MS, **spec.kw)
            for name, spec in SPECS.items()}

    def caught_up() -> None:
        server_has_all_rows()
        # nothing is written meanwhile, so the server's tables settle at the state of `written`
        # rows; each subscription must reach it. The server's table is read again at each look: a
        # read of a derived table on a loaded machine once came back older than what the client
        # already held (a subscription cannot go back to it)
        for name, spec in SPECS.items():
            deadline = time.monotonic() + 30
            while True:
                expected = view_of(doget(dh, spec.table), **views[name])
                if subs[name].wait_for(lambda s, expected=expected: s.table.equals(expected), 1.0):
                    break
                assert time.monotonic() < deadline, \
                    f"{name} did not catch up at {written} source rows: {subs[name].error}\n" \
                    + divergence(subs[name], expected, updates[name])

    try:
        for name, sub in subs.items():
            assert sub.wait_for(lambda s: s.update_count > 0, 30), f"{name}: {sub.error}"
        caught_up()
        while written < ROWS // 3:
            write(STEP_ROWS)
            caught_up()
        for name, spec in SPECS.items():
            if spec.change:
                subs[name].set_view(**spec.change)
                views[name] = spec.final_view()
        while written < ROWS:
            write(min(STEP_ROWS, ROWS - written))
            caught_up()
        final = {name: stable_doget(dh, name) for name in LIVE_TABLES}
        yield Live(subs, updates, final, readers)
    finally:
        for sub in subs.values():
            sub.close()


# -- discovery and snapshots ---------------------------------------------------------------------------

def test_tables_lists_the_servers_tables(client, session):
    names = client.tables()
    assert {"static_types", "big_static", "forever"} <= set(names)
    # pydeephaven fills session.tables from a ListFields stream in the background: it may not have
    # heard of every table yet when the test starts
    assert until(lambda: sorted(session.tables) == sorted(names)), (sorted(names), sorted(session.tables))


def test_snapshot_of_every_type_equals_the_servers(types_expected):
    server, got = types_expected
    assert server.num_rows == got.num_rows == 1000
    assert got.column_names == server.column_names
    # the client's natural types for Deephaven's wire encodings
    assert pa.types.is_decimal(got.schema.field("BD").type) and got.schema.field("BD").type.scale == 3
    assert got.schema.field("BI").type == pa.decimal128(38, 0)
    assert got.schema.field("LD").type == pa.date32()
    expected = natural(server, got.schema)
    assert all(col.null_count > 0 for col in expected.columns)  # every column has nulls
    for name in got.column_names:
        assert got.column(name).equals(expected.column(name)), name
    assert got.equals(expected)


@pytest.mark.parametrize("columns, viewport, reverse", [
    (["Str", "I32", "BD"], None, False),
    (None, [(0, 4), (500, 999)], False),  # 505 rows + 5: more than the server's first piece
    (["LD", "IA", "Ts"], [(0, 9), (100, 899)], True),
    (["Ch"], [(990, 1200)], False),  # past the end
])
def test_snapshot_with_columns_and_viewport(types_expected, client, columns, viewport, reverse):
    server, whole = types_expected
    expected = view_of(natural(server, whole.schema), viewport=viewport, reverse=reverse, columns=columns)
    got = client.snapshot("static_types", columns=columns, viewport=viewport, reverse=reverse)
    assert got.column_names == expected.column_names
    assert got.num_rows == expected.num_rows
    assert got.equals(expected)


def test_snapshots_of_a_large_static_table_arrive_whole(dh, client):
    """Deephaven sends these in several pieces, and messages of more than 65 536 rows; column
    subsets without the first column (Y, S) are among them."""
    server = doget(dh, "big_static")
    assert server.num_rows == 200_000
    assert plain(client.snapshot("big_static")).equals(server)
    assert client.snapshot("big_static", columns=["S", "X"]).equals(server.select(["S", "X"]))
    assert client.snapshot("big_static", columns=["S", "Y"]).equals(server.select(["S", "Y"]))
    vp = [(0, 49_999), (120_000, 199_999)]
    assert client.snapshot("big_static", viewport=vp).equals(view_of(server, viewport=vp))
    assert client.snapshot("big_static", viewport=[(0, 99_999)], reverse=True, columns=["Y"]).equals(
        server.slice(100_000).select(["Y"]))


def test_full_and_viewport_subscriptions_to_static_tables(dh, client, types_expected):
    server, whole = types_expected
    expected = natural(server, whole.schema)
    big = doget(dh, "big_static")
    subs = {
        "types": (client.subscribe("static_types"), expected),
        "types_vp": (client.subscribe("static_types", viewport=[(3, 7), (900, 1100)], columns=["Str", "BD", "IA"]),
                     view_of(expected, viewport=[(3, 7), (900, 1100)], columns=["Str", "BD", "IA"])),
        "big": (client.subscribe("big_static"), big),
        "big_vp": (client.subscribe("big_static", viewport=[(0, 99_999)], reverse=True),
                   view_of(big, viewport=[(0, 99_999)], reverse=True)),
        "big_columns": (client.subscribe("big_static", columns=["Y"]), big.select(["Y"])),
        "big_vp_columns": (client.subscribe("big_static", viewport=[(10, 150_009)], columns=["S", "Y"]),
                           view_of(big, viewport=[(10, 150_009)], columns=["S", "Y"])),
    }
    try:
        for name, (sub, exp) in subs.items():
            assert sub.wait_for(lambda s, n=exp.num_rows: s.table.num_rows == n, 60), f"{name}: {sub.error}"
            assert sub.table.equals(exp), name
            assert sub.error is None
        assert subs["types"][0].size == 1000 and subs["types_vp"][0].size == 1000
        assert subs["big_vp"][0].size == 200_000
    finally:
        for sub, _ in subs.values():
            sub.close()


# -- ticking tables ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SPECS))
def test_subscription_converges_to_the_servers_snapshot(live, name):
    spec, sub = SPECS[name], live.subs[name]
    server = live.final[spec.table]
    expected = view_of(server, **spec.final_view())
    ok = sub.wait_for(lambda s: s.table.equals(expected), 30)
    assert sub.error is None, sub.error
    assert ok, f"{name}: held\n{sub.table.to_pandas()}\nserver\n{expected.to_pandas()}"
    assert sub.size == server.num_rows  # rows held (full) or the table's size (viewport)
    assert len(live.updates[name]) > 1  # the snapshot and then deltas


def test_the_ticking_tables_changed_in_every_way(live):
    """The scenario's premise: while the client read them, rows were added, modified, removed
    and shifted, and each view change was answered with a snapshot (the fixture makes the set_view
    calls at 40 of the 120 rows and writes the rest after them)."""

    def count(name, what):
        return sum(1 for u in live.updates[name] if not u.is_snapshot and what(u))

    assert count("app_full", lambda u: u.added.num_rows > 0) >= 5
    assert count("app_full", lambda u: u.removed_rows.size or u.modified_rows) == 0
    assert count("keyed_full", lambda u: bool(u.modified_rows)) >= 5
    assert count("filtered_full", lambda u: u.removed_rows.size > 0) >= 3
    assert count("sorted_full", lambda u: u.shifts.size > 0) >= 3
    assert count("flat_full", lambda u: u.shifts.size > 0) >= 3
    assert count("ring_full", lambda u: u.removed_rows.size > 0) >= 3
    assert count("sorted_viewport", lambda u: u.removed_rows.size > 0 or bool(u.modified_rows)) >= 3
    # a view change is answered by a snapshot
    for name, spec in SPECS.items():
        if spec.change:
            assert sum(u.is_snapshot for u in live.updates[name]) >= 2, name


@pytest.mark.parametrize("name", REPLAYED)
def test_replaying_the_delivered_updates_gives_the_servers_snapshot(live, name):
    spec, sub = SPECS[name], live.subs[name]
    expected = view_of(live.final[spec.table], **spec.final_view())
    assert sub.wait_for(lambda s: s.table.equals(expected), 30), name
    replay = replay_viewport if "viewport" in spec.kw else replay_full
    assert replay(list(live.updates[name])).equals(expected)


def test_full_subscription_changes_columns_on_a_new_stream(live):
    """Deephaven refuses changes to a full subscription; the client re-subscribes instead."""
    sub = live.subs["keyed_full_columns_change"]
    expected = live.final["keyed"].select(["Key", "Val", "Cnt"])
    assert sub.wait_for(lambda s: s.table.equals(expected), 30), sub.error
    assert not sub.closed and sub.error is None
    readers = live.readers["keyed_full_columns_change"]  # a new stream and reader took over from the first
    assert len(readers) == 2 and not readers[0].is_alive()
    with pytest.raises(ClientError, match="full subscription"):
        sub.set_view(viewport=[(0, 1)])


# -- errors and shutdown ------------------------------------------------------------------------------------

def test_unknown_tables_fail_clearly_and_closing_leaves_no_threads(dh):
    before = set(threading.enumerate())
    c = BarrageClient(dh.target)
    keepalive = [t for t in threading.enumerate() if t not in before and t.name == "tickwire-client-keepalive"]
    assert len(keepalive) == 1  # the client keeps its session alive from a thread of its own
    delivered: list[set[threading.Thread]] = [set(), set(), set()]  # the reader threads of each subscription

    def recorder(i: int):
        return lambda _u: delivered[i].add(threading.current_thread())

    subs = [c.subscribe("forever", min_update_interval_ms=CYCLE_MS, on_update=recorder(0)),
            c.subscribe("forever", viewport=[(0, 4)], reverse=True, min_update_interval_ms=CYCLE_MS,
                        on_update=recorder(1)),
            c.subscribe("big_static", columns=["X"], on_update=recorder(2))]
    for sub in subs:
        assert sub.wait_for(lambda s: s.update_count >= 2 or s.size == 200_000, 30), sub.error
    assert all(delivered)
    forever = doget(dh, "forever")
    assert subs[0].size >= 1 and forever.num_rows >= subs[0].size

    missing = c.subscribe("no_such_table")
    with pytest.raises(ClientError) as err:
        list(missing.updates(timeout=30))
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    assert "subscription to 'no_such_table'" in str(err.value) and "not found" in str(err.value)
    assert missing.closed and missing.error is err.value
    with pytest.raises(ClientError, match="no data yet for 'no_such_table'"):
        _ = missing.table
    with pytest.raises(ClientError, match="has ended"):
        missing.set_view(columns=["X"])
    for call in (lambda: c.snapshot("no_such_table"),
                 lambda: c.snapshot("no_such_table", viewport=[(0, 1)]),
                 lambda: c.subscribe("no_such_table", columns=["X"])):
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.code == grpc.StatusCode.NOT_FOUND and "no_such_table" in str(err.value)
    with pytest.raises(ClientError, match=r"no columns \['Nope'\]"):
        c.subscribe("big_static", columns=["Nope"])

    subs[0].close()
    assert subs[0].closed and not any(t.is_alive() for t in delivered[0])
    # every reader of the client's subscriptions: those that delivered updates and those still running
    readers = set().union(*delivered) | {t for t in threading.enumerate()
                                         if t not in before and t.name.startswith("tickwire-sub-")}
    c.close()
    assert not any(t.is_alive() for t in readers)
    assert not keepalive[0].is_alive()
    deadline = time.monotonic() + 10
    while True:
        extra = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert extra == [], extra


def test_pre_shared_key(deephaven_psk_server):
    with deephaven_psk_server.tables(
        "from deephaven import empty_table, time_table\n"
        "small = empty_table(7).update(['X = i * 3', 'S = `r` + i'])\n"
        "ticks = time_table('PT0.1S').update(['Seq = ii'])\n"
    ) as server:
        with BarrageClient(server.target, psk=DH_PSK) as c:
            assert {"small", "ticks"} <= set(c.tables())
            assert c.snapshot("small").equals(doget(server, "small"))
            assert c.snapshot("small", viewport=[(5, 9)]).column("X").to_pylist() == [15, 18]
            sub = c.subscribe("ticks", min_update_interval_ms=CYCLE_MS)
            assert sub.wait_for(lambda s: s.update_count >= 3, 30), sub.error
            seq = sub.table.column("Seq").to_numpy()
            assert seq.size >= 1 and np.array_equal(seq, np.arange(seq.size))
            sub.close()
        for kw in ({"psk": "wrong-key"}, {}):  # a wrong key, and anonymous
            with pytest.raises(ClientError) as err:
                BarrageClient(server.target, **kw)
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
