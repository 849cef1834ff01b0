"""The difference between two states of a table (sans-I/O, pure Arrow and numpy).

    d = difference(old_keys, new_keys, new_values, old_values)
    d.removed            # keys held before and not now
    d.added              # indices (into new_keys) of the rows not held before
    d.modified["Price"]  # indices (into new_keys) of rows held before whose Price changed

Both sides of a resynchronisation use it: the replica (`tickwire.server.adapters.replica`) when it turns
the upstream's new snapshot into one update of its local table, and the client
(`tickwire.clients.client`) when a reconnected subscription turns the new snapshot into one
update of the state it shows. `equal_mask` is the row-wise equality they compare with.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Difference", "difference", "equal_mask"]

_EMPTY = np.zeros(0, dtype=np.int64)


def _as_array(a: Union[pa.Array, pa.ChunkedArray]) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a


def _validity(a: pa.Array) -> np.ndarray:
    if a.null_count == 0:
        return np.ones(len(a), dtype=bool)
    valid: np.ndarray = a.is_valid().to_numpy(zero_copy_only=False)
    return valid


def _segments_all(flags: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each segment [start, start + length) of `flags`: are all flags true (empty: true)."""
    bad: npt.NDArray[np.int64] = np.concatenate(([0], np.cumsum(~flags, dtype=np.int64)))
    all_true: np.ndarray = bad[starts + lengths] - bad[starts] == 0
    return all_true


def _list_equal(a: pa.Array, b: pa.Array, both_valid: np.ndarray) -> np.ndarray:
    n = len(a)
    t = a.type
    if pa.types.is_fixed_size_list(t):
        oa = (np.arange(n + 1, dtype=np.int64) + a.offset) * t.list_size
        ob = (np.arange(n + 1, dtype=np.int64) + b.offset) * t.list_size
    else:
        oa = a.offsets.to_numpy().astype(np.int64)
        ob = b.offsets.to_numpy().astype(np.int64)
    la, lb = np.diff(oa), np.diff(ob)
    rows = np.flatnonzero(both_valid & (la == lb))
    lens = la[rows]
    total = int(lens.sum())
    eq = np.zeros(n, dtype=bool)
    if total == 0:
        eq[rows] = True
        return eq
    firsts = np.cumsum(lens) - lens
    within = np.arange(total, dtype=np.int64) - np.repeat(firsts, lens)
    elem = equal_mask(a.values.take(pa.array(np.repeat(oa[rows], lens) + within)),
                      b.values.take(pa.array(np.repeat(ob[rows], lens) + within)))
    eq[rows] = _segments_all(elem, firsts, lens)
    return eq


def equal_mask(a: Union[pa.Array, pa.ChunkedArray], b: Union[pa.Array, pa.ChunkedArray]) -> np.ndarray:
    """Row-wise equality of two arrays of one type: a bool array, True where the rows are equal.

    Nulls equal nulls; NaN equals NaN. Lists compare element by element, structs field by field,
    dictionaries by their values. Types without a comparison kernel compare as different (a
    conservative answer).
    """
    a, b = _as_array(a), _as_array(b)
    n = len(a)
    if len(b) != n:
        raise ValueError(f"arrays differ in length ({n} and {len(b)})")
    if n == 0:
        return np.zeros(0, dtype=bool)
    t = a.type
    va, vb = _validity(a), _validity(b)
    both_valid = va & vb
    out: np.ndarray = va == vb  # both null: equal; one null: different; both valid: decided below
    if not both_valid.any():
        return out
    if pa.types.is_dictionary(t):
        return equal_mask(a.dictionary_decode(), b.dictionary_decode())
    if pa.types.is_null(t):
        return np.ones(n, dtype=bool)
    if pa.types.is_struct(t):
        eq = np.ones(n, dtype=bool)
        for i in range(t.num_fields):
            eq &= equal_mask(a.field(i), b.field(i))
        return np.where(both_valid, eq, out)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t) or pa.types.is_fixed_size_list(t):
        return np.where(both_valid, _list_equal(a, b, both_valid), out)
    try:
        e = pc.equal(a, b)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return np.where(both_valid, False, out)
    eq = pc.fill_null(e, False).to_numpy(zero_copy_only=False)
    if pa.types.is_floating(t):
        eq |= pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False).to_numpy(zero_copy_only=False)
    return np.where(both_valid, eq, out)


@dataclass(frozen=True)
class Difference:
    """What takes a table from one state to another. `removed` are keys of the old state;
    `added` and the arrays of `modified` are indices into the new state's keys (ascending);
    `modified` names only the columns that changed, each with the rows where it did."""

    removed: np.ndarray
    added: np.ndarray
    modified: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def modified_rows(self) -> np.ndarray:
        """Indices (into the new keys) of the rows changed in any column."""
        if not self.modified:
            return _EMPTY
        return np.unique(np.concatenate(list(self.modified.values())))

    def is_empty(self) -> bool:
        return not self.removed.size and not self.added.size and not self.modified


OldValues = Union[pa.Table, Callable[[np.ndarray], pa.Table]]


def difference(old_keys: npt.ArrayLike, new_keys: npt.ArrayLike, new_values: pa.Table, old_values: OldValues,
               columns: Optional[Sequence[str]] = None) -> Difference:
    """The difference from the old state (`old_keys`, ascending and distinct) to the new one
    (`new_keys` with `new_values`, a row each). `old_values` are the old rows' values: a table
    aligned with `old_keys`, or a function giving the values of the keys it is passed (only the
    keys in both states are asked for). Compares `columns` (default: all of `new_values`), by name."""
    old_keys = np.asarray(old_keys, dtype=np.int64)
    new_keys = np.asarray(new_keys, dtype=np.int64)
    if len(new_values) != new_keys.size:
        raise ValueError(f"{new_keys.size} keys but {len(new_values)} rows of values")
    names = list(columns) if columns is not None else list(new_values.schema.names)
    removed = np.setdiff1d(old_keys, new_keys, assume_unique=True)
    held = np.isin(new_keys, old_keys, assume_unique=True)
    added = np.flatnonzero(~held)
    common = np.flatnonzero(held)
    modified: dict[str, np.ndarray] = {}
    if common.size and names:
        common_keys = new_keys[common]
        if callable(old_values):
            before = old_values(common_keys)
        else:
            before = old_values.take(pa.array(np.searchsorted(old_keys, common_keys)))
        after = new_values.take(pa.array(common))
        for name in names:
            differs = ~equal_mask(before.column(name), after.column(name))
            if differs.any():
                modified[name] = common[differs]
    return Difference(removed=removed, added=added, modified=modified)
