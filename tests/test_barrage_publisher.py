"""Publisher convergence: random source traffic (removes, shifts, adds, modifies) served to
subscribers of every shape; each subscriber's messages are encoded to FlightData, decoded, and
applied to a client-side state, which must equal the expected slice of the table after every
step. A failure prints the seed and step to replay."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tests.scripted import random_update, scripted_table
from tickwire.clients.state import TableState
from tickwire.clock import ManualClock
from tickwire.protocol.update import StreamDecoder
from tickwire.server.engine import Engine, PublishingConfig
from tickwire.server.engine.graph import RowSet
from tickwire.server.engine.publishing import SubscriptionError, TableWire, View, window_keys


class Client:
    """One subscription plus the client-side decoder and state."""

    def __init__(self, registry, table, view: View, *, as_list=False, dh_nulls=False, batch_size=0):
        from tickwire.protocol.barrage import SubscriptionOptions
        self.opts = SubscriptionOptions(columns_as_list=as_list, use_deephaven_nulls=dh_nulls, batch_size=batch_size)
        self.view = view
        self.notified = 0
        self.sub = registry.subscribe(table, view, self.opts, self._notify)
        wire = TableWire(table)
        self.decoder = StreamDecoder(columns_as_list=as_list, use_deephaven_nulls=dh_nulls)
        self.decoder.feed(wire.schema_payload(as_list))
        schema = self.decoder.schema
        self.state = TableState(schema, viewport=view.viewport is not None)
        self.messages = []
        self.taken = []  # the Message objects taken (to see which ones are shared)

    def _notify(self):
        self.notified += 1

    def pump(self) -> int:
        n = 0
        while True:
            msg = self.sub.take()
            if msg is None:
                return n
            self.taken.append(msg)
            for p in msg.payloads(self.sub.encode):
                u = self.decoder.feed(p)
                if u is not None:
                    self.state.apply(u)
                    self.messages.append(u.metadata)
                    n += 1

    def change(self, view: View):
        self.sub.change(view)
        self.view = view

    def expected(self, table) -> pa.Table:
        names = [table.schema.names[i] for i in self.view.columns]
        if self.view.viewport is None:
            return table.gather(names)
        return table.gather(names, window_keys(table.rowset, self.view.viewport, self.view.reverse))

    def check(self, table, where: str) -> None:
        got = self.state.to_arrow().select([table.schema.names[i] for i in self.view.columns])
        exp = self.expected(table)
        assert got.num_rows == exp.num_rows, f"{where}: {got.num_rows} rows, expected {exp.num_rows}"
        assert got.equals(exp), f"{where}: values differ\n{got.to_pydict()}\n{exp.to_pydict()}"
        if self.view.viewport is not None:
            assert self.state.table_size == table.size, where


def vp(*ranges) -> RowSet:
    return RowSet.from_ranges(np.array(ranges, dtype=np.int64).reshape(-1, 2))


ALL = (0, 1, 2)
SHAPES = {
    "full": View(ALL),
    "full_cols": View((0, 2)),
    "header": View(ALL, vp((0, 9))),
    "floating": View(ALL, vp((20, 44))),
    "footer": View(ALL, vp((0, 14)), reverse=True),
    "reverse_floating": View((1,), vp((10, 30)), reverse=True),
    "swiss": View(ALL, vp((0, 2), (7, 9), (30, 31), (100, 140))),
    "past_end": View(ALL, vp((5000, 5010))),
}


def _setup(seed, clock=None):
    """An engine stepped by the test, a scripted table of it and a registry of publishers."""
    engine = Engine(interval_ms=10_000, clock=clock)
    table = scripted_table(engine, "t")
    registry = engine.publishers()
    return engine, table, registry


def _started(rng, max_add: int, clock=None):
    """An engine, a scripted table holding one cycle of random rows, a registry, and the keys."""
    engine, table, registry = _setup(0, clock)
    upd, vals, keys = random_update(rng, np.empty(0, dtype=np.int64), max_add=max_add)
    engine.write(table, (upd, vals), wait=False)
    engine.run_cycle()
    return engine, table, registry, keys


@pytest.mark.parametrize("seed", range(12))
def test_every_shape_converges_after_every_step(seed):
    rng = np.random.default_rng(seed)
    engine, table, registry = _setup(seed)
    keys = np.empty(0, dtype=np.int64)
    # some rows before anyone subscribes
    for _ in range(3):
        upd, vals, keys = random_update(rng, keys, max_add=60)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
    clients = {}
    for i, (name, view) in enumerate(SHAPES.items()):
        clients[name] = Client(registry, table, view, as_list=(i % 3 == 0), dh_nulls=(i % 2 == 0),
                               batch_size=int(rng.choice([0, 7])))
    step = 0
    try:
        for c in clients.values():
            c.pump()
            c.check(table, f"snapshot of {c.view}")
        for step in range(40):
            for _ in range(int(rng.integers(1, 3))):  # sometimes two updates coalesce in one cycle
                upd, vals, keys = random_update(rng, keys)
                engine.write(table, (upd, vals), wait=False)
            engine.run_cycle()
            for name, c in clients.items():
                c.pump()
                c.check(table, f"{name} after step {step}")
    except AssertionError:
        print(f"replay: seed {seed} step {step}")
        raise


@pytest.mark.parametrize("seed", range(8))
def test_slow_subscriber_gets_one_coalesced_update_and_converges(seed):
    rng = np.random.default_rng(100 + seed)
    engine, table, registry, keys = _started(rng, 80)
    fast = Client(registry, table, SHAPES["full"])
    slow = Client(registry, table, SHAPES["full"])
    slow_vp = Client(registry, table, SHAPES["floating"])
    for c in (fast, slow, slow_vp):
        c.pump()
    stalled_cycles = 15
    for step in range(stalled_cycles):
        upd, vals, keys = random_update(rng, keys)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        fast.pump()
        fast.check(table, f"fast subscriber at step {step}")
        # the stalled subscribers hold at most one message, whatever the number of cycles
        assert slow.sub.pending() <= 1 and slow_vp.sub.pending() <= 1
    # reading again: the message queued before the stall, then one coalesced message at once
    assert slow.pump() == 2 and slow_vp.pump() == 2
    md = slow.messages[-1]
    assert md.last_seq - md.first_seq >= stalled_cycles - 2  # first_seq..last_seq span the coalesced steps
    slow.check(table, "slow full subscriber after catching up")
    slow_vp.check(table, "slow viewport subscriber after catching up")
    assert slow.sub.coalesced >= stalled_cycles - 2


@pytest.mark.parametrize("seed", range(8))
def test_viewport_and_column_changes_mid_stream(seed):
    rng = np.random.default_rng(200 + seed)
    engine, table, registry, keys = _started(rng, 120)
    c = Client(registry, table, View(ALL, vp((0, 9))), as_list=bool(seed % 2))
    c.pump()
    views = [View(ALL, vp((5, 19))), View((0,), vp((5, 19))), View(ALL, vp((5, 19))),
             View(ALL, vp((0, 9)), reverse=True), View((1, 2), vp((3, 3), (50, 60))), View(ALL, vp((0, 0)))]
    step = 0
    try:
        for step in range(30):
            upd, vals, keys = random_update(rng, keys)
            engine.write(table, (upd, vals), wait=False)
            if step % 4 == 1:
                c.change(views[(step // 4) % len(views)])
                if rng.random() < 0.5:
                    c.pump()  # answered before the next cycle, or after it with the cycle's changes
            engine.run_cycle()
            c.pump()
            c.check(table, f"step {step}")
        snaps = [m for m in c.messages if m.is_snapshot]
        assert len(snaps) >= 1 + 30 // 4 - 1
        for m in snaps:
            assert m.effective_viewport is not None and m.shift_data is None
    except AssertionError:
        print(f"replay: seed {seed} step {step}")
        raise


def test_full_to_viewport_change_is_refused():
    engine, table, registry = _setup(0)
    c = Client(registry, table, View(ALL))
    with pytest.raises(SubscriptionError, match="full subscription to viewport"):
        c.change(View(ALL, vp((0, 5))))


def test_blink_subscribers_see_each_cycle_replace_the_last():
    rng = np.random.default_rng(5)
    engine, table, registry = _setup(0)
    table.attributes["BlinkTable"] = True
    keys = np.empty(0, dtype=np.int64)
    full = Client(registry, table, View(ALL), as_list=True, dh_nulls=True)
    head = Client(registry, table, View(ALL, vp((0, 4))))
    for step in range(15):
        upd, vals, keys = random_update(rng, keys, blink=True)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        for c in (full, head):
            c.pump()
            c.check(table, f"blink step {step}")
    with pytest.raises(SubscriptionError, match="reverse viewports"):
        Client(registry, table, View(ALL, vp((0, 4)), reverse=True))


def test_metadata_fields_follow_deephaven_per_message_kind():
    rng = np.random.default_rng(9)
    engine, table, registry, keys = _started(rng, 50)
    full = Client(registry, table, View(ALL))
    vpc = Client(registry, table, View(ALL, vp((0, 9))))
    full.pump()
    vpc.pump()
    snap = full.messages[0]
    assert snap.is_snapshot and snap.effective_viewport is None  # full snapshots never echo a viewport
    assert snap.removed_rows is not None and snap.shift_data is not None
    assert len(snap.mod_column_nodes) == 3 and snap.table_size == table.size
    assert np.array_equal(snap.added_rows, snap.added_rows_included)
    assert list(snap.effective_column_set) == [0, 1, 2]
    vsnap = vpc.messages[0]
    assert vsnap.is_snapshot and vsnap.shift_data is None and vsnap.added_rows_included is None
    assert np.array_equal(vsnap.effective_viewport, np.array([[0, 9]]))
    upd, vals, keys = random_update(rng, keys)
    engine.write(table, (upd, vals), wait=False)
    engine.run_cycle()
    full.pump()
    vpc.pump()
    delta = full.messages[-1]
    assert not delta.is_snapshot and delta.effective_viewport is None and delta.effective_column_set is None
    assert delta.added_rows is not None and delta.removed_rows is not None and delta.shift_data is not None
    assert len(delta.mod_column_nodes) == 3
    assert delta.first_seq == delta.last_seq == engine.step
    vdelta = vpc.messages[-1]
    assert vdelta.shift_data is None and vdelta.table_size == table.size


def test_unsubscribe_releases_the_table_listener():
    engine, table, registry = _setup(0)
    a = Client(registry, table, View(ALL))
    b = Client(registry, table, View(ALL, vp((0, 3))))
    assert len(table.listeners) == 1
    a.sub.close()
    assert len(table.listeners) == 1
    b.sub.close()
    assert table.listeners == [] and registry.subscriptions == []
    assert a.sub.take() is None


@pytest.mark.parametrize("seed", range(6))
def test_large_full_snapshot_grows_in_pieces_with_changes_between(seed):
    """A full subscription to a big refreshing table gets its snapshot in pieces (in key order,
    `added_rows` = whole table, `added_rows_included` = the piece), with the changes to rows
    already delivered sent between pieces; every intermediate state holds current values, and
    the final state is the table."""
    rng = np.random.default_rng(300 + seed)
    engine = Engine(interval_ms=10_000)
    table = scripted_table(engine, "t")
    registry = engine.publishers(PublishingConfig(min_piece_cells=60, max_piece_cells=90))
    keys = np.empty(0, dtype=np.int64)
    upd, vals, keys = random_update(rng, keys, max_add=300, span=2000)
    engine.write(table, (upd, vals), wait=False)
    engine.run_cycle()
    c = Client(registry, table, SHAPES["full"])
    as_list = Client(registry, table, SHAPES["full"], as_list=True)  # the C++ client's form: never grown
    step = 0
    try:
        while True:
            c.pump()
            as_list.pump()
            as_list.check(table, f"columns_as_list at step {step}")
            held = c.state.keys
            got = c.state.to_arrow()
            exp = table.gather(None, held)
            assert got.equals(exp), f"partial state at step {step}"
            assert np.isin(held, table.rowset.keys()).all()
            if not c.sub.growing and c.sub.pending() == 0 and c.sub.behind is None:
                break
            upd, vals, keys = random_update(rng, keys, max_add=10)
            engine.write(table, (upd, vals), wait=False)
            engine.run_cycle()
            step += 1
            assert step < 200, "the snapshot never completed"
        c.check(table, "after growth")
        pieces = [m for m in c.messages if m.is_snapshot]
        assert len(pieces) >= 3 and as_list.messages[0].is_snapshot
        assert all(m.effective_viewport is not None for m in pieces[:-1]) and pieces[-1].effective_viewport is None
        for m in pieces:
            assert m.added_rows_included is not None
        for _ in range(5):  # and it keeps converging afterwards
            upd, vals, keys = random_update(rng, keys)
            engine.write(table, (upd, vals), wait=False)
            engine.run_cycle()
            c.pump()
            c.check(table, "after growth, live")
    except AssertionError:
        print(f"replay: seed {seed} step {step}")
        raise


def test_min_update_interval_coalesces_cycles_into_one_message():
    clock = ManualClock()
    rng = np.random.default_rng(77)
    engine, table, registry, keys = _started(rng, 50, clock)
    from tickwire.protocol.barrage import SubscriptionOptions
    slow = Client(registry, table, SHAPES["full"])
    slow.sub.interval = SubscriptionOptions(min_update_interval_ms=1000).min_update_interval_ms / 1000.0
    every = Client(registry, table, SHAPES["header"])
    slow.pump()
    every.pump()
    first = engine.step + 1
    for _ in range(5):
        clock.advance(0.1)
        upd, vals, keys = random_update(rng, keys)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        every.pump()
        every.check(table, "a subscriber at the default interval gets every cycle")
        assert slow.pump() == 0
    clock.advance(0.6)  # one second after the snapshot
    engine.run_cycle()
    assert slow.pump() == 1
    md = slow.messages[-1]
    assert (md.first_seq, md.last_seq) == (first, first + 4)
    slow.check(table, "after the interval")
    assert len(every.messages) == 6


@pytest.mark.parametrize("seed", range(6))
def test_subscribers_asking_the_same_thing_in_step_share_messages(seed):
    rng = np.random.default_rng(300 + seed)
    engine, table, registry, keys = _started(rng, 80)
    views = {"full": SHAPES["full"], "floating": SHAPES["floating"], "footer": SHAPES["footer"]}
    groups = {name: [Client(registry, table, v) for _ in range(3)] for name, v in views.items()}
    other_window = Client(registry, table, View(ALL, vp((21, 45))))
    for c in [*sum(groups.values(), []), other_window]:
        c.pump()
    for step in range(25):
        upd, vals, keys = random_update(rng, keys)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        if step in (5, 6, 7):  # nobody reads: all fall behind by the same coalesced change
            continue
        for name, members in groups.items():
            for c in members:
                c.pump()
                c.check(table, f"{name} subscriber at step {step} (replay seed {seed})")
        other_window.pump()
        other_window.check(table, f"other window at step {step}")
    for name, members in groups.items():
        # every message after the snapshots was built once and handed to all three
        firsts = [c.taken[1:] for c in members]
        assert all(len(f) == len(firsts[0]) for f in firsts)
        for msgs in zip(*firsts):
            assert msgs[0] is msgs[1] is msgs[2], f"{name}: in-step subscribers got separate messages"
    # a different window never gets another window's message
    fl = {id(m) for m in groups["floating"][0].taken}
    assert not fl & {id(m) for m in other_window.taken}


def test_a_subscriber_behind_by_its_own_coalesced_change_gets_its_own_message(seed=7):
    rng = np.random.default_rng(seed)
    engine, table, registry, keys = _started(rng, 60)
    a, b = Client(registry, table, SHAPES["floating"]), Client(registry, table, SHAPES["floating"])
    for c in (a, b):
        c.pump()
    for step in range(6):  # b stalls: its outbox fills, then its changes coalesce
        upd, vals, keys = random_update(rng, keys)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        a.pump()
        a.check(table, f"a at step {step}")
    b.pump()
    b.check(table, "b after reading again")
    assert b.sub.coalesced > 0
    assert id(b.taken[-1]) not in {id(m) for m in a.taken}, "a coalesced catch-up message was shared"


def _kept_snapshots(registry, table, firsts: dict) -> list:
    """The column sets whose initial snapshot the table's publisher keeps for later joiners, newest
    first. `firsts`: column set -> the snapshot message its subscriber took, in subscription order.
    A subscriber joining in the same step is handed the very message of a kept snapshot; one that
    was let go is built again (and kept, letting the oldest go: the probe stops there)."""
    kept = []
    for cols, first in reversed(list(firsts.items())):
        joiner = Client(registry, table, View(cols))
        joiner.pump()
        joiner.sub.close()
        if joiner.taken[0] is not first:
            break
        kept.append(cols)
    return kept


def test_subscribers_asking_for_ever_other_columns_keep_few_shared_snapshots():
    """A published table keeps at most `shared_snapshots` initial snapshots for later joiners: one
    per column set asked for would let clients make the server hold a table's worth per subset."""
    rng = np.random.default_rng(5)
    engine = Engine(interval_ms=10_000)
    table = scripted_table(engine, "t")
    registry = engine.publishers(PublishingConfig(shared_snapshots=2))
    keys = np.empty(0, dtype=np.int64)
    upd, vals, keys = random_update(rng, keys, max_add=50)
    engine.write(table, (upd, vals), wait=False)
    engine.run_cycle()
    column_sets = ((0,), (1,), (2,), (0, 1), (1, 2))
    clients = [Client(registry, table, View(cols)) for cols in column_sets]
    for c in clients:
        c.pump()
    firsts = {cols: c.taken[0] for cols, c in zip(column_sets, clients)}
    assert _kept_snapshots(registry, table, firsts) == [(1, 2), (0, 1)]  # the two newest, no more
    for step in range(3):  # every client still converges
        upd, vals, keys = random_update(rng, keys)
        engine.write(table, (upd, vals), wait=False)
        engine.run_cycle()
        for c in clients:
            c.pump()
            c.check(table, f"step {step}")
    # after the table changed, subscribers asking for the five column sets again leave two kept as well
    later = [Client(registry, table, View(cols)) for cols in column_sets]
    for c in later:
        c.pump()
    firsts = {cols: c.taken[0] for cols, c in zip(column_sets, later)}
    assert _kept_snapshots(registry, table, firsts) == [(1, 2), (0, 1)]


@pytest.mark.parametrize("array", [
    pa.array(np.arange(300, dtype=np.int64)),
    pa.array([1, None, 3] * 100, type=pa.int64()),
    pa.array([1, None, 3] * 100, type=pa.int32()).slice(5, 50),
    pa.array([1.5, None] * 33).slice(1, 21),
    pa.array(np.arange(40, dtype=np.int64)).cast(pa.timestamp("ns", tz="UTC")).slice(3, 30),
    pa.array([b"abcd", None, b"efgh"], type=pa.binary(4)),
    pa.array(["a", None, "ccc"] * 10).slice(2, 9),
    pa.array([True, None] * 5),
    pa.array(["x", "y", "x"]).dictionary_encode(),
    pa.array([[1, 2], None, [3, 4]], type=pa.list_(pa.int64(), 2)),
    pa.array([], type=pa.float32()),
])
def test_message_sizes_count_what_pyarrow_counts(array: pa.Array) -> None:
    """A message's size (subscriber statistics, chunking) is computed from the lengths of
    fixed-width columns instead of pyarrow's walk of their buffers: the same figure for the
    arrays the graph's gathers make (a validity buffer only with nulls)."""
    from tickwire.server.engine.publishing.messages import array_nbytes
    assert array_nbytes(array) == array.nbytes
    assert array_nbytes(array) == array.nbytes   # and again from the widths it keeps


def test_writers_that_empty_their_outbox_share_one_catch_up_job():
    """Slow subscribers (a message still queued when the next cycle's change came) ask, as their
    writers take that message, for the waiting change to be built at once; however many ask, one
    job per publisher is queued until it runs, and it serves every one of them: each then has its
    message, and applying them leaves each client equal to the table."""
    clock = ManualClock()
    rng = np.random.default_rng(11)
    engine, table, registry, keys = _started(rng, 40, clock)
    clients = [Client(registry, table, View(ALL)) for _ in range(6)]
    clients += [Client(registry, table, View(ALL, vp((0, 4), (9, 12)))) for _ in range(6)]
    for c in clients:
        c.pump()  # the initial snapshots
    for _ in range(2):  # two cycles: the first's message stays queued, the second's change waits behind it
        upd, vals, keys = random_update(rng, keys)
        engine.write(table, (upd, vals), wait=False)
        clock.advance(1.0)
        engine.run_cycle()
    assert all(c.sub.pending() == 1 and c.sub.behind is not None for c in clients)
    clock.advance(1.0)
    jobs = []
    for c in clients:
        msg = c.sub.take(jobs.append)
        assert msg is not None and c.sub.pending() == 0
        c.taken.append(msg)
        for p in msg.payloads(c.sub.encode):
            u = c.decoder.feed(p)
            if u is not None:
                c.state.apply(u)
    assert len(jobs) == 1  # twelve writers asked: one job
    seen = []
    for c in clients:  # what each writer would find queued when told
        c.sub.notify = lambda: seen.append([d.sub.pending() for d in clients])
    jobs.pop()()
    assert len(seen) == len(clients)  # one notice each
    assert all(pending == [1] * len(clients) for pending in seen)  # all queued before the first notice
    for i, c in enumerate(clients):
        assert c.sub.pending() == 1 and c.sub.behind is None, i
        c.pump()
        c.check(table, f"client {i} after the catch-up")
    # the next writer to ask gets a job of its own again
    upd, vals, keys = random_update(rng, keys)
    engine.write(table, (upd, vals), wait=False)
    clock.advance(1.0)
    engine.run_cycle()
    upd, vals, keys = random_update(rng, keys)
    engine.write(table, (upd, vals), wait=False)
    clock.advance(1.0)
    engine.run_cycle()
    first = clients[0]
    assert first.sub.take(jobs.append) is not None and len(jobs) == 1


def test_a_cycle_tells_its_subscribers_once_all_their_messages_are_queued():
    """A writer told of its message at once would take the interpreter lock from the cycle while
    the cycle still builds the others' messages: every subscriber is told after the last one's
    message is queued, each once per message."""
    rng = np.random.default_rng(5)
    engine, table, registry, keys = _started(rng, 30)
    seen: list[list[int]] = []
    subs = []

    def notify():
        seen.append([s.pending() for s in subs])

    for i in range(8):
        view = View(ALL) if i % 2 else View(ALL, vp((0, 3 + i)))
        subs.append(registry.subscribe(table, view, None, notify))
    for s in subs:
        while s.take() is not None:  # the initial snapshots
            pass
    seen.clear()
    upd, vals, keys = random_update(rng, keys)
    engine.write(table, (upd, vals), wait=False)
    engine.run_cycle()
    assert len(seen) == len(subs)  # one notice each
    assert all(pending == [1] * len(subs) for pending in seen)  # all queued before the first notice
