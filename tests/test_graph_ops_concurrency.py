"""Derived tables while producers add on several threads, readers snapshot and the graph runs on its
own thread; and the updates of a sorted table (with shifts) coalesced over several cycles."""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tests.test_graph_ops import Follower, ref_sort, same_table
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph import ROW_KEY, apply_update

SCHEMA = pa.schema([("sym", pa.string()), ("px", pa.float64()), ("vol", pa.int64())])


def _rows(rng, n: int, syms: int = 60) -> pa.Table:
    return pa.table({"sym": pa.array([f"s{x}" for x in rng.integers(0, syms, n).tolist()], pa.string()),
                     "px": pa.array(np.round(rng.random(n) * 100, 2), pa.float64(), mask=rng.random(n) < 0.05),
                     "vol": pa.array(rng.integers(0, 10**9, n), pa.int64())}, schema=SCHEMA)


def test_snapshots_of_derived_tables_equal_recomputation_at_their_step():
    engine = Engine(interval_ms=3)
    quotes = engine.create(TableSpec("quotes", "keyed", SCHEMA, keys=["sym"]))
    trades = engine.create(TableSpec("trades", "append", SCHEMA))
    top = quotes.where(pc.field("px") > 30).sort("px", descending=True).head(10)
    view = quotes.view(["sym", ("notional", pc.field("px") * pc.field("vol"))])
    ranked = trades.last_by("sym").sort("vol")
    stop = threading.Event()
    errors: list[str] = []
    checked = {"top": 0, "view": 0, "ranked": 0}
    steps_seen = set()

    produce = threading.Event()
    produce.set()

    def producer(seed, table):
        rng = np.random.default_rng(seed)
        while produce.is_set():
            engine.write(table, _rows(rng, int(rng.integers(1, 20))), wait=False)
            time.sleep(0.002)

    def reader():
        while not stop.is_set():
            with engine.reading():  # one cycle boundary for all the reads below
                s1, q = engine.step, quotes.gather_with_keys()
                s2, t = engine.snapshot(top)
                s3, v = engine.snapshot(view)
                tr = trades.gather_with_keys()
                s4, r = engine.snapshot(ranked)
            if not (s1 == s2 == s3 == s4):
                errors.append(f"steps differ: {s1} {s2} {s3} {s4}")
            steps_seen.add(s1)
            qrows = q.to_pylist()
            want_top = ref_sort([x for x in qrows if x["px"] is not None and x["px"] > 30], ["px"], [True])[:10]
            if t.to_pylist() != [{k: x[k] for k in SCHEMA.names} for x in want_top]:
                errors.append(f"top differs at step {s1}")
            checked["top"] += 1
            want_view = [{"sym": x["sym"], "notional": None if x["px"] is None else x["px"] * x["vol"]} for x in qrows]
            got_view = v.to_pylist()
            if len(got_view) != len(want_view) or any(
                    a["sym"] != b["sym"] or (a["notional"] is None) != (b["notional"] is None) or
                    (a["notional"] is not None and not math.isclose(a["notional"], b["notional"]))
                    for a, b in zip(got_view, want_view)):
                errors.append(f"view differs at step {s1}")
            checked["view"] += 1
            latest = {}
            for x in tr.to_pylist():
                latest[x["sym"]] = {k: x[k] for k in SCHEMA.names}
            want_ranked = sorted(latest.values(), key=lambda x: x["vol"])  # volumes are distinct
            if r.to_pylist() != want_ranked:
                errors.append(f"ranked differs at step {s1}")
            checked["ranked"] += 1

    engine.start()
    producers = [threading.Thread(target=producer, args=(1, quotes)),
                 threading.Thread(target=producer, args=(2, quotes)),
                 threading.Thread(target=producer, args=(3, trades))]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for th in producers + readers:
        th.start()
    # at least 2.5 s, and on until enough reads of enough cycle boundaries (a slow machine needs longer)
    start = time.monotonic()
    while time.monotonic() - start < 90:
        time.sleep(0.1)
        if time.monotonic() - start >= 2.5 and min(checked.values()) > 20 and len(steps_seen) > 10:
            break
    produce.clear()
    for th in producers:
        th.join(60)
    time.sleep(0.05)
    stop.set()
    for th in readers:
        th.join(30)
    engine.stop()
    assert not errors, errors[:5]
    assert not engine.errors, engine.errors[0]
    assert min(checked.values()) > 20 and len(steps_seen) > 10, (checked, len(steps_seen))


def test_coalesced_updates_of_a_sorted_table_with_shifts_give_the_new_state():
    rng = np.random.default_rng(5)
    engine = Engine()
    quotes = engine.create(TableSpec("quotes", "keyed", SCHEMA, keys=["sym"]))
    engine.write(quotes, _rows(rng, 200, syms=400))
    engine.run_cycle()
    s = quotes.sort(["px"], [False], name="by_px", spacing=2)  # tight keys: crowded gaps shift rows
    follower = Follower(s)
    states = [(s.rowset, s.gather_with_keys())]
    updates = []
    s.add_listener(lambda t, up, step: updates.append(up))
    for _cycle in range(40):
        engine.write(quotes, _rows(rng, int(rng.integers(1, 30)), syms=400))
        if rng.random() < 0.3:
            engine.write(quotes, delete=_rows(rng, int(rng.integers(1, 10)), syms=400).select(["sym"]))
        before = len(updates)
        engine.run_cycle()
        assert not engine.errors, engine.errors[0]
        if len(updates) == before:  # no change this cycle: keep the lists aligned
            updates.append(None)
        states.append((s.rowset, s.gather_with_keys()))
    assert follower.shifts > 0
    windows = 0
    for start in range(len(updates)):
        for length in (2, 3, 5, 8):
            chunk = [u for u in updates[start:start + length] if u is not None]
            if len(chunk) < 2 or start + length > len(updates):
                continue
            prev_rs, prev_state = states[start]
            new_rs, new_state = states[start + length]
            total = chunk[0]
            for u in chunk[1:]:
                total = total.coalesce(u, prev_rs)
            total.validate(prev_rs, new_rs)
            # the values after the last update of the rows it adds or modifies
            changed = total.added.union(total.modified)
            values = new_state.filter(pa.array(changed.contains(new_state.column(ROW_KEY).to_numpy())))
            got = apply_update(prev_state, total, values)
            assert same_table(got, new_state), (start, length)
            windows += 1
    assert windows > 50
