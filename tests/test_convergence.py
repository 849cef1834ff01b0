"""Randomized convergence over gRPC: seeded random traffic on source tables, served by a real
TickwireServer to tickwire's BarrageClient (full, header, floating, footer, reverse floating and
swiss viewports, column subsets, view changes, producer and subscription coalescing, slow
readers, snapshots in pieces) and to pydeephaven-ticking; after every step each client must
hold exactly the expected slice of the source. The agg-* configurations serve aggregations of a
source (and where -> agg_by -> sort chains), which must also equal agg_by recomputed from
scratch on the source's rows at every step. The harness is tests/convergence.py; a failure
reads `replay: seed=S step=N config=C`.

`make test` runs each configuration once, for a third of its steps; `make soak` runs every seed
of SOAK with the step counts multiplied by TICKWIRE_SOAK, e.g.
    TICKWIRE_SOAK=20 .venv/bin/python -m pytest -m slow tests/test_convergence.py
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests import convergence as cv
from tests.convergence import (
    CONFIGS,
    KINDS,
    SHAPES,
    Divergence,
    Harness,
    RecordingView,
    Shape,
    Source,
    TickingView,
    TickwireView,
    expected_slice,
    run_config,
    scaled,
    soak_factor,
)
from tickwire.server.engine import Engine
from tickwire.server.engine.graph.aggspec import Agg
from tickwire.server.engine.graph.ops.aggregate import KINDS as AGGREGATION_KINDS

SMOKE_STEPS = 20
AGG_KEYED_STEPS = 540  # per seed; `make test` runs a third of it (see _soak_runs)
AGG_CHAIN_STEPS = 420
# per seed, for the join-* configurations (tables with several parents), run by
# tests/test_convergence_joins.py (a file of its own, so that its runs share the machine with the rest
# of the suite); `make test` runs a third of each, 10,200 steps together
JOIN_STEPS = {"join-diamond": 7200, "join-self": 4500, "join-chain": 4500, "join-merge": 7200, "join-cross": 7200}
# per seed, for the updateby-* configurations, run by tests/test_convergence_update_by.py (a file of
# its own, as the joins'); `make test` runs a third of each, 10,000 steps together
UPDATE_BY_STEPS = {"updateby-buckets": 15000, "updateby-time": 15000}
CI_MIN_STEPS = 100  # the fewest steps a configuration runs in `make test`
# configurations with pydeephaven-ticking clients
USES_TICKING = {"ticking", "blink-p1", "agg-keyed", "agg-chain", *JOIN_STEPS, *UPDATE_BY_STEPS}

# (config, seeds, steps per seed at TICKWIRE_SOAK=1); with the smoke runs, more than 10,000 steps
SOAK = [
    ("shapes-p1", (1, 2), 450),
    ("shapes-p10", (1,), 150),
    ("long-run", (1,), 3000),
    ("view-changes", (1, 2), 400),
    ("blink-p1", (1,), 500),
    ("blink-p10", (1,), 250),
    ("ticking", (1,), 450),
    ("interval", (1, 2), 1450),
    ("growing", (1,), 500),
    ("slow-reader", (1,), 700),
    ("agg-keyed", (1, 2, 3), AGG_KEYED_STEPS),
    ("agg-chain", (1, 2, 3), AGG_CHAIN_STEPS),
]


def _report(h: Harness, seconds: float) -> None:
    s = h.summary()
    print(f"\n{s['config']} seed={s['seed']}: {s['steps']} steps, {s['checks']} client checks, "
          f"{seconds:.1f} s; {s}")


# -- the runs -------------------------------------------------------------------------------------------------

def _marks(config: str) -> list:
    return [pytest.mark.interop] if config in USES_TICKING else []


@pytest.mark.parametrize("config", [pytest.param(c, marks=_marks(c)) for c in CONFIGS])
def test_smoke_every_configuration_converges(config):
    t0 = time.perf_counter()
    h = run_config(config, 0, SMOKE_STEPS)
    _report(h, time.perf_counter() - t0)
    assert h.steps == SMOKE_STEPS + 1  # and the final flush
    assert h.checks >= h.steps


def _soak_runs() -> list:
    """`make soak` (TICKWIRE_SOAK > 1): every seed of SOAK for TICKWIRE_SOAK times its steps;
    `make test`: each configuration once, its first seed, for a third of its steps."""
    if soak_factor() > 1:
        runs = [(c, s, scaled(n)) for c, seeds, n in SOAK for s in seeds]
    else:
        runs = [(c, seeds[0], max(CI_MIN_STEPS, n // 3)) for c, seeds, n in SOAK]
    return [pytest.param(c, s, n, marks=_marks(c), id=f"{c}-seed{s}") for c, s, n in runs]


@pytest.mark.slow
@pytest.mark.parametrize("config,seed,n", _soak_runs())
def test_soak_converges(config, seed, n):
    t0 = time.perf_counter()
    h = run_config(config, seed, n)
    _report(h, time.perf_counter() - t0)
    assert h.steps == n + 1
    assert h.checks >= h.steps
    # evidence that each configuration exercised what it is for
    if config == "view-changes":
        assert h.stats["view_changes"] >= n // 4
    if config == "interval":  # the run itself fails on any message not spanning exactly ten cycles
        assert all(dict(c).get(10, 0) >= n // 10 - 2 for c in h.stats["cycles_per_message"].values())
    if config == "growing":
        assert h.stats["partial_steps"] >= n // 10
    if config == "slow-reader":
        for label, s in h.stats["slow"].items():
            assert s["server_coalesced_cycles"] > 0, f"{label}: the server never had to coalesce"
            assert s["messages"] < n, f"{label}: one message per step, nothing was coalesced"
    if config.startswith("shapes") or config == "long-run":
        updates = h.summary()["updates"]
        assert set(updates) == set(KINDS), updates
    if config.startswith("agg-"):
        tables = h.summary()["tables"]
        assert all(t["changes"] >= n // 2 for t in tables.values()), tables
        assert sum(t.get("groups_gone", 0) for t in tables.values()) > 0, tables  # groups emptied
        assert sum(t.get("groups_back", 0) for t in tables.values()) > 0, tables  # and came back
    if config == "agg-keyed":  # preserve_empty kept groups that emptied
        assert h.summary()["tables"]["by_k_g"]["empty_groups"] > 0
    if config == "agg-chain":
        tables = h.summary()["tables"]
        assert tables["high_total"]["empty_steps"] > 0 and tables["high_total"]["steps_with_rows"] > 0, tables
        assert any(t["changes"] < h.steps for t in tables.values()), tables  # a table some steps left alone


def test_soak_budget_is_at_least_ten_thousand_steps():
    total = sum(len(seeds) * n for _c, seeds, n in SOAK) + SMOKE_STEPS * len(CONFIGS)
    assert total >= 10_000
    # joins: tests/test_convergence_joins.py; update_by: tests/test_convergence_update_by.py
    assert {c for c, _s, _n in SOAK} | set(JOIN_STEPS) | set(UPDATE_BY_STEPS) == set(CONFIGS)
    assert sum(n // 3 for n in JOIN_STEPS.values()) >= 10_000  # what `make test` runs of them
    assert sum(n // 3 for n in UPDATE_BY_STEPS.values()) >= 10_000


# -- the harness's own pieces ------------------------------------------------------------------------------

def test_expected_slice_counts_positions_independently():
    full = pa.table({n: pa.array(np.arange(10), pa.int64()) if n == "a" else pa.nulls(10, cv.SCHEMA.field(n).type)
                     for n in cv.NAMES})

    def rows(shape):
        return expected_slice(full, shape).column("a").to_pylist() if "a" in shape.names else \
            expected_slice(full, shape).num_rows

    assert rows(SHAPES["full"]) == list(range(10))
    assert rows(Shape("h", viewport=((0, 2),))) == [0, 1, 2]
    assert rows(Shape("f", viewport=((0, 2),), reverse=True)) == [7, 8, 9]
    assert rows(Shape("rf", viewport=((1, 2), (8, 20)), reverse=True)) == [0, 1, 7, 8]
    assert rows(Shape("s", viewport=((0, 1), (5, 5), (9, 30)))) == [0, 1, 5, 9]
    assert rows(Shape("p", viewport=((50, 60),))) == []
    assert rows(Shape("c", viewport=((3, 4),), columns=("b", "f"))) == 2
    assert expected_slice(full, Shape("c", columns=("f", "a"))).column_names == ["f", "a"]


def test_traffic_makes_valid_updates_of_every_kind():
    """Every update is validated by TableUpdate.validate as it is made; the table's row keys after
    each cycle must be the traffic's; and the mix covers every kind, shifts both ways, subsets of
    modified columns and emptying the table."""
    graph = Engine(interval_ms=3_600_000)
    src = Source(graph, "t", np.random.default_rng(5), per_cycle=1, target=60)
    seen_up = seen_down = subset = emptied = 0
    made = src.traffic.next

    def spy(keys):
        nonlocal seen_up, seen_down, subset
        update, values, new_keys = made(keys)
        seen_up += int((update.shifted.deltas > 0).any())
        seen_down += int((update.shifted.deltas < 0).any())
        subset += int(0 < len(update.modified_columns) < len(cv.NAMES))
        assert values.num_rows == len(update.added) + len(update.modified)
        return update, values, new_keys

    src.traffic.next = spy
    for i in range(600):
        if i % 150 == 100:
            src.traffic.target = 0 if src.traffic.target else 60
        src.feed()
        graph.run_cycle()
        src.record(graph.step)
        emptied += int(src.table.size == 0)
    assert set(src.traffic.kinds) == set(KINDS)
    assert seen_up and seen_down and subset and emptied


def test_soak_factor_reads_the_environment(monkeypatch):
    monkeypatch.delenv("TICKWIRE_SOAK", raising=False)
    assert soak_factor() == 1 and scaled(7) == 7
    monkeypatch.setenv("TICKWIRE_SOAK", "20")
    assert scaled(500) == 10_000
    for bad in ("0", "-3", "two"):
        monkeypatch.setenv("TICKWIRE_SOAK", bad)
        with pytest.raises(ValueError, match="TICKWIRE_SOAK"):
            soak_factor()


# -- the checks can fail -------------------------------------------------------------------------------------

@pytest.fixture()
def small():
    h = Harness("selfcheck", 11)
    src = h.source("t", per_cycle=1, target=80)
    h.warm(4)
    h.start()
    try:
        yield h, src
    finally:
        h.close()


def _replay(h: Harness, step: int) -> str:
    return rf"replay: seed={h.seed} step={step} config={h.config}\b"


def _changed_value(t: pa.Table, name: str, row: int, value) -> pa.Table:
    col = t.column(name).combine_chunks()
    mask = pa.array(np.arange(len(col)) == row)
    return t.set_column(t.column_names.index(name), name, pc.if_else(mask, pa.scalar(value, col.type), col))


def test_harness_detects_a_corrupted_client_state(small, monkeypatch):
    h, src = small
    full = h.add(TickwireView(h, src, SHAPES["full"]))
    footer = h.add(TickwireView(h, src, SHAPES["footer"]))
    h.verify()
    h.run(5)  # the real states converge
    step = h.graph.step
    assert src.table.size > 0
    real = cv.read_state

    def bad_value(sub):
        seq, table, size, keys = real(sub)
        return seq, _changed_value(table, "c", 0, 12345.5), size, keys

    monkeypatch.setattr(cv, "read_state", bad_value)
    for view in (full, footer):
        with pytest.raises(Divergence, match=_replay(h, step)) as err:
            view.verify(step)
        assert "column 'c' row 0: 12345.5" in str(err.value) and view.label() in str(err.value)

    monkeypatch.setattr(cv, "read_state", lambda sub: (lambda r: (r[0], r[1], r[2], r[3] + 1))(real(sub)))
    with pytest.raises(Divergence, match=_replay(h, step)) as err:
        full.verify(step)
    assert "row keys differ" in str(err.value)

    monkeypatch.setattr(cv, "read_state", lambda sub: (lambda r: (r[0], r[1], r[2] + 1, r[3]))(real(sub)))
    with pytest.raises(Divergence, match="table_size"):
        footer.verify(step)

    monkeypatch.setattr(cv, "read_state", lambda sub: (lambda r: (r[0] - 1, r[1], r[2], r[3]))(real(sub)))
    with pytest.raises(Divergence, match=f"last_seq {step - 1}, expected {step}"):
        full.verify(step)

    monkeypatch.setattr(cv, "read_state", real)
    full.verify(step)
    footer.verify(step)


def test_harness_detects_a_wrong_expected_slice_and_a_missing_step(small):
    h, src = small
    full = h.add(TickwireView(h, src, SHAPES["full"]))
    h.verify()
    for _ in range(20):
        step = h.step()
        if not src.at(step)[1].equals(src.at(step - 1)[1]):
            break
    else:
        pytest.fail("20 steps without a change to the table")
    with pytest.raises(Divergence, match=_replay(h, step)):
        full.verify(step, expected_step=step - 1)
    with pytest.raises(Divergence, match=_replay(h, step + 1)) as err:
        full.verify(step + 1, timeout=0.3)  # no cycle ran: the client cannot get there
    assert "did not reach step" in str(err.value)


def test_recording_view_detects_gaps_and_bad_states(small):
    h, src = small
    rec = h.add(RecordingView(h, src, SHAPES["swiss"]))
    h.verify()
    h.run(3)
    step = h._cycle()  # a cycle whose message is checked by hand
    assert rec._wait_recorded(lambda: rec.recorded_seq >= step, 10)
    good = rec.records[-1]
    rec.records[-1] = dataclasses.replace(good, table=good.table.slice(1) if good.table.num_rows else
                                          pa.concat_tables([good.table, good.table]))
    with pytest.raises(Divergence, match=_replay(h, step)) as err:
        rec.verify(step)
    assert "rows, expected" in str(err.value)
    rec.records.append(dataclasses.replace(good, first_seq=step + 2, last_seq=step))
    with pytest.raises(Divergence, match="does not follow the previous message"):
        rec.verify(step)
    rec.records.append(dataclasses.replace(good, first_seq=step + 1, last_seq=step + 1))
    with pytest.raises(Divergence, match="ahead of the graph"):
        rec.verify(step)


@pytest.mark.interop
def test_ticking_view_detects_a_corrupted_state(small):
    h, src = small
    tv = h.add(TickingView(h, src))
    h.verify()
    h.run(3)
    step = h.graph.step
    tv.verify(step)
    with tv.cond:
        tv.latest = _changed_value(tv.latest, "b", tv.latest.num_rows - 1, "corrupted")
    with pytest.raises(Divergence, match=_replay(h, step)) as err:
        tv.verify(step)
    assert "'corrupted'" in str(err.value)
    with tv.cond:
        tv.count += 1  # one update too many
    with pytest.raises(Divergence, match="updates, expected"):
        tv.verify(step)


def test_a_failed_run_reports_its_replay_line(monkeypatch):
    """An error that is not a divergence (here, a view change the client refuses) still names
    the seed, step and configuration."""
    def broken(h, steps):
        src = h.source("t")
        h.warm(2)
        h.start()
        v = h.add(TickwireView(h, src, SHAPES["header"]))
        h.verify()
        h.run(2)
        v.sub.set_view(viewport=[(0, 1)], columns=["no_such_column"])

    monkeypatch.setitem(CONFIGS, "broken", cv.Config("broken", broken))
    with pytest.raises(Divergence, match=r"replay: seed=4 step=4 config=broken\n.*ClientError"):
        run_config("broken", 4, 0)


def test_exact_column_subsets_reach_the_server(small):
    """The stock client adds column 0 to every column subset; the harness's exact-columns
    subscriptions must reach the server as asked (else the server's subset path goes untested)."""
    h, src = small
    views = cv._add_shapes(h, src, ("full_cols", "reverse_floating", "floating"))
    h.verify()
    h.run(2)
    asked = {v.shape.name: tuple(cv.NAMES.index(c) for c in v.shape.columns) for v in views}
    served = sorted(s.view.columns for s in h.server.registry.subscriptions)
    assert asked["full_cols"] in served and asked["reverse_floating"] in served
    assert 0 not in asked["full_cols"] + asked["reverse_floating"]


# -- the aggregation configurations' own pieces ----------------------------------------------------------------

def test_compare_takes_nan_as_equal_and_finds_differences_in_lists():
    x = pa.table({"x": [1.0, float("nan"), None], "l": pa.array([[1, None], [], None], pa.list_(pa.int64()))})
    assert cv.compare(x, x) is None
    assert cv.compare(x, x.set_column(0, "x", pa.array([1.0, 2.0, None]))) == "column 'x' row 1: nan, expected 2.0"
    other = pa.array([[1, None], [3], None], pa.list_(pa.int64()))
    assert cv.compare(x, x.set_column(1, "l", other)) == "column 'l' row 1: [], expected [3]"
    assert cv.compare(x, x.set_column(1, "l", pa.array([[1, 2], [], None], pa.list_(pa.int64())))) == \
        "column 'l' row 0: [1, None], expected [1, 2]"


def test_random_values_follow_the_fields_hints():
    t = cv.random_values(np.random.default_rng(3), 4000, cv.AGG_SCHEMA)
    assert set(t["k"].drop_null().to_pylist()) == set(range(8))
    assert set(t["g"].drop_null().to_pylist()) == {f"g{i}" for i in range(6)}
    assert set(t["q"].drop_null().to_pylist()) == set(range(-20, 21))
    x = t["x"].drop_null().to_numpy()
    assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()
    assert t["k"].null_count > 0 and t["g"].null_count > 0
    src = Source(Engine(interval_ms=3_600_000), "s", np.random.default_rng(1), schema=cv.AGG_SCHEMA)
    assert all(not f.metadata for f in src.table.schema)  # the hints shape the values, not the table


def test_every_aggregation_kind_is_dealt_to_a_table_that_can_take_it():
    assert cv.AGG_KINDS == set(AGGREGATION_KINDS)
    tables = [(["k"], True, ()), (["k", "g"], False, ("SumX",)), ([], False, ())]
    for seed in range(20):
        dealt = cv.deal_aggs(np.random.default_rng(seed), tables)
        for (keys, lists, must), aggs in zip(tables, dealt):
            assert all(a.column not in keys and a.other not in keys for a in aggs)
            assert lists or not any(a.kind in cv.LIST_KINDS for a in aggs)
            assert {"N", *must} <= {a.out for a in aggs}
        assert {a.out for aggs in dealt for a in aggs} == {a.out for a in cv.AGGS}


@pytest.fixture()
def agg_harness():
    h = Harness("selfcheck-agg", 12)
    src = h.source("s", schema=cv.AGG_SCHEMA, per_cycle=1, target=60)
    h.warm(3)
    try:
        yield h, src
    finally:
        h.close()


def test_aggregation_checks_detect_a_wrong_value_a_moved_group_and_a_wrong_order(agg_harness, monkeypatch):
    h, src = agg_harness
    aggs = [Agg("count", name="N"), Agg("sum", "x", "SumX"), Agg("median", "q", "MedQ")]
    by_k = cv.aggregate(h, src, "by_k", aggs, ["k"])
    by_n = cv.sort_of(h, by_k, "by_k_sorted", ["N"], [True])
    h.start()
    h.run(3)  # right
    assert by_k.table.size > 2
    real = cv.agg_reference.ref_value
    monkeypatch.setattr(cv.agg_reference, "ref_value", lambda a, *rest: real(a, *rest) + (a.kind == "count"))
    with pytest.raises(Divergence, match=_replay(h, h.graph.step + 1)) as err:
        h.step()
    assert "table 'by_k'" in str(err.value) and "column N: got" in str(err.value)
    monkeypatch.setattr(cv.agg_reference, "ref_value", real)

    def corrupted(d, change):
        real_record = d.record

        def record(step):
            real_record(step)
            d.history[step] = change(*d.history[step])
        monkeypatch.setattr(d, "record", record)

    corrupted(by_n, lambda keys, values: (keys, values.take(pa.array(np.arange(values.num_rows)[::-1]))))
    with pytest.raises(Divergence, match=_replay(h, h.graph.step + 1)) as err:
        h.step()
    assert "table 'by_k_sorted'" in str(err.value) and "row 0" in str(err.value)
    monkeypatch.undo()
    corrupted(by_k, lambda keys, values: (keys[::-1].copy(), values))  # the groups swap row keys
    with pytest.raises(Divergence, match=_replay(h, h.graph.step + 1)) as err:
        h.step()
    assert "table 'by_k'" in str(err.value) and "is at row key" in str(err.value)


def _unchanging(h: Harness, src: Source) -> cv.Derived:
    """A keyless aggregation of a where that no row passes: no rows, no change after it is made."""
    never = pc.field("q") > pc.scalar(1000)
    return cv.aggregate(h, src, "none", [Agg("count", name="N"), Agg("sum", "x", "SumX")], [],
                        parent=src.table.where(never, name="never"), where=never)


def test_views_of_a_table_that_does_not_change_hold_its_last_message(agg_harness):
    """A derived table need not change every cycle; a client then holds the message of its last
    change (here its snapshot), and the harness must not wait for a message for every step."""
    h, src = agg_harness
    none = _unchanging(h, src)
    busy = cv.aggregate(h, src, "by_g", [Agg("count", name="N")], ["g"])
    h.start()
    made = h.graph.step
    views = [h.add(TickwireView(h, d, cv.AGG_SHAPES[s])) for d in (none, busy) for s in ("full", "footer")]
    h.verify()
    h.run(5)
    step = h.graph.step
    assert none.changes_between(made, step) == 0 and none.last_change(step) == made
    assert busy.changes_between(made, step) > 0
    assert all(v.sub.last_seq == made for v in views[:2])
    assert all(v.sub.last_seq == busy.last_change(step) for v in views[2:])
    # were the table's last change at this step, the client that has no message for it would be behind
    none.changed.append(step)
    with pytest.raises(Divergence, match=_replay(h, step)) as err:
        views[0].verify(step, timeout=0.3)
    assert "did not reach step" in str(err.value)


@pytest.mark.interop
def test_ticking_views_of_a_derived_table_count_its_changes(agg_harness):
    h, src = agg_harness
    none = _unchanging(h, src)
    busy = cv.aggregate(h, src, "by_g", [Agg("count", name="N"), Agg("max", "ts", "MaxT")], ["g"])
    h.start()
    ticking = [h.add(TickingView(h, d)) for d in (none, busy)]
    h.verify()
    h.run(4)
    step = h.graph.step
    assert ticking[0].count == 1 and ticking[1].count == 1 + busy.changes_between(ticking[1].start_step, step) > 1
    none.changed.append(step)  # one more change than the client was sent
    with pytest.raises(Divergence, match="did not reach step"):
        ticking[0].verify(step, timeout=0.3)
