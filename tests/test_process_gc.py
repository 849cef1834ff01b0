"""The collector settings of a server process (tickwire.server.process_gc). Each test puts the
test process's collector back as it found it."""
from __future__ import annotations

import gc

import pytest

from tickwire.server.process_gc import YOUNG, freeze_startup, tune_gc


def test_tune_gc_sets_the_young_threshold_and_keeps_the_older_two():
    before = gc.get_threshold()
    try:
        assert tune_gc(12_345) == before
        assert gc.get_threshold() == (12_345, *before[1:])
        assert tune_gc() == (12_345, *before[1:])
        assert gc.get_threshold()[0] == YOUNG
    finally:
        gc.set_threshold(*before)


@pytest.mark.parametrize("young", [0, -5])
def test_tune_gc_refuses_a_threshold_that_is_not_positive(young):
    before = gc.get_threshold()
    with pytest.raises(ValueError, match="want a positive number"):
        tune_gc(young)
    assert gc.get_threshold() == before


def test_freeze_startup_takes_what_exists_out_of_later_collections_and_not_garbage():
    class Node:
        pass

    kept = [Node()]
    cycle = Node()
    cycle.me = cycle  # garbage in a cycle: collected first, never frozen
    del cycle
    collected: list[int] = []

    def seen(phase, info):
        if phase == "stop":
            collected.append(info["collected"])

    gc.callbacks.append(seen)
    try:
        frozen = freeze_startup()
        # what it froze, counted then: other threads may free frozen objects right after
        assert frozen > 0 and gc.get_freeze_count() > 0
        assert sum(collected) >= 1  # the cycle went in the collection before the freeze
        assert not any(o is kept for o in gc.get_objects())  # frozen: no generation holds it
        later = [Node()]
        assert any(o is later for o in gc.get_objects())  # what comes after is collected as before
    finally:
        gc.callbacks.remove(seen)
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
