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
from tickwire.server.engine import Engine, TableFailedError, TableSpec
from tickwire.server.engine.graph.graph import TableListener

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
    engine = Engine()
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, good(0, 5))
    engine.run_cycle()
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

    engine.write(src, good(5, 3))
    engine.run_cycle()  # step 2: fine
    assert updates and set(updates) == {2} and t_plain == [2]
    before = bad.to_arrow()
    # step 3: one row makes the formula raise (zero divisor / int8 overflow / int64 overflow)
    engine.write(src, rows([100], [2**40], [0]))
    ups = engine.run_cycle()
    assert "src" in ups and "sibling" in ups and "bad" not in ups and "child" not in ups
    f = bad.failure
    origin = bad.parent.name if bad.parent is not src else "bad"  # a view fails when its formula is read
    assert f is not None and f.step == 3 and f.table == "bad" and f.origin == origin
    assert isinstance(f.error, (pa.ArrowInvalid, ArithmeticError))
    assert "'bad'" in f.message and f"{origin!r}" in f.message and str(f.error) in f.message
    for t in (child, grandchild):
        assert t.failure is not None and t.failure.origin == origin and t.failure.error is f.error
        assert f"{t.name!r}" in t.failure.message and f"{origin!r}" in t.failure.message
    assert [n for n, _ in heard] == ["bad", "child", "grandchild"]
    assert heard[0][1] == f.message
    assert [e.table for e in engine.errors] == [origin]
    # later cycles: the failed tables stay as they were, the parent and the sibling follow
    engine.write(src, good(200, 4))
    engine.write(src, rows([101], [1], [1]))
    engine.run_cycle()
    assert bad.failure is f and bad.last_step == 2
    if origin == "bad" and not hasattr(bad, "exprs"):  # a view or select has the parent's rows
        assert bad.to_arrow().equals(before)
    assert sibling.last_step == 4 and src.last_step == 4 and src.size == 14
    assert sibling.to_arrow().equals(src.to_arrow().filter(pc.greater(src.to_arrow()["x"], 3)))
    assert len(heard) == 3 and set(updates) == {2} and t_plain == [2]
    # a failed table cannot be read or derived from
    for t in (bad, child, grandchild):
        with pytest.raises(TableFailedError, match=f"{origin!r}") as e:
            engine.snapshot(t)
        assert e.value.code == "FAILED_PRECONDITION" and e.value.failure is t.failure
    with pytest.raises(TableFailedError, match=f"{origin!r}"):
        bad.where(pc.field("id") > 0, name="later")
    assert engine.resolve("later", hidden=True) is None
    # a new table from the healthy parent works
    again = src.where(pc.field("y") == 0, name="again")
    assert again.to_arrow().column("id").to_pylist() == [100]


def test_a_view_whose_formula_raises_when_read_fails_with_its_derived_tables():
    engine = Engine()
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, good(0, 3))
    engine.run_cycle()
    view = src.view(["id", ("q", pc.divide_checked(pc.field("x"), pc.field("y")))], name="v")
    head = view.head(2, name="v_head")
    heard = []
    view.add_listener(TableListener(lambda *a: None, lambda table, failure: heard.append(failure)))
    assert engine.snapshot(view)[1].column("q").to_pylist() == [0, 1, 3]  # integer division
    engine.write(src, rows([9], [1], [0]))
    engine.run_cycle()  # a view computes on read: nothing read it in this cycle
    assert view.failure is None and head.failure is None and view.last_step == 2
    with pytest.raises(TableFailedError, match="table 'v' failed at step 2 computing its columns.*divide by zero"):
        engine.snapshot(view)
    assert view.failure is not None and heard == [view.failure] and view.failure.origin == "v"
    assert head.failure is not None and head.failure.origin == "v"
    with pytest.raises(TableFailedError):
        engine.snapshot(view, ["id"])  # stays failed, even for columns it could read
    engine.write(src, good(10, 2))
    engine.run_cycle()
    assert src.size == 6 and view.last_step == 2 and engine.snapshot(src)[1].num_rows == 6


def test_a_failure_at_creation_is_an_error_of_the_creating_call():
    engine = Engine()
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, rows([1], [1], [0]))
    engine.run_cycle()
    with pytest.raises(pa.ArrowInvalid, match="divide by zero"):
        src.where(ratio_over_one(), name="bad")
    assert engine.resolve("bad", hidden=True) is None
    engine.run_cycle()


def test_a_source_whose_input_fails_is_not_a_failed_table(monkeypatch):
    engine = Engine()
    src = engine.create(TableSpec("src", "append", SCHEMA))
    derived = src.where(pc.field("x") > 0, name="derived")
    real = type(src).apply_pending
    calls = []

    def once_broken(self, step, ops):
        calls.append(step)
        if len(calls) == 1:
            raise RuntimeError("input broke")
        return real(self, step, ops)

    monkeypatch.setattr(type(src), "apply_pending", once_broken)
    engine.write(src, good(0, 2))
    engine.run_cycle()
    assert [e.table for e in engine.errors] == ["src"]
    engine.write(src, good(2, 2))
    engine.run_cycle()
    assert src.failure is None and derived.failure is None
    assert derived.size == src.size > 0


def test_the_cycle_thread_keeps_running_after_a_table_fails():
    engine = Engine(interval_ms=5)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    bad = src.where(ratio_over_one(), name="bad")
    with engine:
        engine.write(src, rows([1], [5], [0]), wait=False)
        deadline = time.monotonic() + 10
        while bad.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bad.failure is not None
        engine.write(src, good(10, 3), wait=False)
        while src.size < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.size == 4 and engine.running


# ----------------------------------------------------------------------------------------------
# Barrage subscribers, DoGet and snapshot requests
# ----------------------------------------------------------------------------------------------

def ended(sub, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not sub.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return sub.closed


def plain(t: pa.Table) -> pa.Table:
    return pa.table({f.name: t.column(i) for i, f in enumerate(t.schema)})


@pytest.fixture()
def failing():
    engine = Engine(interval_ms=3_600_000)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, good(0, 6))
    engine.run_cycle()
    ratio = src.where(ratio_over_one(), name="ratio")
    ratio.sort("x", descending=True, name="ratio_sorted")
    src.where(pc.field("x") > 6, name="sibling")
    src.view(["id", ("q", pc.divide_checked(pc.field("x"), pc.field("y")))], name="quotient")
    server = TickwireServer(engine, port=0, start_engine=False).start()
    yield server, engine, src
    server.stop()
    engine.stop()


def test_subscribers_get_the_failure_and_the_parent_keeps_converging(failing):
    server, engine, src = failing
    with BarrageClient(server.target) as c:
        full = c.subscribe("ratio")
        window = c.subscribe("ratio", viewport=[(0, 2)])
        child = c.subscribe("ratio_sorted")
        parent = c.subscribe("src")
        parent_window = c.subscribe("src", viewport=[(0, 3)], reverse=True)
        sibling = c.subscribe("sibling")
        for s in (full, window, child, parent, parent_window, sibling):
            assert s.wait_for(lambda s: s.last_seq == engine.step, 20)
        engine.write(src, good(6, 4))
        engine.run_cycle()
        for s in (full, window, child, parent, sibling):
            assert s.wait_for(lambda s: s.last_seq == engine.step, 20)
        # no row goes missing before the failure: the subscriber holds what the table holds
        assert plain(full.table).equals(engine.snapshot(engine.resolve("ratio"))[1])
        assert plain(child.table).equals(engine.snapshot(engine.resolve("ratio_sorted"))[1])
        engine.write(src, good(10, 2))
        engine.write(src, rows([99], [7], [0]))  # 7 / 0: the filter's formula raises
        engine.run_cycle()
        failed_at = engine.step
        message = engine.resolve("ratio").failure.message
        assert "'ratio'" in message and "divide by zero" in message
        for s in (full, window):
            assert ended(s) and s.error is not None
            assert s.error.code == grpc.StatusCode.FAILED_PRECONDITION
            assert message in str(s.error)
        assert ended(child) and child.error.code == grpc.StatusCode.FAILED_PRECONDITION
        assert "'ratio_sorted'" in str(child.error) and "'ratio'" in str(child.error)
        assert "divide by zero" in str(child.error)
        # a DoGet, a snapshot request and a new subscription answer the same
        for name, msg in (("ratio", message), ("ratio_sorted", engine.resolve("ratio_sorted").failure.message)):
            with pytest.raises(ClientError) as e:
                c.snapshot(name)
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and msg in str(e.value)
            with pytest.raises(ClientError) as e:
                c.snapshot(name, viewport=[(0, 1)])
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and msg in str(e.value)
            late = c.subscribe(name)
            assert ended(late) and late.error.code == grpc.StatusCode.FAILED_PRECONDITION
            assert msg in str(late.error)
            with pytest.raises(ClientError):
                late.table  # noqa: B018 - refused before any schema
        # the parent and the sibling keep ticking and their subscribers keep converging
        for i in range(3):
            engine.write(src, good(20 + 5 * i, 5))
            engine.run_cycle()
        assert engine.step == failed_at + 3
        for name, s in (("src", parent), ("sibling", sibling)):
            assert s.wait_for(lambda s: s.last_seq == engine.step, 20) and s.error is None
            assert plain(s.table).equals(c.snapshot(name))
        assert parent_window.wait_for(lambda s: s.last_seq == engine.step, 20)
        assert plain(parent_window.table).equals(c.snapshot("src").slice(src.size - 4))
        assert src.size == 6 + 4 + 3 + 15


def test_subscribers_of_a_view_whose_formula_raises_on_read_get_the_failure(failing):
    server, engine, src = failing
    with BarrageClient(server.target) as c:
        full = c.subscribe("quotient")
        window = c.subscribe("quotient", viewport=[(0, 1)], reverse=True)
        parent = c.subscribe("src")
        for s in (full, window, parent):
            assert s.wait_for(lambda s: s.last_seq == engine.step, 20)
        engine.write(src, rows([77], [5], [0]))
        engine.run_cycle()  # the publisher reads the new row's quotient for the messages
        view = engine.resolve("quotient")
        assert view.failure is not None and "'quotient'" in view.failure.message
        for s in (full, window):
            assert ended(s) and s.error.code == grpc.StatusCode.FAILED_PRECONDITION
            assert view.failure.message in str(s.error)
        with pytest.raises(ClientError) as e:
            c.snapshot("quotient")
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and view.failure.message in str(e.value)
        engine.write(src, good(30, 2))
        engine.run_cycle()
        assert parent.wait_for(lambda s: s.last_seq == engine.step, 20)
        assert plain(parent.table).equals(c.snapshot("src"))


def test_a_snapshot_of_a_view_whose_formula_raises_answers_the_failure(failing):
    server, engine, src = failing
    engine.write(src, rows([78], [5], [0]))
    engine.run_cycle()  # nobody reads the view in this cycle
    assert engine.resolve("quotient").failure is None
    with BarrageClient(server.target) as c:
        for read in (lambda: c.snapshot("quotient"), lambda: c.snapshot("quotient", viewport=[(0, 9)])):
            with pytest.raises(ClientError) as e:
                read()
            assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "'quotient'" in str(e.value)
            assert "divide by zero" in str(e.value)
        sub = c.subscribe("quotient")
        assert ended(sub) and sub.error.code == grpc.StatusCode.FAILED_PRECONDITION


def test_a_failure_while_the_subscriber_is_behind_still_ends_its_stream(failing):
    # a subscriber that is not reading has changes waiting; the failure still reaches it once it
    # reads again, after the messages already queued
    server, engine, src = failing
    with BarrageClient(server.target) as c:
        seen = []
        sub = c.subscribe("ratio", on_update=lambda u: seen.append(u.last_seq), queue_size=1)
        assert sub.wait_for(lambda s: s.update_count >= 1, 20)
        for i in range(5):
            engine.write(src, good(100 + 3 * i, 3))
            engine.run_cycle()
        engine.write(src, rows([7], [1], [0]))
        engine.run_cycle()
        assert ended(sub) and sub.error.code == grpc.StatusCode.FAILED_PRECONDITION
        assert seen == sorted(seen) and all(s < engine.step for s in seen)


def test_deephaven_clients_see_the_failure_through_table_service(failing):
    from pydeephaven import DHError, Session

    server, engine, src = failing
    s = Session(host="127.0.0.1", port=server.port)
    try:
        ratio = s.open_table("ratio")
        derived = ratio.where(["id >= 0"])  # a TableService Filter on the table that will fail
        healthy = s.open_table("src").where(["x > 6"])
        assert derived.to_arrow().num_rows == engine.resolve("ratio").size > 0
        engine.write(src, rows([50], [1], [0]))
        engine.run_cycle()
        message = engine.resolve("ratio").failure.message
        for t in (ratio, derived):
            with pytest.raises(DHError) as e:
                t.to_arrow()
            cause = e.value.__cause__  # pyarrow's error for the call's status, with its message
            assert "gRPC returned precondition failed error" in str(cause)
            assert "divide by zero" in str(cause) and "'ratio'" in str(cause)
            if t is ratio:
                assert message in str(cause)
        with pytest.raises(DHError) as e:
            ratio.where(["id > 0"])  # a failed table cannot be derived from
        assert message in str(e.value.__cause__)  # the refused call's status message
        engine.write(src, good(60, 4))
        engine.run_cycle()
        got = healthy.to_arrow()
        want = engine.snapshot(src)[1]
        assert plain(got).equals(plain(want.filter(pc.greater(want["x"], 6))))
        assert message == engine.resolve("ratio").failure.message  # stays failed, as it failed
    finally:
        s.close()
