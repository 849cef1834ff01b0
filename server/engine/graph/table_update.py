"""Table updates in Deephaven's model: added, removed and modified row keys, shifts, modified columns.

Rules (checked by `TableUpdate.validate`):
- `removed` is in the pre-update key space and is a subset of the previous row set;
- `shifted` is normalised and moves the surviving rows (previous minus removed) without landing on
  a row that stays and without changing their order;
- `added` and `modified` are in the post-update key space; `added` does not overlap the shifted
  survivors, and the new row set is exactly the shifted survivors plus `added`;
- `modified` is a subset of the shifted survivors (never an added row), and `modified_columns` is
  empty exactly when nothing was modified.
Applying an update to a copy of the table: remove, shift, add, modify (in that order); see
`apply_update`. `TableUpdate.coalesce` folds two consecutive updates into one (for publishers that
send the changes of several cycles as one message).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NoReturn, Sequence, Union

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import UnknownColumnError, UpdateValidationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData

__all__ = ["ModifiedColumnSet", "TableUpdate", "UpdateValidationError", "apply_update", "ROW_KEY"]

ROW_KEY = "__row_key"


class ModifiedColumnSet(frozenset[str]):
    """The names of the columns a cycle modified (a frozenset of names, in no order)."""

    @classmethod
    def of(cls, names: Iterable[str] = ()) -> "ModifiedColumnSet":
        return cls(names)

    @classmethod
    def from_indices(cls, schema: pa.Schema, indices: Iterable[int]) -> "ModifiedColumnSet":
        return cls(schema.names[int(i)] for i in indices)

    def indices(self, schema: pa.Schema) -> np.ndarray:
        """Sorted column indices in `schema` (field order), as Barrage's column bitsets use them."""
        unknown = self - set(schema.names)
        if unknown:
            raise KeyError(f"modified columns not in the schema: {sorted(unknown)}")
        return np.array([i for i, n in enumerate(schema.names) if n in self], dtype=np.int64)

    def __repr__(self) -> str:
        return f"ModifiedColumnSet({sorted(self)})"


@dataclass
class TableUpdate:
    added: RowSet = field(default_factory=RowSet)
    removed: RowSet = field(default_factory=RowSet)
    modified: RowSet = field(default_factory=RowSet)
    shifted: RowSetShiftData = field(default_factory=RowSetShiftData)
    modified_columns: ModifiedColumnSet = field(default_factory=ModifiedColumnSet)

    def __post_init__(self) -> None:
        if not isinstance(self.modified_columns, ModifiedColumnSet):
            self.modified_columns = ModifiedColumnSet(self.modified_columns)

    def is_empty(self) -> bool:
        return self.added.is_empty() and self.removed.is_empty() and self.modified.is_empty() \
            and self.shifted.is_empty()

    def apply_to(self, prev: RowSet) -> RowSet:
        """The row set after this update: remove, shift, add."""
        return self.shifted.apply(prev.minus(self.removed)).union(self.added)

    def modified_rows_for(self, column: str) -> RowSet:
        """Rows modified in `column` (all modified rows if the column changed, else none)."""
        return self.modified if column in self.modified_columns else RowSet()

    def validate(self, prev: RowSet, new: RowSet) -> None:
        """Raises UpdateValidationError when the update breaks the model's rules for prev -> new."""
        def fail(msg: str) -> NoReturn:
            raise UpdateValidationError(f"{msg}: {self!r}")

        if not self.removed.is_subset_of(prev):
            fail("removed rows are not all in the previous row set")
        kept = prev.minus(self.removed)
        try:
            self.shifted.validate()
            survivors = self.shifted.apply(kept)
        except ValueError as exc:
            fail(f"bad shifts ({exc})")
        if not self.shifted.is_empty() and len(kept) > 1 and not _order_preserved(self.shifted, kept):
            fail("shifts change the order of surviving rows")
        if survivors.overlaps(self.added):
            fail("added rows collide with surviving rows")
        if survivors.union(self.added) != new:
            fail(f"previous rows - removed, shifted, + added != new row set {new!r}")
        if not self.modified.is_subset_of(survivors):
            fail("modified rows must be surviving rows (not added ones) in post-shift key space")
        if self.modified.is_empty() != (len(self.modified_columns) == 0):
            fail("modified columns must be given exactly when rows are modified")

    def coalesce(self, later: "TableUpdate", prev: RowSet) -> "TableUpdate":
        """One update equivalent to this update followed by `later`.

        `prev` is the row set before this update. Rows added here and removed later vanish; rows
        added here and modified later are added; removed rows are reported in the pre-update key
        space of this update; the shifts are the composition of both shift lists, restricted to
        the surviving rows. Modified rows of either update that survive (and were not added) are
        modified, under the union of both modified-column sets. Costs follow the two updates'
        row sets and shift counts, not the table.
        """
        # rows of `prev` that `later` removes: map them back through this update's shifts
        later_gone = later.removed.minus(self.added)
        removed = self.removed.union(unshift(self.shifted, later_gone, prev))
        added = later.shifted.apply(self.added.minus(later.removed)).union(later.added)
        survivors = prev.minus(removed)
        shifted = _compose_shifts(self.shifted, later.shifted, survivors)
        carried = later.shifted.apply(self.modified.minus(later.removed))
        modified = carried.union(later.modified).minus(added)
        columns = ModifiedColumnSet(self.modified_columns | later.modified_columns) if modified else \
            ModifiedColumnSet()
        return TableUpdate(added=added, removed=removed, modified=modified, shifted=shifted,
                           modified_columns=columns)

    def __repr__(self) -> str:
        return (f"TableUpdate(added={self.added!r}, removed={self.removed!r}, modified={self.modified!r}, "
                f"shifted={self.shifted!r}, modified_columns={sorted(self.modified_columns)})")


def _order_preserved(shifted: RowSetShiftData, kept: RowSet) -> bool:
    """True when the shifts map the kept keys to strictly ascending keys.

    The mapping is increasing inside each piece between shift boundaries, so it is enough that at
    every boundary the nearest kept key below it lands before the nearest kept key above it.
    """
    cuts = unique(np.concatenate((shifted.starts, shifted.ends + 1)))
    r = kept.rank(cuts)
    both = (r > 0) & (r < len(kept))
    if not both.any():
        return True
    below = kept.select(r[both] - 1)
    above = kept.select(r[both])
    return bool(np.all(shifted.apply_to_keys(below) < shifted.apply_to_keys(above)))


def unshift(shifted: RowSetShiftData, post: RowSet, prev: RowSet) -> RowSet:
    """The keys of `prev` that `shifted` moved (or left) onto the keys of `post`.

    A destination range may cover a key that did not move, so each key's candidate origin is
    checked: it must be in `prev` and map forward onto the key; otherwise the key did not move.
    """
    if shifted.is_empty() or post.is_empty():
        return post
    y = post.keys()
    origin = shifted.unapply_keys(y)
    moved = (origin != y) & prev.contains(origin)
    moved[moved] = shifted.apply_to_keys(origin[moved]) == y[moved]
    return RowSet.from_keys(np.where(moved, origin, y))


def _compose_shifts(first: RowSetShiftData, second: RowSetShiftData, survivors: RowSet) -> RowSetShiftData:
    """Shifts equal to `first` then `second` on the keys of `survivors` (pre-`first` key space),
    normalised and tightened to the surviving keys they move."""
    if survivors.is_empty() or (first.is_empty() and second.is_empty()):
        return RowSetShiftData()
    if second.is_empty():
        return _tighten(first, survivors)
    # breakpoints in pre-`first` key space: each piece between two consecutive ones moves by one
    # delta under `first` and lands inside one range (or gap) of `second`
    bounds = np.concatenate((second.starts, second.ends + 1))
    pts = [first.starts, first.ends + 1, bounds]
    if not first.is_empty():
        ds, de = first.starts + first.deltas, first.ends + first.deltas
        i = np.searchsorted(ds, bounds, side="right") - 1
        inside = i >= 0
        inside[inside] = bounds[inside] <= de[i[inside]] + 1
        pts.append(bounds[inside] - first.deltas[i[inside]])
    lo, hi = survivors.first(), survivors.last()
    cuts = unique(np.clip(np.concatenate(pts + [np.array([lo, hi + 1], dtype=np.int64)]), lo, hi + 1))
    piece_lo, piece_hi = cuts[:-1], cuts[1:] - 1
    return _pieces_to_shifts(piece_lo, piece_hi, survivors,
                             lambda k: second.apply_to_keys(first.apply_to_keys(k)) - k)


def _tighten(shifted: RowSetShiftData, survivors: RowSet) -> RowSetShiftData:
    lo, hi = survivors.first(), survivors.last()
    cuts = unique(np.clip(np.concatenate((shifted.starts, shifted.ends + 1, [lo, hi + 1])), lo, hi + 1))
    return _pieces_to_shifts(cuts[:-1], cuts[1:] - 1, survivors, lambda k: shifted.apply_to_keys(k) - k)


def _pieces_to_shifts(piece_lo: np.ndarray, piece_hi: np.ndarray, survivors: RowSet,
                      delta_of: Callable[[np.ndarray], np.ndarray]) -> RowSetShiftData:
    """Shift ranges from pieces of key space, each moved by one delta: each piece is cut down to
    its first and last surviving key, pieces that do not move are dropped, and consecutive
    pieces with equal delta and no surviving key between them are merged."""
    r_lo = survivors.rank(piece_lo)
    r_hi = survivors.rank(piece_hi + 1)  # one past the piece's last survivor, in positions
    has = r_hi > r_lo
    if not has.any():
        return RowSetShiftData()
    r_lo, r_hi = r_lo[has], r_hi[has]
    a = survivors.select(r_lo)
    b = survivors.select(r_hi - 1)
    d = delta_of(a)
    move = d != 0
    a, b, d, r_lo, r_hi = a[move], b[move], d[move], r_lo[move], r_hi[move]
    if a.size > 1:
        join = (d[1:] == d[:-1]) & (r_lo[1:] == r_hi[:-1])
        if join.any():
            keep_first = np.concatenate(([True], ~join))
            keep_last = np.concatenate((~join, [True]))
            a, d, b = a[keep_first], d[keep_first], b[keep_last]
    out = RowSetShiftData(a, b, d)
    out.validate()
    return out


def column_names(schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
    """`columns` checked against the schema (all columns when None)."""
    if columns is None:
        return list(schema.names)
    names = list(columns)
    unknown = [c for c in names if c not in schema.names]
    if unknown:
        raise UnknownColumnError(f"no column {unknown[0]!r} (columns: {', '.join(schema.names)})")
    return names


# ----------------------------------------------------------------------------------------------
# applying an update to a copy of a table's state
# ----------------------------------------------------------------------------------------------

def _lookup(keys: np.ndarray, want: np.ndarray, what: str) -> np.ndarray:
    """Index in the ascending `keys` of each of `want`; UpdateValidationError for a missing key."""
    idx = np.searchsorted(keys, want)
    ok = idx < keys.size
    ok[ok] = keys[idx[ok]] == want[ok]
    if not ok.all():
        raise UpdateValidationError(f"{what}: row key {int(want[~ok][0])} is missing")
    return idx


#: a table's state for `apply_update` in dict form: row key -> row (column name -> value)
DictState = dict[int, dict[str, Any]]


def apply_update(prev_state: Union[pa.Table, DictState], update: TableUpdate, new_values: Union[pa.Table, DictState],
                 key_column: str = ROW_KEY) -> Union[pa.Table, DictState]:
    """Applies `update` to a copy of a table's previous state: remove, shift, add, modify.

    `prev_state` is either a pyarrow Table with an int64 row-key column `key_column` (ascending)
    or a dict row key -> row (a dict of column values). `new_values` holds the values after the
    update of at least the added and modified rows, in the same form (a Table with the key column,
    in any row order, or a dict). Added rows take all their values from `new_values`; modified rows
    take only the columns in `update.modified_columns` from it and keep the others, so applying an
    update whose modified-column set misses a changed column gives a state different from the table.
    Returns the new state in the form of `prev_state` (a Table sorted by row key, or a dict).
    Raises UpdateValidationError when a key the update names is absent where it must be.
    """
    if isinstance(prev_state, dict):
        return _apply_to_dict(prev_state, update, new_values, key_column)
    if not isinstance(prev_state, pa.Table):
        raise TypeError(f"prev_state must be a pyarrow Table or a dict, got {type(prev_state).__name__}")
    return _apply_to_table(prev_state, update, new_values, key_column)


def _apply_to_dict(prev: DictState, update: TableUpdate, new_values: Union[pa.Table, DictState], key: str) -> DictState:
    if isinstance(new_values, pa.Table):
        keys = new_values.column(key).to_pylist()
        rows = new_values.drop_columns([key]).to_pylist()
        new_values = dict(zip(keys, rows))
    old_keys = np.array(sorted(prev), dtype=np.int64)
    gone = update.removed.contains(old_keys)
    missing = update.removed.minus(RowSet.from_keys(old_keys))
    if not missing.is_empty():
        raise UpdateValidationError(f"removed row key {missing.first()} is not in the previous state")
    kept = old_keys[~gone]
    moved = update.shifted.apply_to_keys(kept)
    out = {int(n): prev[int(o)] for o, n in zip(kept.tolist(), moved.tolist())}
    for k in update.added.keys().tolist():
        if k in out:
            raise UpdateValidationError(f"added row key {k} is already in the state")
        if k not in new_values:
            raise UpdateValidationError(f"added row key {k} has no new values")
        out[k] = dict(new_values[k])
    cols = update.modified_columns
    for k in update.modified.keys().tolist():
        if k not in out:
            raise UpdateValidationError(f"modified row key {k} is not in the state")
        if k not in new_values:
            raise UpdateValidationError(f"modified row key {k} has no new values")
        row = dict(out[k])
        row.update({c: v for c, v in new_values[k].items() if c in cols})
        out[k] = row
    return dict(sorted(out.items()))


def _apply_to_table(prev: pa.Table, update: TableUpdate, new_values: pa.Table, key: str) -> pa.Table:
    keys = prev.column(key).to_numpy().astype(np.int64, copy=False)
    if keys.size > 1 and np.any(keys[1:] <= keys[:-1]):
        raise ValueError(f"the state's {key!r} column must be strictly ascending")
    _lookup(keys, update.removed.keys(), "removed")
    keep = ~update.removed.contains(keys)
    state = prev.filter(pa.array(keep))
    moved = update.shifted.apply_to_keys(keys[keep])
    ki = state.schema.get_field_index(key)
    state = state.set_column(ki, state.schema.field(ki), pa.array(moved, type=pa.int64()))
    if moved.size > 1 and np.any(moved[1:] <= moved[:-1]):
        raise UpdateValidationError("shifts change the order of the state's rows")

    nv = new_values.select(state.column_names)
    nv_keys = nv.column(key).to_numpy().astype(np.int64, copy=False)
    order = np.argsort(nv_keys, kind="stable")
    nv, nv_keys = nv.take(pa.array(order)), nv_keys[order]

    if not update.modified.is_empty():
        mkeys = update.modified.keys()
        at = _lookup(moved, mkeys, "modified (in the shifted state)")
        src = _lookup(nv_keys, mkeys, "modified (in the new values)")
        # per modified column: one take over [state rows, new rows]
        take = np.arange(state.num_rows, dtype=np.int64)
        take[at] = state.num_rows + src
        take_arr = pa.array(take)
        for name in update.modified_columns:
            if name == key:
                continue
            i = state.schema.get_field_index(name)
            combined = pa.concat_arrays([state.column(name).combine_chunks(), nv.column(name).combine_chunks()])
            state = state.set_column(i, state.schema.field(i), combined.take(take_arr))
    if not update.added.is_empty():
        akeys = update.added.keys()
        if moved.size and update.added.contains(moved).any():
            raise UpdateValidationError("added rows collide with rows of the state")
        src = _lookup(nv_keys, akeys, "added (in the new values)")
        state = pa.concat_tables([state, nv.take(pa.array(src))]).combine_chunks()
        all_keys = np.concatenate((moved, akeys))
        state = state.take(pa.array(np.argsort(all_keys, kind="stable")))
    return state
