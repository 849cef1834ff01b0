"""The client's in-place columns: random appends, modifications, removals and inserts on every
kind of column give the same values as a plain Python list, and Arrow arrays handed out earlier
never change afterwards."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tickwire.clients.columns import Column

TYPES = [pa.int8(), pa.int64(), pa.uint16(), pa.float32(), pa.float64(), pa.bool_(), pa.timestamp("ns", "UTC"),
         pa.date32(), pa.string(), pa.list_(pa.int32())]


def _gen(rng, t: pa.DataType, n: int) -> pa.Array:
    def val():
        if rng.random() < 0.2:
            return None
        if t == pa.string():
            return f"s{rng.integers(100)}"
        if pa.types.is_list(t):
            return list(range(int(rng.integers(3))))
        if t == pa.bool_():
            return bool(rng.integers(2))
        if pa.types.is_floating(t):
            return float(rng.integers(100))
        return int(rng.integers(100))
    vals = [val() for _ in range(n)]
    if pa.types.is_timestamp(t):
        arr = pa.array(vals, pa.int64()).cast(t)
    elif t == pa.date32():
        arr = pa.array(vals, pa.int32()).cast(t)
    else:
        arr = pa.array(vals, type=t)
    if n > 1 and rng.random() < 0.5:  # an array with an offset, as slices of received batches are
        arr = pa.concat_arrays([_gen(rng, t, 1), arr]).slice(1)
    return arr


@pytest.mark.parametrize("t", TYPES, ids=str)
@pytest.mark.parametrize("seed", range(3))
def test_random_changes_match_a_list(t, seed):
    rng = np.random.default_rng(seed)
    col, ref = Column(t), []
    views = []
    for step in range(150):
        op = int(rng.integers(5))
        if op == 0:
            a = _gen(rng, t, int(rng.integers(0, 6)))
            col.append(a)
            ref += a.to_pylist()
        elif op == 1 and ref:
            k = int(rng.integers(1, len(ref) + 1))
            pos = np.sort(rng.choice(len(ref), k, replace=False))
            a = _gen(rng, t, k)
            col.set(pos, a)
            for p, v in zip(pos.tolist(), a.to_pylist()):
                ref[p] = v
        elif op == 2 and ref:
            keep = np.sort(rng.choice(len(ref), int(rng.integers(0, len(ref) + 1)), replace=False))
            col.keep(keep)
            ref = [ref[i] for i in keep.tolist()]
        elif op == 3:
            m = int(rng.integers(1, 5))
            at = np.sort(rng.integers(0, len(ref) + 1, m))
            a = _gen(rng, t, m)
            col.insert(at, a)
            out, j = [], 0
            for i in range(len(ref) + 1):
                while j < m and at[j] == i:
                    out.append(a[j].as_py())
                    j += 1
                if i < len(ref):
                    out.append(ref[i])
            ref = out
        else:
            v = col.arrow()
            views.append((v, v.to_pylist()))
        assert len(col) == len(ref)
        assert col.arrow().to_pylist() == ref, f"seed {seed} step {step} op {op}"
        if ref:
            idx = rng.integers(0, len(ref), 3)
            assert col.take(idx).to_pylist() == [ref[i] for i in idx.tolist()]
    for v, seen in views:  # arrays handed out earlier kept their values through later changes
        assert v.to_pylist() == seen
