"""A derived table whose computation raises in a cycle fails, as Deephaven fails a table whose
listener raises: it records the failure and stops updating, the tables derived from it fail with
it, its parents and siblings keep updating, and its Barrage subscribers, DoGet and snapshot
requests get a FAILED_PRECONDITION status naming the table and the error instead of a table that
silently lost that cycle's rows."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tickwire.clients.client import BarrageClient, ClientError
from tickwire.server.app import TickwireServer
from tickwire.server.graph import UpdateGraph
from tickwire.server.graph.graph import TableFailedError, TableListener

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.int64()), ("y", pa.int64())])


def rows(ids, xs, ys) -> pa.Table:
    return pa.table({"id": ids, "x": xs, "y": ys}, schema=SCHEMA)


def ratio_over_one() -> pc.Expression:
    # checked division raises on a zero divisor (plain `divide` on integers would too; Deephaven's
    # `/` on integers is a double division giving Infinity, which is why the test uses pyarrow's
    # checked kernel to have a formula that really raises)
    return pc.greater(pc.divide_checked(pc.field("x"), pc.field("y")), 1)


def good(n0: int, n: int) -> pa.Table:
    ids = np.arange(n0, n0 + n, dtype=np.int64)
    return rows(ids, ids * 3, np.full(n, 2, dtype=np.int64))


# ----------------------------------------------------------------------------------------------
# the update graph
# ----------------------------------------------------------------------------------------------

FORMULAS = {
    "where divide_checked": lambda src: src.where(ratio_over_one(), name="bad"),
    "select checked cast": lambda src: src.select(["id", ("x8", pc.field("x").cast(pa.int8()))], name="bad"),
    "select multiply_checked": lambda src: src.select(
        ["id", ("sq", pc.multiply_checked(pc.field("x"), pc.field("x")))], name="bad"),
    "sort of a view whose formula raises": lambda src: src.view(
        ["id", ("q", pc.divide_checked(pc.field("x"), pc.field("y")))], name="bad_view").sort("q", name="bad"),
    "where with a callable that raises": lambda src: src.where(
        lambda v: pc.greater(pc.divide(v["x"], v["y"]), 1), columns=["x", "y"], name="bad"),
}


@pytest.mark.parametrize("make", FORMULAS.values(), ids=list(FORMULAS))
def test_a_derived_table_whose_formula_raises_fails_and_the_rest_keeps_updating(make):
    g = UpdateGraph()
    src = g.append_table("src", SCHEMA)
    src.add(good(0, 5))
    g.run_cycle()
    bad = make(src)
    child = bad.where(pc.field("id") >= 0, name="child")
    grandchild = child.head(3, name="grandchild")
    sibling = src.where(pc.field("x") > 3, name="sibling")
    assert bad.failure is None and bad.size > 0
    heard: list[tuple[str, str]] = []
    updates: list[int] = []
    for t in (bad, child, grandchild):
        t.add_listener(TableListener(lambda table, up, step: updates.append(step),
                                     lambda table, failure: heard.append((table.name, failure.message))))
    t_plain = []
    bad.add_listener(lambda table, up, step: t_plain.append(step))  # no on_failure: never called again

    src.add(good(5, 3))
    g.run_cycle()  # step 2: fine
    assert updates and set(updates) == {2} and t_plain == [2]
    before = bad.to_arrow()
    # step 3: one row makes the formula raise (zero divisor / int8 overflow / int64 overflow)
    src.add(rows([100], [2**40], [0]))
    ups = g.run_cycle()
    assert "src" in ups and "sibling" in ups and "bad" not in ups and "child" not in ups
    f = bad.failure
    assert f is not None and f.step == 3 and f.table == "bad" and f.origin == "bad"
    assert isinstance(f.error, (pa.ArrowInvalid, ArithmeticError))
    assert "'bad'" in f.message and str(f.error) in f.message
    for t in (child, grandchild):
        assert t.failure is not None and t.failure.origin == "bad" and t.failure.error is f.error
        assert f"{t.name!r}" in t.failure.message and "'bad'" in t.failure.message
    assert [n for n, _ in heard] == ["bad", "child", "grandchild"]
    assert heard[0][1] == f.message
    assert [e.table for e in g.errors] == ["bad"]
    # later cycles: the failed tables stay as they were, the parent and the sibling follow
    src.add(good(200, 4))
    src.add(rows([101], [1], [1]))
    g.run_cycle()
    assert bad.failure is f and bad.last_step == 2
    if not hasattr(bad, "exprs"):  # a view or select has the parent's rows; others keep their own
        assert bad.to_arrow().equals(before)
    assert sibling.last_step == 4 and src.last_step == 4 and src.size == 14
    assert sibling.to_arrow().equals(src.to_arrow().filter(pc.greater(src.to_arrow()["x"], 3)))
    assert len(heard) == 3 and set(updates) == {2} and t_plain == [2]
    # a failed table cannot be read or derived from
    for t in (bad, child, grandchild):
        with pytest.raises(TableFailedError, match="'bad'") as e:
            g.snapshot(t)
        assert e.value.code == "FAILED_PRECONDITION" and e.value.failure is t.failure
    with pytest.raises(TableFailedError, match="'bad'"):
        bad.where(pc.field("id") > 0, name="later")
    assert "later" not in g.tables
    # a new table from the healthy parent works
    again = src.where(pc.field("y") == 0, name="again")
    assert again.to_arrow().column("id").to_pylist() == [100]


def test_a_failure_at_creation_is_an_error_of_the_creating_call():
    g = UpdateGraph()
    src = g.append_table("src", SCHEMA)
    src.add(rows([1], [1], [0]))
    g.run_cycle()
    with pytest.raises(pa.ArrowInvalid, match="divide by zero"):
        src.where(ratio_over_one(), name="bad")
    assert "bad" not in g.tables
    g.run_cycle()


def test_a_source_whose_input_fails_is_not_a_failed_table(monkeypatch):
    g = UpdateGraph()
    src = g.append_table("src", SCHEMA)
    derived = src.where(pc.field("x") > 0, name="derived")
    real = type(src)._apply_pending
    calls = []

    def once_broken(self, step, ops):
        calls.append(step)
        if len(calls) == 1:
            raise RuntimeError("input broke")
        return real(self, step, ops)

    monkeypatch.setattr(type(src), "_apply_pending", once_broken)
    src.add(good(0, 2))
    g.run_cycle()
    assert [e.table for e in g.errors] == ["src"]
    src.add(good(2, 2))
    g.run_cycle()
    assert src.failure is None and derived.failure is None
    assert derived.size == src.size > 0


def test_the_cycle_thread_keeps_running_after_a_table_fails():
    g = UpdateGraph(interval_ms=5)
    src = g.append_table("src", SCHEMA)
    bad = src.where(ratio_over_one(), name="bad")
    with g:
        src.add(rows([1], [5], [0]))
        deadline = time.monotonic() + 10
        while bad.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bad.failure is not None
        src.add(good(10, 3))
        while src.size < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.size == 4 and g.running
