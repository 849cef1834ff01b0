"""apply_update: an update applied to a copy of the previous state gives the new state.

Seeded; a failing seed is printed for replay.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tickwire.server.engine.graph import (
    ROW_KEY,
    RowSet,
    RowSetShiftData,
    TableUpdate,
    UpdateValidationError,
    apply_update,
)


def _order_preserving_moves(rng, kept: np.ndarray):
    """New ascending keys for `kept` and the normalised shifts that produce them."""
    if kept.size == 0:
        return kept, RowSetShiftData()
    steps = np.maximum(rng.integers(0, 4, kept.size), 1)
    steps[rng.random(kept.size) < 0.5] = 1
    new = np.cumsum(steps) - 1 + int(rng.integers(0, 30))
    delta = new - kept
    cut = np.flatnonzero(np.diff(delta) != 0) + 1
    pieces = np.split(kept, cut)
    deltas = np.split(delta, cut)
    shifts = RowSetShiftData.build([p[0] for p in pieces], [p[-1] for p in pieces], [d[0] for d in deltas])
    return new, shifts


def _state(keys: np.ndarray, a: np.ndarray, b: list) -> pa.Table:
    return pa.table({ROW_KEY: pa.array(keys, pa.int64()), "a": pa.array(a, pa.int64()),
                     "b": pa.array(b, pa.list_(pa.string()))})


def _random_case(seed: int):
    """(prev state, update, new values, expected new state), built from an independent model."""
    rng = np.random.default_rng(seed)
    prev_keys = np.unique(rng.integers(0, 300, int(rng.integers(0, 80))))
    prev_a = rng.integers(0, 1000, prev_keys.size)
    prev_b = [None if x % 4 == 0 else [f"s{x}"] * int(x % 3) for x in rng.integers(0, 100, prev_keys.size).tolist()]
    prev = _state(prev_keys, prev_a, prev_b)
    gone = rng.random(prev_keys.size) < 0.25
    kept = prev_keys[~gone]
    new_kept, shifts = _order_preserving_moves(rng, kept)
    free = np.setdiff1d(np.arange(0, 700), new_kept)
    added = np.sort(rng.choice(free, int(rng.integers(0, 25)), replace=False)).astype(np.int64)
    mod_mask = rng.random(new_kept.size) < 0.3
    cols = {c for c in ("a", "b") if rng.random() < 0.6} if mod_mask.any() else set()
    if mod_mask.any() and not cols:
        cols = {"a"}
    # the expected state: kept rows moved, modified columns rewritten, added rows inserted
    exp_a = dict(zip(new_kept.tolist(), prev_a[~gone].tolist()))
    exp_b = dict(zip(new_kept.tolist(), [x for x, g in zip(prev_b, gone) if not g]))
    new_vals_keys = np.concatenate((new_kept[mod_mask], added))
    new_vals_a = rng.integers(1000, 2000, new_vals_keys.size)
    new_vals_b = [[f"n{x}"] for x in rng.integers(0, 100, new_vals_keys.size).tolist()]
    for k, va, vb in zip(new_vals_keys.tolist(), new_vals_a.tolist(), new_vals_b):
        if k in exp_a and "a" in cols or k not in exp_a:
            exp_a[k] = va
        if k in exp_b and "b" in cols or k not in exp_b:
            exp_b[k] = vb
    order = sorted(exp_a)
    expected = _state(np.array(order, dtype=np.int64), np.array([exp_a[k] for k in order], dtype=np.int64),
                      [exp_b[k] for k in order])
    perm = rng.permutation(new_vals_keys.size)  # new values in any row order
    new_values = _state(new_vals_keys[perm], new_vals_a[perm], [new_vals_b[i] for i in perm.tolist()])
    update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev_keys[gone]),
                         modified=RowSet.from_keys(new_kept[mod_mask]), shifted=shifts, modified_columns=cols)
    return prev, update, new_values, expected


@pytest.mark.parametrize("seed", range(60))
def test_apply_update_to_arrow_and_dict_states(seed):
    try:
        prev, update, new_values, expected = _random_case(seed)
        update.validate(RowSet.from_keys(prev[ROW_KEY].to_numpy()), RowSet.from_keys(expected[ROW_KEY].to_numpy()))
        got = apply_update(prev, update, new_values)
        assert got.equals(expected)
        def as_dict(t):
            return dict(zip(t[ROW_KEY].to_pylist(), t.drop_columns([ROW_KEY]).to_pylist()))
        assert apply_update(as_dict(prev), update, as_dict(new_values)) == as_dict(expected)
        assert apply_update(as_dict(prev), update, new_values) == as_dict(expected)
    except AssertionError:
        print(f"replay: seed {seed}")
        raise


def test_a_modified_column_missing_from_the_update_gives_a_different_state():
    prev = _state(np.array([0, 1, 2]), np.array([10, 11, 12]), [["x"], ["y"], ["z"]])
    new_values = _state(np.array([1]), np.array([99]), [["changed"]])
    full = TableUpdate(modified=RowSet.range(1, 1), modified_columns={"a", "b"})
    partial = TableUpdate(modified=RowSet.range(1, 1), modified_columns={"a"})
    assert apply_update(prev, full, new_values)["b"].to_pylist() == [["x"], ["changed"], ["z"]]
    assert apply_update(prev, partial, new_values)["b"].to_pylist() == [["x"], ["y"], ["z"]]
    assert apply_update(prev, partial, new_values)["a"].to_pylist() == [10, 99, 12]


def test_apply_update_rejects_keys_the_state_does_not_have():
    prev = _state(np.array([0, 1]), np.array([1, 2]), [None, None])
    none = _state(np.zeros(0, np.int64), np.zeros(0, np.int64), [])
    with pytest.raises(UpdateValidationError, match="removed"):
        apply_update(prev, TableUpdate(removed=RowSet.range(5, 5)), none)
    with pytest.raises(UpdateValidationError, match="added"):
        apply_update(prev, TableUpdate(added=RowSet.range(3, 3)), none)  # no values for the added row
    with pytest.raises(UpdateValidationError, match="collide"):
        apply_update(prev, TableUpdate(added=RowSet.range(1, 1)), _state(np.array([1]), np.array([0]), [None]))
    with pytest.raises(UpdateValidationError, match="modified"):
        apply_update({0: {"a": 1}}, TableUpdate(modified=RowSet.range(4, 4), modified_columns={"a"}), {4: {"a": 2}})


def _random_next(rng, prev_keys: np.ndarray, span: int = 400):
    """A random valid update from the key set `prev_keys`; shift ranges are widened over keys
    that do not exist when that keeps them valid. Returns (update, new keys)."""
    gone = rng.random(prev_keys.size) < 0.2
    kept = prev_keys[~gone]
    new_kept, shifts = _order_preserving_moves(rng, kept)
    if len(shifts) and rng.random() < 0.5:
        prev_kept = np.concatenate(([-1], kept))
        below = prev_kept[np.searchsorted(kept, shifts.starts)]  # kept key just below each start
        next_kept = np.concatenate((kept, [kept[-1] + 50]))
        above = next_kept[np.searchsorted(kept, shifts.ends, side="right")]
        s = np.maximum(shifts.starts - rng.integers(0, 4, len(shifts)), below + 1)
        e = np.minimum(shifts.ends + rng.integers(0, 4, len(shifts)), above - 1)
        try:
            wide = RowSetShiftData.build(s, e, shifts.deltas)
            if np.array_equal(wide.apply_to_keys(kept), new_kept):
                shifts = wide
        except ValueError:
            pass
    free = np.setdiff1d(np.arange(0, span + (int(new_kept.max()) if new_kept.size else 0)), new_kept)
    added = np.sort(rng.choice(free, min(free.size, int(rng.integers(0, 20))), replace=False)).astype(np.int64)
    mod = new_kept[rng.random(new_kept.size) < 0.3]
    cols = {c for c in ("a", "b") if rng.random() < 0.5} or {"a"} if mod.size else set()
    update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev_keys[gone]),
                         modified=RowSet.from_keys(mod), shifted=shifts, modified_columns=cols)
    new_keys = np.union1d(new_kept, added)
    update.validate(RowSet.from_keys(prev_keys), RowSet.from_keys(new_keys))
    return update, new_keys


def _values_for(rng, keys: np.ndarray) -> pa.Table:
    return _state(keys, rng.integers(0, 10**6, keys.size), [[str(x)] for x in rng.integers(0, 9, keys.size).tolist()])


@pytest.mark.parametrize("seed", range(80))
def test_coalesced_updates_equal_the_sequence(seed):
    rng = np.random.default_rng(seed)
    try:
        keys0 = np.unique(rng.integers(0, 300, int(rng.integers(0, 100))))
        state0 = _values_for(rng, keys0)
        state, keys = state0, keys0
        total = None
        for _ in range(int(rng.integers(2, 6))):
            update, new_keys = _random_next(rng, keys)
            fresh = _values_for(rng, new_keys)  # every row of the new state gets new values
            state = apply_update(state, update, fresh)
            total = update if total is None else total.coalesce(update, RowSet.from_keys(keys0))
            keys = new_keys
        total.validate(RowSet.from_keys(keys0), RowSet.from_keys(keys))
        assert apply_update(state0, total, state).equals(state)
        # removed rows were in the first state; modified rows are never added ones
        assert total.removed.is_subset(RowSet.from_keys(keys0))
        assert not total.modified.overlaps(total.added)
    except AssertionError:
        print(f"replay: seed {seed}")
        raise


def test_coalesce_composes_shifts_and_drops_rows_that_came_and_went():
    prev = RowSet.from_keys([10, 11, 12, 20])
    first = TableUpdate(added=RowSet.from_keys([5, 30]), removed=RowSet.from_keys([11]),
                        shifted=RowSetShiftData.build([10], [12], [2]))  # 10 -> 12, 12 -> 14
    mid = first.apply_to(prev)
    assert mid.keys().tolist() == [5, 12, 14, 20, 30]
    second = TableUpdate(removed=RowSet.from_keys([30, 14]), modified=RowSet.from_keys([5, 20]),
                         shifted=RowSetShiftData.build([12], [12], [-1]), modified_columns={"a"})  # 12 -> 11
    total = first.coalesce(second, prev)
    assert total.removed.keys().tolist() == [11, 12]  # 14 came from 12
    assert total.added.keys().tolist() == [5]  # 30 came and went; 5 was added, then modified: added
    assert total.modified.keys().tolist() == [20] and total.modified_columns == {"a"}
    assert total.shifted == RowSetShiftData([10], [10], [1])  # 10 -> 12 -> 11
    total.validate(prev, second.apply_to(mid))
