"""RowSet and RowSetShiftData against plain numpy/set models."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tickwire.protocol.rowset import decode_rowset, encode_rowset
from tickwire.server.graph import RowSet, RowSetShiftData

keysets = st.one_of(
    st.sets(st.integers(0, 300), max_size=60),
    st.builds(lambda a, n: set(range(a, a + n)), st.integers(0, 10**12), st.integers(0, 50)),
    st.sets(st.integers(0, 2**62), max_size=10),
)


def rs(keys) -> RowSet:
    return RowSet.from_keys(np.array(sorted(keys), dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(keysets, keysets)
def test_set_algebra_matches_python_sets(a, b):
    ra, rb = rs(a), rs(b)
    assert ra.union(rb).keys().tolist() == sorted(a | b)
    assert ra.intersect(rb).keys().tolist() == sorted(a & b)
    assert ra.minus(rb).keys().tolist() == sorted(a - b)
    assert ra.is_subset_of(rb) == (a <= b)
    assert len(ra) == len(a)
    assert (ra == rs(a)) and (ra == rb) == (a == b)


@settings(max_examples=200, deadline=None)
@given(keysets, st.data())
def test_positions_and_ranges(a, data):
    r = rs(a)
    keys = sorted(a)
    if keys:
        pos = data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=10))
        assert r.select(pos).tolist() == [keys[p] for p in pos]
        assert r.find([keys[p] for p in pos]).tolist() == pos
        lo = data.draw(st.integers(0, len(keys) - 1))
        hi = data.draw(st.integers(lo, len(keys) + 3))
        assert r.subset_by_positions(lo, hi).keys().tolist() == keys[lo:hi + 1]
    missing = max(keys, default=0) + 1
    assert r.find([missing]).tolist() == [-1]
    # ranges convert through the wire codec and back
    assert RowSet.from_ranges(decode_rowset(encode_rowset(r.ranges()))) == r


def test_single_range_fast_path():
    r = RowSet.range(0, 9_999_999)
    assert r.is_single_range and len(r) == 10_000_000
    assert r.select([0, 5_000_000]).tolist() == [0, 5_000_000]
    assert r.union(RowSet.range(10_000_000, 10_000_009)).is_single_range
    assert not r.minus(RowSet.from_keys([5])).is_single_range
    assert r.minus(RowSet.range(0, 9)).is_single_range


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 400), max_size=80), st.data())
def test_shift_apply_and_unapply(a, data):
    # non-overlapping order-preserving shifts built from random cut points
    cuts = sorted(data.draw(st.sets(st.integers(0, 420), min_size=2, max_size=8)))
    starts, ends, deltas = [], [], []
    prev_dest_end = -1
    for s, e in zip(cuts[:-1], cuts[1:]):
        e = e - 1
        if e < s:
            continue
        d = data.draw(st.integers(-3, 3))
        if s + d <= prev_dest_end or s + d < 0:
            d = 0
        if d:
            starts.append(s)
            ends.append(e)
            deltas.append(d)
            prev_dest_end = e + d
        else:
            prev_dest_end = e
    sd = RowSetShiftData.build(starts, ends, deltas)
    r = rs(a)
    keys = np.array(sorted(a), dtype=np.int64)
    if np.any(np.diff(sd.apply_to_keys(keys)) <= 0):
        return  # the shifts would reorder or collide rows of this set: not a valid update for it
    stay = keys[sd.apply_to_keys(keys) == keys]
    if stay.size and np.any(sd.unapply_keys(stay) != stay):
        return  # an unshifted row sits in a destination range: not a valid update for this row set
    try:
        shifted = sd.apply(r)
    except ValueError:
        return  # a shift onto unshifted rows: the update model forbids it, and apply reports it
    expected = sorted(sd.apply_to_keys(np.array(sorted(a), dtype=np.int64)).tolist())
    assert shifted.keys().tolist() == expected
    assert sd.unapply(shifted) == r
    assert sd.unapply_keys(shifted.keys()).tolist() == sorted(a)


def test_shift_builder_merges_and_validates():
    sd = RowSetShiftData.build([10, 20, 30], [19, 29, 39], [5, 5, 0])
    assert (sd.starts.tolist(), sd.ends.tolist(), sd.deltas.tolist()) == ([10], [29], [5])
    with pytest.raises(ValueError):
        RowSetShiftData.build([10, 15], [20, 25], [1, 1])  # overlapping
    with pytest.raises(ValueError):
        RowSetShiftData.build([0], [5], [-1])  # below zero
    s, e, d = sd.to_wire()
    assert RowSetShiftData.from_wire(s, e, d) == sd
