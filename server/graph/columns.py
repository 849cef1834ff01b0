"""Column storage addressed by slot: bulk writes and bulk gathers, no per-row Python code.

Fixed-width columns (integers, floats, booleans, temporal types) live in numpy arrays of their
storage type with a separate validity array; other columns (strings, binaries, lists, decimals)
live in numpy object arrays filled and read by C-level conversions. Capacity grows by doubling.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ColumnStore"]


def _storage_dtype(t: pa.DataType) -> Optional[np.dtype]:
    if pa.types.is_boolean(t):
        return np.dtype(bool)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.dtype(np.int32)
    return None


class _Column:
    __slots__ = ("type", "dtype", "values", "valid", "storage_type")

    def __init__(self, t: pa.DataType, capacity: int):
        self.type = t
        self.dtype = _storage_dtype(t)
        if self.dtype is None:
            self.values = np.empty(capacity, dtype=object)
            self.storage_type = t
        else:
            self.values = np.zeros(capacity, dtype=self.dtype)
            self.storage_type = pa.from_numpy_dtype(self.dtype) if self.dtype != bool else pa.bool_()
        self.valid = np.zeros(capacity, dtype=bool)

    def grow(self, capacity: int) -> None:
        for name in ("values", "valid"):
            old = getattr(self, name)
            new = np.empty(capacity, dtype=old.dtype) if old.dtype == object else np.zeros(capacity, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)

    def write(self, slots: np.ndarray, arr: pa.Array) -> None:
        if arr.null_count:
            self.valid[slots] = arr.is_valid().to_numpy(zero_copy_only=False)
        else:
            self.valid[slots] = True
        if self.dtype is None:
            self.values[slots] = np.fromiter(arr.to_pylist(), dtype=object, count=len(arr))
            return
        if self.storage_type != arr.type:
            arr = arr.view(self.storage_type)
        if arr.null_count:
            arr = pc.fill_null(arr, pa.scalar(False if self.dtype == bool else 0, self.storage_type))
        self.values[slots] = arr.to_numpy(zero_copy_only=False)

    def gather(self, slots: np.ndarray) -> pa.Array:
        valid = self.valid[slots]
        mask = None if valid.all() else ~valid
        if self.dtype is None:
            return pa.array(self.values[slots], type=self.type, mask=mask)
        out = pa.array(self.values[slots], type=self.storage_type, mask=mask)
        return out if self.storage_type == self.type else out.view(self.type)


class ColumnStore:
    """Columns of one table, addressed by integer slots."""

    def __init__(self, schema: pa.Schema, capacity: int = 1024):
        self.schema = schema
        self.capacity = max(16, capacity)
        self.columns = [_Column(f.type, self.capacity) for f in schema]
        self.index = {name: i for i, name in enumerate(schema.names)}

    def ensure(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        new = self.capacity
        while new < capacity:
            new *= 2
        for c in self.columns:
            c.grow(new)
        self.capacity = new

    def write(self, slots: np.ndarray, table: pa.Table) -> None:
        """Writes every column of `table` (same column order as the schema) at `slots`."""
        if len(slots) == 0:
            return
        self.ensure(int(slots.max()) + 1)
        for c, col in zip(self.columns, table.columns):
            c.write(slots, col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        names = list(columns) if columns is not None else self.schema.names
        arrays = [self.columns[self.index[n]].gather(slots) for n in names]
        return pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(n) for n in names]))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.columns[self.index[name]].gather(slots)
