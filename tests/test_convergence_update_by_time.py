"""Convergence of update_by tables, the updateby-time configuration (time-based kinds over a source
whose stamps never go back and over a sort): see tests/test_convergence_update_by.py, which runs the
other configuration; a file of its own so that the two long runs go to different workers."""
from __future__ import annotations

import pytest

from tests.test_convergence_update_by import _runs, check_run


@pytest.mark.slow
@pytest.mark.parametrize("config,seed,n", _runs(("updateby-time",)))
def test_time_based_update_by_converges(config, seed, n):
    check_run(config, seed, n)
