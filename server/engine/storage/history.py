"""History plus live as one table: a dataset's Parquet locations (static) followed by the rows
written to the table since (intraday, ticking).

Row keys: location i holds `[i << REGION_BITS, ...)` (`parquet.py`); intraday rows are appended
from INTRADAY_BASE on, after every location, so history never shifts and the live tail appends
(the table stays append-only). Column data of the history is read per row group when a snapshot,
viewport or operation gathers those rows; intraday rows live in memory as an append table's do.

A `where` whose predicate reads only partition columns asks `prune` which locations pass: their
rows are taken by key range, and no Parquet data is read (WhereTable does that for any parent with
a `prune`).

This module must not touch the engine's lock or the update graph's private state: the table is
made under the graph's lock by the engine (`Engine.history`) and updated by cycles like any
source table. With a data directory its intraday rows are journaled and checkpointed as an append
table's (a checkpoint keeps the intraday rows only), and come back when the server starts with
the same history table again.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.graph.column_store import ColumnStore
from tickwire.server.engine.graph.ops.base import _evaluate, expression_columns
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.sources import AppendOnlyTable, _concat, _Input
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.storage.parquet import REGION_BITS, Dataset, ParquetRows

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["HistoryTable", "INTRADAY_BASE"]

#: the first row key of the intraday rows (far above any location's region)
INTRADAY_BASE = 1 << 62
assert INTRADAY_BASE >> REGION_BITS > 1 << 20  # room for a million locations below it


class _Rows:
    """Reads by row key: history keys from the Parquet locations, intraday keys from memory."""

    def __init__(self, history: ParquetRows, intraday: ColumnStore):
        self.history = history
        self.intraday = intraday

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        live = slots >= INTRADAY_BASE
        if not live.any():
            return self.history.gather(slots, columns)
        if live.all():
            return self.intraday.gather(slots - INTRADAY_BASE, columns)
        old = self.history.gather(slots[~live], columns)
        new = self.intraday.gather(slots[live] - INTRADAY_BASE, columns)
        both = pa.concat_tables([old, new])
        # back to the asked order: history rows first in `both`, intraday rows after them
        where = np.empty(slots.size, dtype=np.int64)
        where[~live] = np.arange(old.num_rows)
        where[live] = old.num_rows + np.arange(new.num_rows)
        return both.take(pa.array(where, type=pa.int64()))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class HistoryTable(AppendOnlyTable):
    """A table whose rows are a Parquet dataset's locations (in partition-value order) followed by
    the rows written to it (the intraday part, which has the same columns, partition columns
    included)."""

    catalog_kind = "append"  # written, and checked by DoPut, as an append table

    def __init__(self, graph: "UpdateGraph", name: str, history: ParquetRows):
        super().__init__(graph, name, history.schema)
        self.history = history
        self.intraday = self.store
        assert isinstance(self.intraday, ColumnStore)
        self.store = _Rows(history, self.intraday)  # type: ignore[assignment]
        self._history_rows = RowSet.from_ranges(history.key_ranges())
        self._live = 0  # intraday slots used (a merged row's slot is not reused)
        self._intraday_rows = RowSet()
        # locations to adopt at the next cycle: (their indexes, the intraday keys they replace)
        self._adopt: Optional[tuple[list[int], RowSet]] = None
        self.adopted = threading.Event()  # set by the cycle that adopted a location
        self.dataset: Optional[Dataset] = None  # set by Engine.history
        self.rowset = self._history_rows
        self.prev_rowset = self.rowset

    @property
    def intraday_rows(self) -> RowSet:
        return self._intraday_rows

    @property
    def next_key(self) -> int:
        return INTRADAY_BASE + self._live

    def _set_rows(self) -> None:
        # made from ranges, so that positions are found by searching them (a billion keys of
        # history in a few ranges: the bitmap's own select would cost per key)
        self.rowset = RowSet.from_ranges(np.concatenate((self._history_rows.ranges(), self._intraday_rows.ranges())))

    def apply_pending(self, step: int, ops: list[_Input]) -> Optional[TableUpdate]:
        adopt, self._adopt = self._adopt, None
        data = _concat(ops)
        if (data is None or data.num_rows == 0) and adopt is None:
            return None
        self.prev_rowset = self.rowset
        added = RowSet()
        removed = RowSet()
        if adopt is not None:  # a merged location replaces the intraday rows it was written from
            indexes, replaced = adopt
            region = RowSet.from_ranges(self.history.key_ranges(np.array(indexes, dtype=np.int64)))
            self._history_rows = self._history_rows.union(region)
            self._intraday_rows = self._intraday_rows.minus(replaced)
            added, removed = region, replaced
            self.adopted.set()
        if data is not None and data.num_rows:
            n = data.num_rows
            first = self._live
            self.intraday.ensure(first + n)
            self.intraday.write(np.arange(first, first + n, dtype=np.int64), data)
            self._live = first + n
            new = RowSet.range(INTRADAY_BASE + first, INTRADAY_BASE + first + n - 1)
            self._intraday_rows = self._intraday_rows.union(new)
            added = added.union(new)
        self._set_rows()
        return TableUpdate(added=added, removed=removed)

    def adopt_locations(self, indexes: Sequence[int], replaced: RowSet) -> None:
        """At the next cycle, locations `indexes` (just added to the history) come in and the
        intraday rows `replaced` go: one update, removed and added rows (engine-internal: a merge,
        a refresh)."""
        with self._pending_lock:
            self.adopted.clear()
            self._adopt = (list(indexes), replaced)

    def drop_intraday(self, keys: RowSet) -> None:
        """Removes intraday rows outside any cycle: only before the table is served (a merge
        finished at start)."""
        self._intraday_rows = self._intraday_rows.minus(keys)
        self._history_rows = RowSet.from_ranges(self.history.key_ranges())
        self._set_rows()
        self.prev_rowset = self.rowset

    def stable_rows(self, rows: RowSet) -> RowSet:
        """The history rows: a location's Parquet never changes once served (a merge adds
        locations; the read cache has its own lock)."""
        return rows.subset_by_key_range(0, INTRADAY_BASE - 1)

    checkpoint_rows_stay = False   # a merge takes intraday rows out

    def checkpoint_rows(self) -> RowSet:
        """A checkpoint keeps the intraday rows; the history is the dataset's."""
        return self._intraday_rows

    def _restore(self, row_keys: np.ndarray, data: pa.Table, next_key: int) -> None:
        """A checkpoint's intraday rows with their keys (from INTRADAY_BASE on; keys from 0 when an
        append table of the same name wrote it: the same rows in the same order)."""
        n = data.num_rows
        if n and int(row_keys[0]) < INTRADAY_BASE:
            if not np.array_equal(row_keys, np.arange(n, dtype=np.int64)):
                raise ValueError(f"table {self.name!r}: an append table's row keys are 0..n-1")
            row_keys = row_keys + INTRADAY_BASE
            next_key = INTRADAY_BASE + n
        slots = row_keys - INTRADAY_BASE
        self._live = max(int(next_key) - INTRADAY_BASE, int(slots[-1]) + 1 if n else 0)
        if n:
            self.intraday.ensure(self._live)
            self.intraday.write(slots, data)
        self._intraday_rows = RowSet.from_keys(row_keys)
        self._set_rows()

    def rows_of_partition(self, value: object) -> RowSet:
        """The intraday rows whose first partition column holds `value`."""
        col = self.history.partition_names[0]
        keys = self._intraday_rows.keys()
        if keys.size == 0:
            return RowSet()
        have = self.gather([col], keys).column(0)
        want = pa.scalar(value).cast(self.schema.field(col).type)
        mask = np.asarray(pc.fill_null(pc.equal(have, want), False).to_numpy(zero_copy_only=False), dtype=bool)
        return RowSet.from_keys(keys[mask])

    def intraday_partition_values(self) -> list[Any]:
        """The distinct values of the first partition column among the intraday rows, ascending (nulls left out)."""
        col = self.history.partition_names[0]
        keys = self._intraday_rows.keys()
        if keys.size == 0:
            return []
        values = pc.unique(self.gather([col], keys).column(0)).drop_null()
        return sorted(values.to_pylist())

    def prune(self, predicate: pc.Expression) -> Optional[tuple[RowSet, RowSet]]:
        """For a predicate that reads only partition columns: (the history rows of the locations
        for which it holds, the intraday rows, which the caller filters itself); None otherwise."""
        if not isinstance(predicate, pc.Expression):
            return None
        used = expression_columns(predicate, self.schema)
        parts = set(self.history.partition_names)
        if not used or not set(used) <= parts:
            return None
        values = self.history.partition_values()
        if values.num_rows == 0:
            kept = RowSet()
        else:
            passes = _evaluate(values, [predicate], ["_"]).column(0).combine_chunks()
            mask = np.asarray(pc.fill_null(passes, False).to_numpy(zero_copy_only=False), dtype=bool)
            kept = RowSet.from_ranges(self.history.key_ranges(np.flatnonzero(mask)))
        return kept, self._intraday_rows
