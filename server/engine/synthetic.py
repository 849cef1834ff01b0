"""Source tables whose values are computed from their row keys, as Deephaven's `empty_table` and
`time_table` are: nothing is stored, so their size costs nothing until rows are read.

- `empty_table(engine, name, n)`: n rows and no columns, static and flat;
- `time_table(engine, name, period_ns, start_ns=None, blink=False)`: one column `Timestamp`
  (Instant); row k holds `start + k * period`. Each cycle adds the rows whose time has come by the
  engine clock's now (`Clock.now_ns`). With a start time the rows up to now exist at once;
  without one the first cycle takes now, rounded down to a multiple of the period, as the start and
  adds that one row. A blink time table keeps only the rows of the last cycle (its row keys keep
  growing, as Deephaven's do); otherwise it is append-only and flat.

Both are made inside the engine's `writing()` and registered in its graph like any other table.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table

if TYPE_CHECKING:
    from tickwire.server.engine.core import Engine
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["EmptyTable", "TimeTable", "empty_table", "time_table", "rows_without_columns", "TIMESTAMP"]

TIMESTAMP = "Timestamp"
_INT64_MAX = 2 ** 63 - 1
_TS = pa.timestamp("ns", "UTC")


def rows_without_columns(n: int) -> pa.Table:
    """A table of `n` rows and no columns (pyarrow keeps the row count of a table whose columns
    were all dropped)."""
    return pa.table({"_": pa.nulls(int(n))}).drop_columns(["_"])


def _keys_of(rowset: Rows) -> np.ndarray:
    return rowset.keys() if isinstance(rowset, RowSet) else np.asarray(rowset, dtype=np.int64).ravel()


class _SyntheticStore:
    """Values computed from storage slots (= row keys)."""

    def __init__(self, table: "EmptyTable | TimeTable"):
        self.table = table

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        return self.table.values(np.asarray(slots, dtype=np.int64), column_names(self.table.schema, columns))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class EmptyTable(Table):
    """n rows, no columns, never changing."""

    is_refreshing = False

    def __init__(self, graph: "UpdateGraph", name: str, n: int):
        if int(n) < 0:
            raise OperationError(f"table {name!r}: an empty table has at least 0 rows, got {n}")
        super().__init__(graph, name, pa.schema([]))
        self.store = _SyntheticStore(self)
        self.rowset = RowSet.range(0, int(n) - 1)
        self.attributes = {"IsFlat": True}

    def values(self, keys: np.ndarray, names: list[str]) -> pa.Table:
        return rows_without_columns(keys.size)


class TimeTable(Table):
    """A ticking table of one Instant column `Timestamp` driven by the graph's clock (see the
    module documentation)."""

    def __init__(self, graph: "UpdateGraph", name: str, period_ns: int, start_ns: Optional[int] = None,
                 blink: bool = False):
        period_ns = int(period_ns)
        if period_ns <= 0:
            raise OperationError(f"table {name!r}: a time table's period must be positive, got {period_ns} ns")
        super().__init__(graph, name, pa.schema([pa.field(TIMESTAMP, _TS)]))
        self.store = _SyntheticStore(self)
        self.period = period_ns
        self.start: Optional[int] = None if start_ns is None else int(start_ns)
        self.blink = bool(blink)
        self._last = -1  # the last row key made
        self.attributes = {"BlinkTable": True} if self.blink else {"AddOnly": True, "AppendOnly": True,
                                                                    "IsFlat": True}
        if self.start is not None:
            self._advance(self.graph.clock.now_ns())
            self.rowset = RowSet.range(0, self._last)

    def values(self, keys: np.ndarray, names: list[str]) -> pa.Table:
        if not names:
            return rows_without_columns(keys.size)
        start = 0 if self.start is None else self.start
        ts = start + keys * self.period  # keys are below the last key, whose time fits int64
        return pa.table({TIMESTAMP: pa.array(ts, _TS)})

    def _advance(self, now: int) -> None:
        """Moves `_last` to the last row whose time is at most `now`."""
        assert self.start is not None
        if now < self.start:
            return
        last = (now - self.start) // self.period
        last = min(last, (_INT64_MAX - self.start) // self.period)  # times stay within int64
        self._last = max(self._last, last)

    def apply_pending(self, step: int, ops: list[Any]) -> Optional[TableUpdate]:
        now = self.graph.clock.now_ns()
        first = self._last + 1
        if self.start is None:
            self.start = now - now % self.period
            self._last = 0
        else:
            self._advance(now)
        added = RowSet.range(first, self._last) if first <= self._last else RowSet()
        prev = self.rowset
        removed = prev if self.blink else RowSet()
        if added.is_empty() and removed.is_empty():
            return None
        self.prev_rowset = prev
        if self.blink:
            self.rowset = added
        else:
            self.rowset = RowSet.range(0, self._last)
        return TableUpdate(added=added, removed=removed)


def empty_table(engine: "Engine", name: str, n: int) -> Table:
    """A new `EmptyTable` of `n` rows named `name` (made under the engine's `writing()`)."""
    with engine.writing():
        return EmptyTable(engine.graph, name, n)


def time_table(engine: "Engine", name: str, period_ns: int, start_ns: Optional[int] = None,
               blink: bool = False) -> Table:
    """A new `TimeTable` named `name` ticking on the engine's clock (made under `writing()`)."""
    with engine.writing():
        return TimeTable(engine.graph, name, period_ns, start_ns, blink)
