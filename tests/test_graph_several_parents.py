"""Tables with several parents in the update graph (what joins, merges and where_in build on).

A derived table with several parents runs once per cycle, after every parent has delivered its
update for that cycle, and is handed the updates of those that changed (none of the others); when
no parent changed it does not run. Diamonds (a -> b, a -> c, d(b, c)), parents at different depths
and parents from independent sources are checked with a recording table, cycle by cycle.
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph import TableUpdate
from tickwire.server.engine.graph.tables import Table

SCHEMA = pa.schema([("x", pa.int64())])


class Recorder(Table):
    """Follows several parents and records, per call: the step, which parents' updates it was
    handed, and each parent's (last step, row count) at that moment."""

    def __init__(self, engine: Engine, name: str, parents: list[Table]):
        with engine.graph.lock:
            super().__init__(engine.graph, name, SCHEMA, parents=parents)
        self.calls: list[tuple[int, tuple[str, ...], tuple[tuple[int, int], ...]]] = []

    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        mine = tuple(sorted(p.name for p in self.parents if p.name in updates))
        self.calls.append((step, mine, tuple((p.last_step, p.size) for p in self.parents)))
        return None


def _rows(*xs: int) -> pa.Table:
    return pa.table({"x": pa.array(xs, pa.int64())})


def test_a_diamond_runs_its_join_once_per_cycle_after_both_sides():
    engine = Engine()
    a = engine.create(TableSpec("a", "append", SCHEMA))
    b = a.where(pc.field("x") > 0, name="b")
    c = a.select(["x"], name="c")
    d = Recorder(engine, "d", [b, c])
    engine.write(a, _rows(1, -1, 2))
    engine.run_cycle()
    step = engine.graph.step
    # handed both sides' updates, each side already at this cycle's state
    assert d.calls == [(step, ("b", "c"), ((step, 2), (step, 3)))]
    # a change that the filter drops: only the other side's update, once
    engine.write(a, _rows(-5))
    engine.run_cycle()
    step2 = engine.graph.step
    assert d.calls[1:] == [(step2, ("c",), ((step, 2), (step2, 4)))]
    # a cycle with nothing written: no call
    engine.run_cycle()
    assert len(d.calls) == 2


def test_parents_at_different_depths_are_all_done_first():
    engine = Engine()
    a = engine.create(TableSpec("a", "append", SCHEMA))
    deep = a.where(pc.field("x") > 0, name="w1").where(pc.field("x") > 1, name="w2").select(["x"], name="w3")
    d = Recorder(engine, "d", [deep, a])
    assert d.depth > deep.depth
    for i in range(5):
        engine.write(a, _rows(i, i + 1))
        engine.run_cycle()
        step = engine.graph.step
        got_step, handed, (at_deep, at_a) = d.calls[-1]
        assert got_step == step and len(d.calls) == i + 1  # once a cycle
        assert at_a == (step, 2 * (i + 1))
        if i == 0:  # rows 0 and 1 do not reach the deep parent: only the source's update
            assert handed == ("a",) and at_deep[0] < step
        else:  # the deep parent has done this cycle before the child runs
            assert handed == ("a", "w3") and at_deep == (step, deep.size)


def test_parents_from_independent_sources_each_hand_over_their_own_update():
    engine = Engine()
    s1 = engine.create(TableSpec("s1", "append", SCHEMA))
    s2 = engine.create(TableSpec("s2", "keyed", SCHEMA, keys=["x"]))
    d = Recorder(engine, "d", [s1.select(["x"], name="v1"), s2])
    engine.write(s2, _rows(7))
    engine.run_cycle()
    assert [c[1] for c in d.calls] == [("s2",)]
    engine.write(s1, _rows(1))
    engine.write(s2, _rows(8))
    engine.run_cycle()
    assert [c[1] for c in d.calls] == [("s2",), ("s2", "v1")]
    engine.write(s1, _rows(2))
    engine.run_cycle()
    assert [c[1] for c in d.calls] == [("s2",), ("s2", "v1"), ("v1",)]
    assert d.calls[-1][2] == ((engine.graph.step, 2), (engine.graph.step - 1, 2))
