"""Randomized convergence over gRPC: seeded random traffic on source tables, served by a real
TickwireServer to tickwire's BarrageClient (full, header, floating, footer, reverse floating and
swiss viewports, column subsets, view changes, producer and subscription coalescing, slow
readers, snapshots in pieces) and to pydeephaven-ticking; after every step each client must
hold exactly the expected slice of the source. The harness is tests/convergence.py; a failure
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

SMOKE_STEPS = 20
CI_MIN_STEPS = 100  # the fewest steps a configuration runs in `make test`
USES_TICKING = {"ticking", "blink-p1"}  # configurations with pydeephaven-ticking clients

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


def test_soak_budget_is_at_least_ten_thousand_steps():
    total = sum(len(seeds) * n for _c, seeds, n in SOAK) + SMOKE_STEPS * len(CONFIGS)
    assert total >= 10_000
    assert {c for c, _s, _n in SOAK} == set(CONFIGS)


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
