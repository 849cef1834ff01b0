"""Table updates in Deephaven's model: added, removed, modified row keys, shifts, modified columns.

Rules (validated by `TableUpdate.validate`):
- `removed` is in the pre-update key space and is a subset of the previous row set;
- `shifted` moves the surviving rows (previous minus removed) without collisions, keeping order;
- `added` and `modified` are in the post-update key space; `added` does not overlap the shifted
  survivors; the new row set is the shifted survivors plus `added`;
- `modified` is a subset of the new rows that are not added, and `modified_columns` is empty
  exactly when nothing was modified.
Applying an update: remove, shift, add, modify.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from typing import FrozenSet

from tickwire.server.graph.rowset import RowSet, RowSetShiftData

__all__ = ["TableUpdate", "UpdateValidationError"]


class UpdateValidationError(AssertionError):
    """A TableUpdate that breaks the update model."""


@dataclass
class TableUpdate:
    added: RowSet = field(default_factory=RowSet)
    removed: RowSet = field(default_factory=RowSet)
    modified: RowSet = field(default_factory=RowSet)
    shifted: RowSetShiftData = field(default_factory=RowSetShiftData)
    modified_columns: FrozenSet[str] = frozenset()

    def is_empty(self) -> bool:
        return self.added.is_empty() and self.removed.is_empty() and self.modified.is_empty() \
            and self.shifted.is_empty()

    def apply_to(self, prev: RowSet) -> RowSet:
        """The row set after this update."""
        return self.shifted.apply(prev.minus(self.removed)).union(self.added)

    def validate(self, prev: RowSet, new: RowSet) -> None:
        def fail(msg):
            raise UpdateValidationError(f"{msg}: {self}")

        if not self.removed.is_subset_of(prev):
            fail("removed rows are not all in the previous row set")
        try:
            self.shifted.validate()
            survivors = self.shifted.apply(prev.minus(self.removed))
        except ValueError as exc:
            fail(f"bad shifts ({exc})")
        if not self.shifted.is_empty():
            kept = prev.minus(self.removed).keys()
            if kept.size > 1 and np.any(np.diff(self.shifted.apply_to_keys(kept)) <= 0):
                fail("shifts change the order of surviving rows")
        if survivors.overlaps(self.added):
            fail("added rows collide with existing rows")
        if survivors.union(self.added) != new:
            fail(f"previous rows - removed, shifted, + added != new row set ({new})")
        if not self.modified.is_subset_of(survivors):
            fail("modified rows must be existing rows that were not added")
        if self.modified.is_empty() != (len(self.modified_columns) == 0):
            fail("modified columns must be given exactly when rows are modified")

    def __repr__(self) -> str:
        return (f"TableUpdate(added={self.added}, removed={self.removed}, modified={self.modified}, "
                f"shifted={self.shifted}, modified_columns={sorted(self.modified_columns)})")
