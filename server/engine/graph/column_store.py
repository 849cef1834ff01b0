"""Column storage addressed by slot, row-wise value comparison, and key hashing; all in bulk.

Fixed-width columns (integers, floats, booleans, temporal types) live in numpy arrays of their
storage type with a separate validity array. Strings and binaries live in a byte heap with a
start and length per slot (`_BytesColumn`; fixed_size_binary too, as binary). Fixed-size lists
of fixed-width elements live in 2-D numpy arrays (`_FixedListColumn`). Maps, list_views and columns
holding unions keep the Arrow arrays written and a position per slot (`_ArrowColumn`); null columns
store nothing. Other types (lists, structs, decimals, ...) live in numpy object arrays filled
through Arrow's Python conversion.
Reads (`gather`) build one Arrow array per column from the requested slots with one numpy take
and one Arrow conversion. Capacity grows by doubling, so writes are amortised O(rows written).
A store that only appends (`ensure_appending`) doubles ahead of need: once three quarters full, the
slots in use are copied into the next arrays on a thread of their own (numpy copies without the
interpreter lock), and the cycle that swaps them in copies only what was appended meanwhile,
instead of the whole store (4M rows of three 8-byte columns: tens of milliseconds in one cycle).

`equal_mask` compares two Arrow arrays row by row (nulls equal nulls, NaN equals NaN), recursing
into lists and structs with whole-array operations. `hash_columns` gives every row of a set of
key columns a 64-bit hash computed from the Arrow buffers with numpy (strings and binaries by a
polynomial over their bytes), for the keyed tables' hash index.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.protocol.difference import _as_array, _validity, equal_mask
from tickwire.protocol.schema import empty_array, numpy_storage_dtype
from tickwire.server.engine.graph.keyindex import KeyIndex, Verifier, mix

__all__ = ["ColumnStore", "equal_mask", "hash_columns", "check_hashable", "key_verifier", "groups_of"]

#: where a write goes: an int64 array of slots, or a slice of contiguous slots
_Slots = Union[np.ndarray, slice]


def _is_c_convertible(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


class _Column:
    __slots__ = ("type", "dtype", "values", "valid", "storage_type", "_fill")

    def __init__(self, t: pa.DataType, capacity: int):
        self.type = t
        self.dtype = numpy_storage_dtype(t)
        if self.dtype is None:
            self.values = np.empty(capacity, dtype=object)
            self.storage_type = t
        else:
            self.values = np.zeros(capacity, dtype=self.dtype)
            self.storage_type = pa.bool_() if self.dtype == bool else pa.from_numpy_dtype(self.dtype)
            self._fill = pa.scalar(False if self.dtype == bool else 0, self.storage_type)
        self.valid = np.zeros(capacity, dtype=bool)

    def grow(self, capacity: int) -> None:
        for name in ("values", "valid"):
            old = getattr(self, name)
            new = np.empty(capacity, dtype=old.dtype) if old.dtype == object else np.zeros(capacity, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)

    def ahead_arrays(self) -> Optional[tuple[str, ...]]:
        """The slot-indexed arrays a growth ahead copies; None: this column cannot (objects)."""
        return None if self.dtype is None else ("values", "valid")

    def write(self, slots: _Slots, arr: pa.Array) -> None:
        """Writes `arr` at `slots` (an int64 array or a slice)."""
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
            arr = pc.fill_null(arr, self._fill)
        self.values[slots] = arr.to_numpy(zero_copy_only=False)

    def gather(self, slots: np.ndarray) -> pa.Array:
        valid = self.valid[slots]
        mask = None if valid.all() else ~valid
        if self.dtype is None:
            return pa.array(self.values[slots], type=self.type, mask=mask)
        out = pa.array(self.values[slots], type=self.storage_type, mask=mask)
        return out if self.storage_type == self.type else out.view(self.type)


class _FixedListColumn:
    """fixed_size_list columns of a fixed-width element type: a (capacity, list_size) numpy array of
    the elements' storage values, one of their validity, and one of the rows' validity. Writes and
    gathers are whole-array numpy operations (no per-row conversion)."""

    __slots__ = ("type", "size", "child_type", "dtype", "storage_type", "values", "child_valid", "valid", "_fill")

    def __init__(self, t: pa.DataType, capacity: int):
        self.type = t
        self.size = t.list_size
        self.child_type = t.value_type
        self.dtype = numpy_storage_dtype(self.child_type)
        self.storage_type = pa.bool_() if self.dtype == bool else pa.from_numpy_dtype(self.dtype)
        self._fill = pa.scalar(False if self.dtype == bool else 0, self.storage_type)
        self.values = np.zeros((capacity, self.size), dtype=self.dtype)
        self.child_valid = np.zeros((capacity, self.size), dtype=bool)
        self.valid = np.zeros(capacity, dtype=bool)

    @staticmethod
    def handles(t: pa.DataType) -> bool:
        return bool(pa.types.is_fixed_size_list(t)) and numpy_storage_dtype(t.value_type) is not None

    def ahead_arrays(self) -> Optional[tuple[str, ...]]:
        return ("values", "child_valid", "valid")

    def grow(self, capacity: int) -> None:
        for name in ("values", "child_valid", "valid"):
            old = getattr(self, name)
            new = np.zeros((capacity,) + old.shape[1:], dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def write(self, slots: _Slots, arr: pa.Array) -> None:
        n = len(arr)
        self.valid[slots] = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else True
        child = arr.values.slice(arr.offset * self.size, n * self.size)
        if child.null_count:
            self.child_valid[slots] = child.is_valid().to_numpy(zero_copy_only=False).reshape(n, self.size)
            child = pc.fill_null(child.view(self.storage_type) if child.type != self.storage_type else child,
                                 self._fill)
        else:
            self.child_valid[slots] = True
            if child.type != self.storage_type:
                child = child.view(self.storage_type)
        self.values[slots] = child.to_numpy(zero_copy_only=False).reshape(n, self.size)

    def gather(self, slots: np.ndarray) -> pa.Array:
        valid = self.valid[slots]
        n = valid.size
        child_valid = self.child_valid[slots].reshape(-1)
        child = pa.array(self.values[slots].reshape(-1), type=self.storage_type,
                         mask=None if child_valid.all() else ~child_valid)
        if self.storage_type != self.child_type:
            child = child.view(self.child_type)
        validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.Array.from_buffers(self.type, n, [validity], null_count=-1 if validity is not None else 0,
                                     children=[child])


class _ArrowColumn:
    """Maps, list_views and columns holding unions (top-level, or in lists, maps and unions, which
    Arrow's Python conversion cannot rebuild): the arrays written are kept as Arrow chunks and each slot holds the
    position of its row in their concatenation. A gather takes the requested rows chunk by chunk
    (one take each) and puts them in order with one more take. Rows replaced by later writes stay
    in their chunks until they outnumber the live ones or the chunks grow many; then the rows of
    every written slot are taken into one chunk (O(slots), amortised over the writes since)."""

    __slots__ = ("type", "chunks", "starts", "where", "dead")
    max_chunks = 32
    min_dead = 1 << 12  # replaced rows below which no compaction is done for their sake

    def __init__(self, t: pa.DataType, capacity: int):
        self.type = t
        self.chunks: list[pa.Array] = []
        self.starts = np.zeros(1, dtype=np.int64)  # where each chunk starts in the concatenation, then the end
        self.where = np.full(capacity, -1, dtype=np.int64)  # -1: never written
        self.dead = 0

    def ahead_arrays(self) -> Optional[tuple[str, ...]]:
        return None  # compactions renumber every written slot

    def grow(self, capacity: int) -> None:
        where = np.full(capacity, -1, dtype=np.int64)
        where[: self.where.size] = self.where
        self.where = where

    def write(self, slots: _Slots, arr: pa.Array) -> None:
        n = len(arr)
        total = int(self.starts[-1])
        self.dead += int(np.count_nonzero(self.where[slots] >= 0))
        self.where[slots] = np.arange(total, total + n, dtype=np.int64)
        self.chunks.append(arr)
        self.starts = np.append(self.starts, total + n)
        if len(self.chunks) > self.max_chunks or self.dead > max(self.min_dead, total + n - self.dead):
            self._compact()

    def _compact(self) -> None:
        written = np.flatnonzero(self.where >= 0)
        joined = self._take(self.where[written])
        self.chunks = [joined]
        self.starts = np.array([0, len(joined)], dtype=np.int64)
        self.where[written] = np.arange(written.size, dtype=np.int64)
        self.dead = 0

    def _take(self, idx: np.ndarray) -> pa.Array:
        if idx.size == 0 or not self.chunks:
            return empty_array(self.type)
        chunk = np.searchsorted(self.starts, idx, side="right") - 1
        order = np.argsort(chunk, kind="stable")
        parts = []
        for k in np.unique(chunk):
            rows = idx[order[chunk[order] == k]] - self.starts[k]
            parts.append(self.chunks[k].take(pa.array(rows, type=pa.int64())))
        out = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        inverse = np.empty(idx.size, dtype=np.int64)
        inverse[order] = np.arange(idx.size, dtype=np.int64)
        return out.take(pa.array(inverse, type=pa.int64()))

    def gather(self, slots: np.ndarray) -> pa.Array:
        idx = self.where[slots]
        if (idx < 0).any():
            raise ValueError(f"gathering {int(np.count_nonzero(idx < 0))} slot(s) never written "
                             f"from a {self.type} column")
        return self._take(idx)


class _NullColumn:
    """null-type columns: nothing stored."""

    __slots__ = ("type",)

    def __init__(self, t: pa.DataType, capacity: int):
        self.type = t

    def ahead_arrays(self) -> Optional[tuple[str, ...]]:
        return ()

    def grow(self, capacity: int) -> None:
        pass

    def write(self, slots: _Slots, arr: pa.Array) -> None:
        pass

    def gather(self, slots: np.ndarray) -> pa.Array:
        return pa.nulls(len(slots))


def _holds_union(t: pa.DataType) -> bool:
    return bool(pa.types.is_union(t)) or any(_holds_union(t.field(i).type) for i in range(t.num_fields))


def _column_class(t: pa.DataType) -> type:
    if _is_c_convertible(t):
        return _BytesColumn
    if _FixedListColumn.handles(t):
        return _FixedListColumn
    if _holds_union(t) or pa.types.is_map(t) or pa.types.is_list_view(t):
        return _ArrowColumn
    if pa.types.is_null(t):
        return _NullColumn
    return _Column


class _BytesColumn:
    """Strings and binaries: each slot's bytes live in one growing byte heap (start, length per
    slot). Appends copy the input's data buffer once; gathers copy the bytes of the requested
    slots with one numpy take and build the Arrow array from buffers. Overwritten bytes are
    garbage until the heap is compacted, which happens when garbage exceeds the live bytes and
    costs O(heap), amortised over at least as many bytes written."""

    __slots__ = ("type", "fixed", "large", "start", "length", "valid", "heap", "used", "garbage", "compactions",
                 "heap_ahead")
    # bytes of garbage below which the heap is never compacted: small, so that a small column
    # that churns (a ring's or a keyed table's symbols) holds a few times its live bytes, not the
    # megabytes a larger floor let its garbage reach over hours; a compaction copies the live
    # bytes only, at least as many as written since the last one
    min_garbage = 1 << 16

    def __init__(self, t: pa.DataType, capacity: int):
        # fixed_size_binary is kept as binary (the same bytes) and cast back when read
        self.fixed = t if pa.types.is_fixed_size_binary(t) else None
        if self.fixed is not None:
            t = pa.binary()
        self.type = t
        self.large = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        self.start = np.zeros(capacity, dtype=np.int64)
        self.length = np.zeros(capacity, dtype=np.int64)
        self.valid = np.zeros(capacity, dtype=bool)
        self.heap = np.zeros(1 << 16, dtype=np.uint8)
        self.used = 0
        self.garbage = 0
        self.compactions = 0  # a compaction moves every slot's start: a growth ahead under way is void
        self.heap_ahead: Optional[_Ahead] = None  # the heap's doubling under way (ColumnStore.ensure_appending)

    def ahead_arrays(self) -> Optional[tuple[str, ...]]:
        return ("start", "length", "valid")

    def grow(self, capacity: int) -> None:
        for name in ("start", "length", "valid"):
            old = getattr(self, name)
            new = np.zeros(capacity, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)

    def take_heap_ahead(self) -> None:
        """Swaps in the heap's prepared doubling (waiting for its copy), with the bytes appended
        since; drops it if a compaction or a plain doubling overtook it."""
        job, self.heap_ahead = self.heap_ahead, None
        if job is not None:
            job.swap_in(self.used)

    def _reserve(self, nbytes: int) -> None:
        need = self.used + nbytes
        if need <= self.heap.size:
            return
        self.take_heap_ahead()
        if need <= self.heap.size:
            return
        size = self.heap.size
        while size < need:
            size *= 2
        heap = np.zeros(size, dtype=np.uint8)
        heap[: self.used] = self.heap[: self.used]
        self.heap = heap

    def write(self, slots: _Slots, arr: pa.Array) -> None:
        if self.fixed is not None:
            arr = arr.cast(pa.binary())
        n = len(arr)
        bufs = arr.buffers()
        off = np.frombuffer(bufs[1], dtype=np.int64 if self.large else np.int32, count=n + 1,
                            offset=arr.offset * (8 if self.large else 4)).astype(np.int64)
        first, total = int(off[0]), int(off[-1] - off[0])
        self.garbage += int(self.length[slots].sum())
        if self.garbage > max(self.used // 2, self.min_garbage):
            self._compact()
        self._reserve(total)
        if total:
            self.heap[self.used:self.used + total] = np.frombuffer(bufs[2], dtype=np.uint8, count=total, offset=first)
        self.start[slots] = self.used + off[:-1] - first
        self.length[slots] = np.diff(off)
        self.used += total
        self.valid[slots] = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else True

    def _bytes(self, start: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return offsets, np.zeros(0, dtype=np.uint8)
        idx = np.repeat(start - offsets[:-1], lengths)
        idx += np.arange(total, dtype=np.int64)
        return offsets, self.heap[idx]

    def _compact(self) -> None:
        used = np.flatnonzero(self.length)
        offsets, data = self._bytes(self.start[used], self.length[used])
        heap = np.zeros(max(1 << 16, 2 * data.size), dtype=np.uint8)
        heap[: data.size] = data
        self.heap, self.used, self.garbage = heap, int(data.size), 0
        self.start[used] = offsets[:-1]
        self.compactions += 1

    def gather(self, slots: np.ndarray) -> pa.Array:
        valid = self.valid[slots]
        lengths = np.where(valid, self.length[slots], 0)
        offsets, data = self._bytes(self.start[slots], lengths)
        n = lengths.size
        if not self.large:
            if offsets[-1] > np.iinfo(np.int32).max:
                raise ValueError(f"gathering {int(offsets[-1])} bytes into one {self.type} array; use a large type")
            offsets = offsets.astype(np.int32)
        validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        out = pa.Array.from_buffers(self.type, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                    null_count=-1 if validity is not None else 0)
        return out if self.fixed is None else out.cast(self.fixed)


class _Ahead:
    """A doubling under way on its own thread: the slots below `kept` of each array, copied into
    arrays of `capacity` slots."""

    def __init__(self, capacity: int, kept: int, arrays: list[tuple[Any, str, np.ndarray]]):
        self.capacity, self.kept, self.arrays = capacity, kept, arrays
        self.compactions = [getattr(c, "compactions", 0) for c, _n, _a in arrays]
        self.copies: list[np.ndarray] = []
        self.thread = threading.Thread(target=self._run, name="tickwire-grow-ahead", daemon=True)

    def _run(self) -> None:
        copies = []
        for _c, _n, old in self.arrays:
            new = np.zeros((self.capacity,) + old.shape[1:], dtype=old.dtype)
            new[: self.kept] = old[: self.kept]
            copies.append(new)
        self.copies = copies

    def valid(self) -> bool:
        """Each array is still the one copied, unchanged below `kept`, and every copy was made."""
        return len(self.copies) == len(self.arrays) and all(
            getattr(c, name) is old and getattr(c, "compactions", 0) == k
            for (c, name, old), k in zip(self.arrays, self.compactions))

    def swap_in(self, end: int) -> bool:
        """Waits for the copy, then, if still valid, puts the copies in place of the arrays with
        what was appended since, below `end`; False if a plain doubling or a compaction overtook it
        (an array replaced since is not the one copied, so a valid copy is always the larger)."""
        self.thread.join()
        if not self.valid():
            return False
        for (c, name, old), new in zip(self.arrays, self.copies):
            new[self.kept: end] = old[self.kept: end]
            setattr(c, name, new)
        return True


class ColumnStore:
    """The columns of one table, addressed by integer slots; bulk writes and gathers."""

    #: capacity from which an appending store doubles ahead of need (below, a doubling is cheap)
    ahead_from = 1 << 16

    def __init__(self, schema: pa.Schema, capacity: int = 1024):
        self.schema = schema
        self.capacity = max(16, int(capacity))
        self.columns = [_column_class(f.type)(f.type, self.capacity) for f in schema]
        self.index = {name: i for i, name in enumerate(schema.names)}
        self._ahead: Optional[_Ahead] = None

    def ensure_appending(self, capacity: int, used: int) -> None:
        """`ensure(capacity)` for a store whose slots below `used` never change again (an
        append-only table's): the doubling is prepared ahead of need (see the module's text), and
        so is each byte column's heap's (its bytes below its `used` never change either). A
        doubling prepared and finished is swapped in at the next call, so that the old arrays go;
        one that a plain doubling or a compaction overtook is dropped."""
        job = self._ahead
        if job is not None and (capacity > self.capacity or not job.thread.is_alive()):
            self._ahead = None
            if job.swap_in(used):
                self.capacity = max(self.capacity, job.capacity)  # the same, but for a store of null columns
        self.ensure(capacity)
        if self._ahead is None and self.capacity >= self.ahead_from and 4 * capacity >= 3 * self.capacity:
            arrays: list[tuple[Any, str, np.ndarray]] = []
            for c in self.columns:
                names = c.ahead_arrays()
                if names is None:
                    return  # a column that cannot: plain doublings
                arrays.extend((c, name, getattr(c, name)) for name in names)
            self._ahead = _Ahead(2 * self.capacity, used, arrays)
            self._ahead.thread.start()
        for c in self.columns:
            if isinstance(c, _BytesColumn):
                if c.heap_ahead is not None and not c.heap_ahead.thread.is_alive():
                    c.take_heap_ahead()
                size = c.heap.size
                if c.heap_ahead is None and size >= self.ahead_from and 4 * c.used >= 3 * size:
                    c.heap_ahead = _Ahead(2 * size, c.used, [(c, "heap", c.heap)])
                    c.heap_ahead.thread.start()

    def ensure(self, capacity: int) -> None:
        """Makes room for slots below `capacity` (doubling)."""
        if capacity <= self.capacity:
            return
        new = self.capacity
        while new < capacity:
            new *= 2
        for c in self.columns:
            c.grow(new)
        self.capacity = new

    def write(self, slots: np.ndarray, table: pa.Table) -> None:
        """Writes every column of `table` (columns in schema order) at `slots`."""
        n = len(slots)
        if n == 0:
            return
        lo, hi = int(slots[0]), int(slots[-1])
        self.ensure(max(hi, int(slots.max()) if n > 1 else hi) + 1)
        # contiguous ascending slots (appends) are written through a slice view
        where = slice(lo, hi + 1) if hi - lo + 1 == n and (n == 1 or bool(np.all(np.diff(slots) == 1))) else slots
        for c, col in zip(self.columns, table.columns):
            c.write(where, col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The values at `slots` as a table (all columns, or `columns` in that order)."""
        names = list(columns) if columns is not None else self.schema.names
        arrays = [self.columns[self.index[n]].gather(slots) for n in names]
        return pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(n) for n in names]))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.columns[self.index[name]].gather(slots)


# ----------------------------------------------------------------------------------------------
# row-wise equality
# ----------------------------------------------------------------------------------------------

def key_verifier(store: "ColumnStore", names: Sequence[str], cols: Sequence[pa.Array]) -> Verifier:
    """A KeyIndex verifier: do the rows stored at `rows` (columns `names` of `store`) hold the key
    values of queries `qi` (rows of `cols`)? Compared in bulk, nulls equal nulls."""
    def verify(qi: np.ndarray, rows: np.ndarray) -> np.ndarray:
        stored = store.gather(rows, names)
        take = pa.array(qi, type=pa.int64())
        ok = np.ones(qi.size, dtype=bool)
        for j, col in enumerate(cols):
            ok &= equal_mask(stored.column(j), col.take(take))
        return ok
    return verify


def _group_hashes(cols: Sequence[pa.Array]) -> np.ndarray:
    """Hashes of group keys; booleans hash as int8 (hash_columns cannot read a boolean column
    with nulls)."""
    return hash_columns([c.cast(pa.int8()) if pa.types.is_boolean(c.type) else c for c in cols])


def groups_of(index: KeyIndex, store: "ColumnStore", keys: Sequence[str], values: pa.Table,
              make: Callable[[pa.Table], np.ndarray]) -> np.ndarray:
    """The group of each row of `values` (its columns `keys`), found in `index` (key hash -> group,
    the groups' key values in `store` under `keys`). Keys not seen before become groups, one per
    distinct key in the order of their first rows: `make(key_rows)` makes them (writing their key
    values to `store`) and returns their ids. Without key columns every row is in group 0 (which
    the caller made)."""
    if not keys or values.num_rows == 0:
        zeros: np.ndarray = np.zeros(values.num_rows, dtype=np.int64)
        return zeros
    cols = [values.column(k).combine_chunks() for k in keys]
    h = _group_hashes(cols)
    same = key_verifier(store, keys, cols)
    gids, _ = index.lookup(h, same)
    missing = np.flatnonzero(gids < 0)
    if missing.size:
        sub = values.select(list(keys)).take(pa.array(missing)).append_column(
            "__i", pa.array(np.arange(missing.size, dtype=np.int64)))
        firsts = np.sort(sub.group_by(list(keys), use_threads=False).aggregate([("__i", "min")])
                         .column("__i_min").to_numpy())
        rows = missing[firsts]
        new = make(values.select(list(keys)).take(pa.array(rows)))
        index.insert(h[rows], new)
        again, _ = index.lookup(h[missing], lambda qi, g: same(missing[qi], g))
        gids[missing] = again
    out: np.ndarray = gids
    return out


def forget_groups(index: KeyIndex, store: "ColumnStore", keys: Sequence[str], gids: np.ndarray) -> None:
    """Takes groups `gids` (their key values stored at their ids in `store`) out of `index`, so
    that their ids can be given to other keys; a key of theirs seen again becomes a new group."""
    if not keys or gids.size == 0:
        return
    stored = store.gather(gids, list(keys))
    cols = [stored.column(k).combine_chunks() for k in keys]
    h = _group_hashes(cols)
    found, where = index.lookup(h, lambda qi, g: g == gids[qi])
    if np.any(found != gids):
        raise RuntimeError("forget_groups: a group is not in its index")
    index.delete(where)


# ----------------------------------------------------------------------------------------------
# hashing of key columns
# ----------------------------------------------------------------------------------------------

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_BYTE_BASE = np.uint64(0x100000001B3)
_NULL_HASH = np.uint64(0x6A09E667F3BCC909)
_POWERS = np.ones(1, dtype=np.uint64)


def _powers(n: int) -> np.ndarray:
    global _POWERS
    if _POWERS.size < n:
        size = max(n, 2 * _POWERS.size)
        p = np.full(size, _BYTE_BASE, dtype=np.uint64)
        p[0] = 1
        _POWERS = np.cumprod(p, dtype=np.uint64)
    return _POWERS[:n]


def _bytes_hash(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Polynomial hash of each byte string data[offsets[i]:offsets[i+1]]."""
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    total = int(lengths.sum())
    out: np.ndarray = lengths.astype(np.uint64) * _GOLD
    if total == 0:
        return out
    first = int(starts[0])
    seg = data[first:first + total].astype(np.uint64)
    rel = starts - first
    within = np.arange(total, dtype=np.int64) - np.repeat(rel, lengths)
    seg *= _powers(int(lengths.max()))[within]
    sums = np.add.reduceat(np.append(seg, np.uint64(0)), np.minimum(rel, total))
    sums[lengths == 0] = 0
    hashes: np.ndarray = out ^ sums
    return hashes


_HASHABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_temporal,
             pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary,
             pa.types.is_fixed_size_binary, pa.types.is_decimal)


def check_hashable(t: pa.DataType) -> bool:
    return any(f(t) for f in _HASHABLE)


def _column_hash(a: pa.Array) -> np.ndarray:
    t = a.type
    n = len(a)
    bufs = a.buffers()
    if pa.types.is_boolean(t):
        h = a.to_numpy(zero_copy_only=False).astype(np.uint64) + np.uint64(1)
    elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        off = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32, count=n + 1,
                            offset=a.offset * (8 if wide else 4)).astype(np.int64)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        h = _bytes_hash(off, data)
    elif pa.types.is_fixed_size_binary(t) or t.bit_width not in (8, 16, 32, 64):
        w = t.bit_width // 8
        off = (np.arange(n + 1, dtype=np.int64) + a.offset) * w
        h = _bytes_hash(off, np.frombuffer(bufs[1], dtype=np.uint8))
    elif pa.types.is_floating(t):
        v = np.frombuffer(bufs[1], dtype=t.to_pandas_dtype(), count=n, offset=a.offset * t.bit_width // 8)
        v = np.where(np.isnan(v), np.nan, v + 0.0).astype(np.float64)  # one NaN, and -0.0 == 0.0
        h = v.view(np.uint64).copy()
    else:
        w = t.bit_width // 8
        h = np.frombuffer(bufs[1], dtype=np.dtype(f"<u{w}"), count=n, offset=a.offset * w).astype(np.uint64)
    h = mix(h ^ _GOLD)
    if a.null_count:
        h[~_validity(a)] = _NULL_HASH
    return h


def hash_columns(columns: Sequence[pa.Array]) -> np.ndarray:
    """A 64-bit hash per row of the given key columns (equal keys give equal hashes)."""
    h: Optional[np.ndarray] = None
    for col in columns:
        ch = _column_hash(_as_array(col))
        h = ch if h is None else mix(h * _GOLD + ch)
    assert h is not None, "hash_columns needs at least one key column"
    return h
