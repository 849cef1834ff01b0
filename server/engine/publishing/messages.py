"""Logical Barrage messages of a published table and their FlightData encodings.

A `Message` is one `BarrageUpdateMetadata` plus the values of its added and modified rows, taken
from the table at one step. Its FlightData are encoded lazily, outside the update graph's lock,
once per distinct set of serialization options, and shared by every subscriber that receives the
same message with the same options. Large add phases are encoded chunk by chunk so a big snapshot
streams without first building all of its bytes.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tickwire.protocol import barrage
from tickwire.protocol.flight import decode_flight_data, encode_flight_data
from tickwire.protocol.rowset import encode_rowset, encode_shifts
from tickwire.protocol.schema import to_deephaven_schema, to_wire_array
from tickwire.protocol.update import encode_schema, encode_update
from tickwire.server.engine.config import EncodeLimits
from tickwire.server.engine.graph import RowSet, RowSetShiftData, Table
from tickwire.server.engine.publishing.views import Viewport

__all__ = ["EncodeOptions", "Message", "TableWire", "EMPTY_ROWSET_BYTES", "EMPTY_SHIFT_BYTES"]

EMPTY_ROWSET_BYTES = encode_rowset(np.empty((0, 2), dtype=np.int64))
EMPTY_SHIFT_BYTES = encode_shifts(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))

# A large add phase is encoded in chunks (EncodeLimits.chunk_bytes): big enough to amortise
# per-batch costs, small enough that each FlightData is built and copied while it is still in the
# CPU cache, and that the first one leaves while the next is being encoded.
DEFAULT_LIMITS = EncodeLimits()

#: the serialization options of a request: a subscription's or a snapshot's, or None for the defaults
RequestOptions = Union[barrage.SubscriptionOptions, barrage.SnapshotOptions, None]


#: bytes per value of the fixed-width types met so far (0: not a whole number of bytes, or not
#: fixed width)
_WIDTHS: dict[pa.DataType, int] = {}


def array_nbytes(a: pa.Array) -> int:
    """The bytes of an array's buffers over its rows, as pyarrow's `nbytes` counts them for an
    array whose validity buffer is there only when it has nulls (as the graph's gathers make
    them). For a fixed-width type it is computed here from the length: pyarrow's walks the
    buffers at about 5 us an array, paid for every column of every message a cycle makes."""
    t = a.type
    width = _WIDTHS.get(t)
    if width is None:
        try:
            bits = t.bit_width
        except ValueError:   # not fixed width
            bits = 0
        width = _WIDTHS[t] = bits // 8 if bits % 8 == 0 and not pa.types.is_dictionary(t) else 0
    if width == 0:
        return int(a.nbytes)
    n = len(a)
    return n * width + ((n + 7) // 8 if a.null_count else 0)


@dataclass(frozen=True)
class EncodeOptions:
    use_deephaven_nulls: bool = False
    columns_as_list: bool = False
    batch_size: int = 0
    max_message_size: int = 0

    @classmethod
    def of(cls, options: RequestOptions) -> "EncodeOptions":
        """From SubscriptionOptions / SnapshotOptions (or None for defaults)."""
        if options is None:
            return cls()
        return cls(use_deephaven_nulls=bool(options.use_deephaven_nulls),
                   columns_as_list=bool(getattr(options, "columns_as_list", False)),
                   batch_size=max(0, int(options.batch_size)), max_message_size=max(0, int(options.max_message_size)))


class TableWire:
    """The wire form of a table's schema: Deephaven schema, per-column wire types and names."""

    def __init__(self, table: Table):
        self.table = table
        self.names = list(table.schema.names)
        self.schema = to_deephaven_schema(table.schema, table.attributes)
        self.types = [f.type for f in self.schema]  # served_types: wire types, or the kept upload types
        self._schema_payload: dict[bool, bytes] = {}

    def schema_payload(self, columns_as_list: bool) -> bytes:
        p = self._schema_payload.get(columns_as_list)
        if p is None:
            p = self._schema_payload[columns_as_list] = encode_schema(self.schema, columns_as_list=columns_as_list)
        return p

    def gather(self, keys: RowSet, columns: Sequence[int]) -> list[Optional[pa.Array]]:
        """Values of `keys` (in key order) for `columns`; None for every other column. Call under
        the graph's lock for a refreshing table."""
        out: list[Optional[pa.Array]] = [None] * len(self.names)
        if keys.is_empty() or not columns:
            return out
        t = self.table.gather([self.names[i] for i in columns], keys)
        for i, col in zip(columns, t.columns):
            if isinstance(col, pa.ChunkedArray):  # one chunk (a slice of a static table) is used as is
                col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            out[i] = col
        return out


class Message:
    """One logical message: wrapped metadata bytes and the data of its add and mod phases."""

    __slots__ = ("metadata", "types", "added", "modified", "n_added", "cells", "_cache", "_lock", "step", "_base",
                 "limits", "added_rows", "_nbytes", "rows")

    def __init__(self, metadata: bytes, types: Sequence[pa.DataType], added: Optional[list[Optional[pa.Array]]],
                 modified: Optional[list[Optional[pa.Array]]], step: int = 0,
                 limits: EncodeLimits = DEFAULT_LIMITS, added_rows: int = 0):
        self.metadata = metadata
        self.types = list(types)
        self.added = added
        self.modified = modified
        # a table without columns: the added rows' count, which only RecordBatch.length carries
        self.added_rows = added_rows if not self.types else 0
        self.n_added = max(max((len(a) for a in added or () if a is not None), default=0), self.added_rows)
        self.cells = sum(len(c) for c in (*(added or ()), *(modified or ())) if c is not None)  # values carried
        # the rows it carries, added and modified (a subscriber's count; once here, not per subscriber)
        self.rows = self.n_added + max((len(c) for c in modified or () if c is not None), default=0)
        self.step = step
        self._cache: dict[EncodeOptions, list[bytes]] = {}
        self._lock = threading.Lock()
        self._base: Optional[Message] = None
        self.limits = limits
        self._nbytes = -1

    @property
    def nbytes(self) -> int:
        """Its size before FlightData framing: its metadata and its columns' buffers. Computed
        once, though a message shared by many subscribers is counted for each of them."""
        if self._nbytes < 0:
            cols = (*(self.added or ()), *(self.modified or ()))
            self._nbytes = len(self.metadata) + sum(array_nbytes(c) for c in cols if c is not None)
        return self._nbytes

    def with_metadata(self, metadata: bytes, step: int) -> "Message":
        """The same rows under other metadata (the same snapshot at a later step of an unchanged
        table): its FlightData are this message's, but for the first, which carries the metadata."""
        m = Message(metadata, self.types, self.added, self.modified, step=step, limits=self.limits,
                    added_rows=self.added_rows)
        m._base = self
        return m

    def _wire(self, cols: Optional[list[Optional[pa.Array]]]) -> Optional[list[Optional[pa.Array]]]:
        if cols is None:
            return None
        return [None if c is None else to_wire_array(c, t) for c, t in zip(cols, self.types)]

    def cached(self, opts: EncodeOptions) -> Optional[list[bytes]]:
        """The payloads under `opts` if they are already encoded (no work, no lock), else None."""
        return self._cache.get(opts)

    def payloads(self, opts: EncodeOptions) -> Iterator[bytes]:
        """The FlightData payloads of this message under `opts` (cached for small messages)."""
        if self._base is not None:
            yield from self._rebased(opts)
            return
        if self.n_added > self.limits.chunk_rows:
            yield from self._chunked(opts)
            return
        with self._lock:
            out = self._cache.get(opts)
            if out is None:
                out = encode_update(self.metadata, self.types, self._wire(self.added), self._wire(self.modified),
                                    use_deephaven_nulls=opts.use_deephaven_nulls,
                                    columns_as_list=opts.columns_as_list, batch_size=self._batch_rows(opts),
                                    max_message_size=opts.max_message_size, added_rows=self.added_rows)
                self._cache[opts] = out
        yield from out

    def _rebased(self, opts: EncodeOptions) -> Iterator[bytes]:
        out = self._cache.get(opts)
        if out is None:
            assert self._base is not None  # payloads rebases only a message made by with_metadata
            base = self._base.payloads(opts)
            first = decode_flight_data(next(base))
            out = [encode_flight_data(first.data_header, self.metadata or None, body=first.data_body), *base]
            if self.n_added <= self.limits.chunk_rows:
                self._cache[opts] = out
        yield from out

    def _batch_rows(self, opts: EncodeOptions) -> int:
        """Rows per record batch for the cached encoding: at most about `shared_batch_bytes` per
        FlightData, so that a subscriber that stops reading holds one small piece of a shared
        message in its transport, not a copy of the whole message."""
        nbytes = self.nbytes - len(self.metadata)
        target = self.limits.shared_batch_bytes
        if nbytes <= target or self.cells == 0:
            return opts.batch_size
        ncols = sum(1 for c in (*(self.added or ()), *(self.modified or ())) if c is not None)
        rows = max(256, int(target * self.cells / max(1, ncols) / nbytes))
        return min(opts.batch_size, rows) if opts.batch_size > 0 else rows

    def _chunked(self, opts: EncodeOptions) -> Iterator[bytes]:
        kw: dict[str, Any] = {"use_deephaven_nulls": opts.use_deephaven_nulls, "columns_as_list": opts.columns_as_list,
                              "batch_size": opts.batch_size, "max_message_size": opts.max_message_size}
        md = self.metadata
        assert self.added is not None  # chunked only for many added rows
        rows = chunk_rows(self.added, self.n_added, self.limits)
        if opts.batch_size > 0:
            rows = min(rows, opts.batch_size)
        for start in range(0, self.n_added, rows):
            part = [None if c is None else to_wire_array(c.slice(start, rows), t)
                    for c, t in zip(self.added, self.types)]
            yield from encode_update(md, self.types, part, None, initial_batch_rows=rows,
                                     added_rows=min(rows, self.n_added - start) if self.added_rows else 0, **kw)
            md = b""
        if self.modified is not None and any(c is not None and len(c) for c in self.modified):
            yield from encode_update(b"", self.types, None, self._wire(self.modified), **kw)


def chunk_rows(columns: Sequence[Optional[pa.Array]], n: int, limits: EncodeLimits = DEFAULT_LIMITS) -> int:
    """Rows per chunk of about `limits.chunk_bytes` for these columns (at most `limits.chunk_rows`,
    at least 1024)."""
    nbytes: int = sum(array_nbytes(c) for c in columns if c is not None)
    per_row = max(1, nbytes // max(1, n))
    return max(1024, min(limits.chunk_rows, limits.chunk_bytes // per_row))


def rows_bytes(rows: Union[RowSet, Viewport, None]) -> Optional[bytes]:
    if rows is None:
        return None
    if rows.is_empty():
        return EMPTY_ROWSET_BYTES
    return encode_rowset(rows.ranges())


def metadata_bytes(*, first_seq: int, last_seq: int, is_snapshot: bool = False,
                   effective_viewport: Union[RowSet, Viewport, None] = None, effective_reverse_viewport: bool = False,
                   effective_column_set: Optional[npt.ArrayLike] = None,
                   added_rows: Optional[RowSet] = None, removed_rows: Optional[RowSet] = None,
                   shift_data: Optional[RowSetShiftData] = None, added_rows_included: Optional[RowSet] = None,
                   mod_column_nodes: Optional[Sequence[Optional[RowSet]]] = None, table_size: int = 0) -> bytes:
    """Wrapped BarrageUpdateMetadata bytes from row sets (`shift_data`: a RowSetShiftData, or None
    for absent). Row sets are encoded once each; an empty one is the one-byte `20`."""
    md = barrage.UpdateMetadata(first_seq=first_seq, last_seq=last_seq, is_snapshot=is_snapshot,
                                effective_reverse_viewport=effective_reverse_viewport, table_size=table_size,
                                effective_column_set=None if effective_column_set is None
                                else np.asarray(effective_column_set, dtype=np.int64))
    shifts = None
    if shift_data is not None:
        shifts = EMPTY_SHIFT_BYTES if shift_data.is_empty() else encode_shifts(*shift_data.to_wire())
    done: dict[int, Optional[bytes]] = {}  # the same RowSet object (e.g. every modified column's) encodes once

    def enc(rows: Union[RowSet, Viewport, None]) -> Optional[bytes]:
        if rows is None:
            return None
        b = done.get(id(rows))
        if b is None:
            b = done[id(rows)] = rows_bytes(rows)
        return b

    raw: dict[str, Any] = {"effective_viewport": enc(effective_viewport), "added_rows": enc(added_rows),
                           "removed_rows": enc(removed_rows), "shift_data": shifts,
                           "added_rows_included": enc(added_rows_included)}
    if mod_column_nodes is not None:
        raw["mod_column_nodes"] = [enc(m) if m is not None else EMPTY_ROWSET_BYTES for m in mod_column_nodes]
    payload = md.encode_with(**raw)
    return barrage.BarrageMessageWrapper(msg_type=int(barrage.BarrageMessageType.UPDATE_METADATA),
                                         payload=payload).to_bytes()
