"""Columns of a subscriber's state that can be changed in place.

Fixed-width values (integers, floats, booleans, dates, times, timestamps, durations) live in a
growable numpy buffer with a validity mask: appends are amortised O(rows added) and modifications
O(rows modified), whatever the size of the table. Other types (strings, binary, lists, decimals)
are kept as Arrow arrays: appends add chunks and modifications are recorded as patches, both
applied together (one concatenation and one `take`) when the column is next read, removed from
or inserted into.

`arrow()` hands out an Arrow array over the buffer without copying; the buffer is copied before
the next change, so arrays already handed out never change.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from tickwire.protocol.schema import empty_array, numpy_storage_dtype

__all__ = ["Column"]


def _values(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    """The values of a fixed-width array as numpy (nulls hold whatever the buffer holds)."""
    n, off = len(arr), arr.offset
    buf = arr.buffers()[1]
    if dtype == np.dtype(bool):
        if buf is None:
            return np.zeros(n, dtype=bool)
        bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
        return bits[off:off + n].astype(bool)
    if buf is None:
        return np.zeros(n, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=off + n)[off:]


def _valid(arr: pa.Array) -> Optional[np.ndarray]:
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


class Column:
    """One column: `len(col)` values of Arrow type `type`."""

    def __init__(self, t: pa.DataType, arr: Optional[pa.Array] = None):
        self.type = t
        self.dtype = numpy_storage_dtype(t)
        self.n = 0
        self._arrow: Optional[pa.Array] = empty_array(t) if self.dtype is None else None
        self._chunks: list[pa.Array] = []  # appended after _arrow, not yet concatenated
        self._patches: list[tuple[np.ndarray, pa.Array]] = []  # modifications not yet applied, in order
        self._vals: Optional[np.ndarray] = None if self.dtype is None else np.empty(16, dtype=self.dtype)
        self._valid: Optional[np.ndarray] = None  # None: no nulls
        self._shared = False  # an Arrow view of the buffer was handed out: copy before changing it
        if arr is not None:
            self.append(arr)

    @property
    def _buffer(self) -> np.ndarray:
        """The value buffer of a fixed-width column (`dtype` set)."""
        assert self._vals is not None, "an Arrow-held column has no value buffer"
        return self._vals

    def __len__(self) -> int:
        return self.n

    def _settle(self) -> pa.Array:
        """Applies pending appends and modifications of an Arrow-held column."""
        if self._chunks:
            self._arrow = pa.concat_arrays([self._arrow, *self._chunks])
            self._chunks = []
        if self._patches:
            src = np.arange(self.n, dtype=np.int64)
            base = self.n
            for pos, arr in self._patches:
                src[pos] = base + np.arange(len(arr), dtype=np.int64)
                base += len(arr)
            merged = pa.concat_arrays([self._arrow, *(arr for _, arr in self._patches)])
            self._arrow = merged.take(pa.array(src, type=pa.int64()))
            self._patches = []
        return self._arrow

    # -- reading ------------------------------------------------------------------------------------
    def arrow(self) -> pa.Array:
        if self.dtype is None:
            return self._settle()
        n = self.n
        validity = None
        nulls = 0
        if self._valid is not None:
            v = self._valid[:n]
            nulls = int(n - np.count_nonzero(v))
            if nulls:
                validity = pa.py_buffer(np.packbits(v, bitorder="little"))
        if self.dtype == np.dtype(bool):
            data = pa.py_buffer(np.packbits(self._buffer[:n], bitorder="little"))
        else:
            data = pa.py_buffer(self._buffer[:n])
            self._shared = True
        return pa.Array.from_buffers(self.type, n, [validity, data], null_count=nulls)

    def take(self, idx: np.ndarray) -> pa.Array:
        """Values at positions `idx` (an Arrow array)."""
        if self.dtype is None:
            return self._settle().take(pa.array(idx, type=pa.int64()))
        vals = self._buffer[idx]
        if self.dtype == np.dtype(bool):
            mask = None if self._valid is None else ~self._valid[idx]
            return pa.array(vals, type=self.type, mask=mask)
        validity, nulls = None, 0
        if self._valid is not None:
            v = self._valid[idx]
            nulls = int(v.size - np.count_nonzero(v))
            if nulls:
                validity = pa.py_buffer(np.packbits(v, bitorder="little"))
        return pa.Array.from_buffers(self.type, vals.size, [validity, pa.py_buffer(vals)], null_count=nulls)

    # -- changing -------------------------------------------------------------------------------------
    def _own(self, need: int) -> None:
        """Makes the buffers private (after an Arrow view was handed out) and at least `need` long."""
        cap = self._buffer.size
        if need > cap or self._shared:
            new_cap = max(need, cap * 2 if need > cap else cap, 16)
            vals = np.empty(new_cap, dtype=self.dtype)
            vals[:self.n] = self._buffer[:self.n]
            self._vals = vals
            if self._valid is not None:
                valid = np.ones(new_cap, dtype=bool)
                valid[:self.n] = self._valid[:self.n]
                self._valid = valid
            self._shared = False

    def _mark_valid(self, lo: int, hi: int, valid: Optional[np.ndarray]) -> None:
        if valid is None:
            if self._valid is not None:
                self._valid[lo:hi] = True
            return
        if self._valid is None:
            self._valid = np.ones(self._buffer.size, dtype=bool)
        self._valid[lo:hi] = valid

    def append(self, arr: pa.Array) -> None:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if self.dtype is None:
            assert self._arrow is not None  # an Arrow-held column
            if self._arrow.type != arr.type:
                raise TypeError(f"a {arr.type} array for a column of {self._arrow.type}")
            self._chunks.append(arr)
            self.n += len(arr)
            return
        m = len(arr)
        self._own(self.n + m)
        self._buffer[self.n:self.n + m] = _values(arr, self.dtype)
        self._mark_valid(self.n, self.n + m, _valid(arr))
        self.n += m

    def set(self, pos: np.ndarray, arr: pa.Array) -> None:
        """Writes `arr` at positions `pos`."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if self.dtype is None:
            if len(arr) != pos.size:
                raise ValueError(f"{pos.size} positions for {len(arr)} values")
            self._patches.append((np.array(pos, dtype=np.int64), arr))
            return
        self._own(self.n)
        self._buffer[pos] = _values(arr, self.dtype)
        valid = _valid(arr)
        if valid is not None:
            if self._valid is None:
                self._valid = np.ones(self._buffer.size, dtype=bool)
            self._valid[pos] = valid
        elif self._valid is not None:
            self._valid[pos] = True

    def keep(self, idx: np.ndarray) -> None:
        """Keeps the values at positions `idx` (sorted), in that order: removals."""
        if self.dtype is None:
            self._arrow = self._settle().take(pa.array(idx, type=pa.int64()))
            self.n = len(self._arrow)
            return
        self._vals = self._buffer[idx]
        if self._valid is not None:
            self._valid = self._valid[idx]
        self._shared = False
        self.n = idx.size

    def insert(self, at: np.ndarray, arr: pa.Array) -> None:
        """Inserts `arr[i]` before the current position `at[i]` (`at` sorted; numpy.insert's rule)."""
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        m = len(arr)
        if m == 0:
            return
        if at.size and at[0] >= self.n:
            self.append(arr)
            return
        if self.dtype is None:
            self._settle()
            new_pos = at + np.arange(m)
            src = np.empty(self.n + m, dtype=np.int64)
            is_new = np.zeros(self.n + m, dtype=bool)
            is_new[new_pos] = True
            src[~is_new] = np.arange(self.n)
            src[is_new] = self.n + np.arange(m)
            self._arrow = pa.concat_arrays([self._arrow, arr]).take(pa.array(src, type=pa.int64()))
            self.n = len(self._arrow)
            return
        vals = _values(arr, self.dtype)
        valid = _valid(arr)
        n = self.n
        self._vals = np.insert(self._buffer[:n], at, vals)
        if valid is not None or self._valid is not None:
            old = self._valid[:n] if self._valid is not None else np.ones(n, dtype=bool)
            self._valid = np.insert(old, at, valid if valid is not None else np.ones(m, dtype=bool))
        self._shared = False
        self.n = n + m
