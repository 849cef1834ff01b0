"""Convergence of update_by tables (the updateby-* configurations of tests/convergence.py: every
cumulative, exponential and rolling kind per bucket of a random-traffic source, time-based ones
over a source whose stamps never go back and over a sort of a random-traffic source), served to
full, viewport and pydeephaven-ticking clients and checked after every cycle against update_by
recomputed from scratch from their parents' rows (tests/update_by_reference.py).

`make test` runs each configuration once for a third of its steps (10,000 steps together); `make
soak` every seed for TICKWIRE_SOAK times its steps. A file of its own, so that these long runs
share the machine with the rest of the suite.
"""
from __future__ import annotations

import time

import pytest

from tests.convergence import run_config, scaled, soak_factor
from tests.test_convergence import CI_MIN_STEPS, UPDATE_BY_STEPS, _report

SEEDS = (1, 2)


def _runs(configs=("updateby-buckets",)) -> list:
    """The runs of `configs` (this file: updateby-buckets; tests/test_convergence_update_by_time.py
    the other, so that the two long runs go to different workers)."""
    if soak_factor() > 1:
        runs = [(c, s, scaled(n)) for c, n in UPDATE_BY_STEPS.items() for s in SEEDS if c in configs]
    else:
        runs = [(c, SEEDS[0], max(CI_MIN_STEPS, n // 3)) for c, n in UPDATE_BY_STEPS.items() if c in configs]
    return [pytest.param(c, s, n, marks=[pytest.mark.interop], id=f"{c}-seed{s}") for c, s, n in runs]


@pytest.mark.slow
@pytest.mark.parametrize("config,seed,n", _runs())
def test_update_by_converges(config, seed, n):
    check_run(config, seed, n)


def check_run(config: str, seed: int, n: int) -> None:
    t0 = time.perf_counter()
    h = run_config(config, seed, n)
    _report(h, time.perf_counter() - t0)
    assert h.steps == n + 1
    assert h.checks >= h.steps
    tables = h.summary()["tables"]
    assert all(t["changes"] >= n // 2 for name, t in tables.items() if name.startswith("ub")), tables
