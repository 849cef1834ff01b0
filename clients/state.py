"""A subscriber's copy of a table, kept by applying Barrage updates (sans-I/O).

`TableState` holds the rows a subscription delivers: for a full subscription the whole table
with its row keys; for a viewport subscription the dense window `V` (docs/viewports.md#viewport-subscriptions), in
which every row set of a message is an index into `V`. Each update is applied in the model's
order: remove, shift, add, modify. Everything is vectorized: row sets arrive as (n, 2) ranges
and are expanded with numpy. Columns are `clients.columns.Column`s: fixed-width values change in
place, so appends and modifications cost what they change; removals, inserts before the end and
changes to variable-width columns rebuild the column.

`NaturalTableState` is the state a client shows: it takes the messages of any response (DoGet,
snapshot request, subscription) and reads its columns as natural Arrow values.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.clients.columns import Column
from tickwire.errors import ProtocolError
from tickwire.protocol.rowset import ranges_to_keys
from tickwire.protocol.schema import from_wire_arrays
from tickwire.protocol.update import BarrageUpdate

__all__ = ["TableState", "NaturalTableState"]

_EMPTY = np.empty(0, dtype=np.int64)


def _keys(ranges) -> np.ndarray:
    if ranges is None:
        return _EMPTY
    r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    return ranges_to_keys(r) if r.size else _EMPTY


def _shift_keys_in_place(keys: np.ndarray, shifts) -> None:
    """Applies shift_data = (starts, ends, dests) to sorted keys: each range moves as a block, so
    only the keys inside the ranges are touched and the order is kept."""
    if shifts is None or keys.size == 0:
        return
    starts, ends, dests = (np.asarray(a, dtype=np.int64) for a in shifts)
    if starts.size == 0:
        return
    lo = np.searchsorted(keys, starts, side="left")
    hi = np.searchsorted(keys, ends, side="right")
    for a, b, d in zip(lo.tolist(), hi.tolist(), (dests - starts).tolist()):
        if b > a:
            keys[a:b] += d


class TableState:
    """Rows held by one subscriber. `keys` are row keys (full subscriptions) or positions (viewport)."""

    def __init__(self, schema: pa.Schema, *, viewport: bool = False):
        self.schema = schema
        self.viewport = viewport
        self._keys = np.empty(16, dtype=np.int64)
        self._n = 0
        self._cols: list[Column] = [Column(f.type) for f in schema]
        self.table_size = 0
        self.last_seq = 0
        self.updates = 0

    @property
    def keys(self) -> np.ndarray:
        return self._keys[:self._n]

    @keys.setter
    def keys(self, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.int64)
        self._keys = value.copy() if value.size else np.empty(16, dtype=np.int64)
        self._n = value.size

    @property
    def columns(self) -> list[pa.Array]:
        """The columns as Arrow arrays (they keep their values when the state changes later)."""
        return [c.arrow() for c in self._cols]

    def __len__(self) -> int:
        return self._n

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_arrays(self.columns, schema=self.schema)

    def values_at(self, rows) -> list[pa.Array]:
        """Current values of `rows` ((n, 2) ranges: keys for full, indices for viewport)."""
        r = _keys(rows)
        pos = r if self.viewport else self._positions(r, "rows")
        return [c.take(pos) for c in self._cols]

    def append(self, values: list) -> None:
        """Appends rows after the last one (plain Arrow batches, DoGet snapshot pieces)."""
        n = max((len(v) for v in values if v is not None), default=0)
        if n == 0:
            return
        start = int(self.keys[-1]) + 1 if self._n else 0
        self._insert_rows(np.arange(start, start + n, dtype=np.int64), values, by_position=False)
        self.table_size = self._n

    # -- applying ---------------------------------------------------------------------------------------
    def apply(self, update: BarrageUpdate) -> None:
        md = update.metadata
        if md is None:  # a plain Arrow batch: append
            self._insert_rows(np.arange(self.keys.size, self.keys.size + max(len(a) for a in update.added)),
                              update.added, by_position=True)
            return
        ncols = len(self.schema)
        removed = _keys(md.removed_rows)
        added = _keys(md.added_rows_included if md.added_rows_included is not None else md.added_rows)
        if self.viewport:
            self._remove_positions(removed)
            self._insert_rows(added, update.added, by_position=True)
        else:
            if md.is_snapshot and md.added_rows_included is not None and md.removed_rows is None:
                # a DoGet / snapshot-request response carries no removals: it is the whole content
                self._reset()
            self._remove_keys(removed)
            _shift_keys_in_place(self.keys, md.shift_data)
            self._insert_rows(added, update.added, by_position=False)
        nodes = md.mod_column_nodes or []
        for c in range(min(ncols, len(nodes))):
            rows = _keys(nodes[c])
            if rows.size == 0:
                continue
            vals = update.modified[c] if c < len(update.modified) else None
            if vals is None or len(vals) != rows.size:
                raise ProtocolError(f"column {c}: {rows.size} modified rows but "
                                    f"{0 if vals is None else len(vals)} values")
            self._modify(c, rows, vals)
        self.table_size = md.table_size if self.viewport or md.table_size else self._n
        self.last_seq = md.last_seq
        self.updates += 1

    def _reset(self) -> None:
        self.keys = _EMPTY
        self._cols = [Column(f.type) for f in self.schema]

    def _positions(self, keys: np.ndarray, what: str) -> np.ndarray:
        held = self.keys
        n = held.size
        if n and keys.size and int(held[-1]) - int(held[0]) == n - 1:
            # held keys without gaps (a table that only appended, or upserted new keys): a key's
            # position is its distance from the first, without searching 10M keys per lookup
            pos = keys - held[0]
            if pos[0] >= 0 and pos[-1] < n and (keys.size < 2 or bool(np.all(np.diff(keys) > 0))):
                return pos
        # searched (out of range or unsorted keys too: the checks below say which)
        pos = np.searchsorted(held, keys)
        ok = pos < held.size
        ok[ok] = held[pos[ok]] == keys[ok]
        if not ok.all():
            raise ProtocolError(f"{what}: rows {keys[~ok][:5].tolist()} are not held")
        return pos

    def _remove_keys(self, removed: np.ndarray) -> None:
        if removed.size == 0:
            return
        pos = self._positions(removed, "removed_rows")
        self._drop(pos)

    def _remove_positions(self, removed: np.ndarray) -> None:
        if removed.size == 0:
            return
        if removed[-1] >= self._n:
            raise ProtocolError(f"removed_rows index {int(removed[-1])} past the {self._n} rows held")
        self._drop(removed)

    def _drop(self, pos: np.ndarray) -> None:
        keep = np.ones(self._n, dtype=bool)
        keep[pos] = False
        idx = np.flatnonzero(keep)
        self.keys = self.keys[idx]
        for c in self._cols:
            c.keep(idx)

    def _insert_rows(self, added: np.ndarray, values: list, *, by_position: bool) -> None:
        m = added.size
        if m == 0:
            return
        n_old = self._n
        if by_position:
            # `added` are indices in the result: the kept rows fill the other slots, in order
            if added[-1] >= n_old + m:
                raise ProtocolError(f"added_rows index {int(added[-1])} past the {n_old + m} rows after the update")
            at = added - np.arange(m, dtype=np.int64)
            new_keys = np.arange(n_old + m, dtype=np.int64)
        else:
            held = self.keys
            if n_old == 0 or added[0] > held[-1]:  # appended after every held row: no search
                at = np.full(m, n_old, dtype=np.int64)
            else:
                at = np.searchsorted(held, added)
            inside = at < n_old
            if np.any(np.diff(added) <= 0) or (n_old and np.any(held[at[inside]] == added[inside])):
                raise ProtocolError("added_rows collide with rows still held")
            new_keys = None
        for c, col in enumerate(self._cols):
            v = values[c] if c < len(values) else None
            if v is None or len(v) == 0:
                v = pa.nulls(m, type=col.type)
            elif len(v) != m:
                raise ProtocolError(f"column {c}: {m} added rows but {len(v)} values")
            if v.type != col.type:
                v = v.cast(col.type)
            col.insert(at, v)
        if new_keys is not None:
            self.keys = new_keys
        elif at[0] >= n_old:  # appended after the last row: grow the key buffer in place
            if n_old + m > self._keys.size:
                grown = np.empty(max(n_old + m, 2 * self._keys.size), dtype=np.int64)
                grown[:n_old] = self._keys[:n_old]
                self._keys = grown
            self._keys[n_old:n_old + m] = added
            self._n = n_old + m
        else:
            self.keys = np.insert(self.keys, at, added)

    def _modify(self, c: int, rows: np.ndarray, vals: pa.Array) -> None:
        pos = rows if self.viewport else self._positions(rows, "modified_rows")
        if self.viewport and rows.size and rows[-1] >= self._n:
            raise ProtocolError(f"modified_rows index {int(rows[-1])} past the {self._n} rows held")
        col = self._cols[c]
        if vals.type != col.type:
            vals = vals.cast(col.type)
        col.set(pos, vals)


def _ranges(rows) -> np.ndarray:
    return np.empty((0, 2), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1, 2)


class NaturalTableState(TableState):
    """TableState plus the conversion of wire values to natural Arrow values: the state of one
    response stream as a client shows it. `wire_schema` is the stream's schema, `selected` the
    columns shown (None: all)."""

    def __init__(self, wire_schema: pa.Schema, viewport: bool, selected: Optional[Sequence[str]] = None):
        super().__init__(wire_schema, viewport=viewport)
        self.wire_schema = wire_schema
        self.selected = list(selected) if selected is not None else None

    def natural(self, arrays: list) -> list:
        """`arrays` (one per column, wire values) as natural Arrow values."""
        return from_wire_arrays(arrays, self.wire_schema)

    def apply_plain(self, u: BarrageUpdate) -> None:
        """Applies a message of any stream: subscription updates go to `apply`; the pieces of a
        DoGet or snapshot-request response (snapshot metadata without removed rows) insert their
        rows by row key (`added_rows_included`: a static table comes in several pieces, and the
        pieces of a reverse viewport come last rows first); plain Arrow batches append."""
        md = u.metadata
        if md is not None and not (md.is_snapshot and md.removed_rows is None):
            self.apply(u)
            return
        rows = None
        if md is not None:
            rows = md.added_rows_included if md.added_rows_included is not None else md.added_rows
        keys = ranges_to_keys(_ranges(rows)) if rows is not None else None
        n = max((len(a) for a in u.added), default=0)
        if keys is not None and keys.size == n and n:
            self._insert_rows(keys, u.added, by_position=False)
            self.table_size = len(self)
            assert md is not None  # the keys come from its rows
            self.last_seq = md.last_seq
        else:
            self.append(u.added)

    def table(self, names: Optional[Sequence[str]] = None) -> pa.Table:
        """The rows held as a pa.Table of natural values (only `names`, in that order, when given)."""
        cols = from_wire_arrays(self.columns, self.wire_schema)
        t = pa.Table.from_arrays(cols, names=self.wire_schema.names)
        return t.select(list(names)) if names is not None else t
