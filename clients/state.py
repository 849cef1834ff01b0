"""A subscriber's copy of a table, kept by applying Barrage updates (sans-I/O).

`TableState` holds the rows a subscription delivers: for a full subscription the whole table
with its row keys; for a viewport subscription the dense window `V` (BARRAGE-WIRE.md §9), in
which every row set of a message is an index into `V`. Each update is applied in the model's
order: remove, shift, add, modify. Everything is vectorized: row sets arrive as (n, 2) ranges
and are expanded with numpy; column values move with pyarrow `take`.
"""
from __future__ import annotations


import numpy as np
import pyarrow as pa

from tickwire.protocol.errors import ProtocolError
from tickwire.protocol.rowset import ranges_to_keys
from tickwire.protocol.update import BarrageUpdate

__all__ = ["TableState"]

_EMPTY = np.empty(0, dtype=np.int64)


def _keys(ranges) -> np.ndarray:
    if ranges is None:
        return _EMPTY
    r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    return ranges_to_keys(r) if r.size else _EMPTY


def _shift_keys(keys: np.ndarray, shifts) -> np.ndarray:
    """Post-shift keys of sorted pre-shift keys (shift_data = (starts, ends, dests))."""
    if shifts is None or keys.size == 0:
        return keys
    starts, ends, dests = (np.asarray(a, dtype=np.int64) for a in shifts)
    if starts.size == 0:
        return keys
    i = np.searchsorted(starts, keys, side="right") - 1
    inside = i >= 0
    inside[inside] = keys[inside] <= ends[i[inside]]
    out = keys.copy()
    out[inside] += (dests - starts)[i[inside]]
    return out


def _take(col: pa.Array, idx: np.ndarray) -> pa.Array:
    return col.take(pa.array(idx, type=pa.int64()))


class TableState:
    """Rows held by one subscriber. `keys` are row keys (full subscriptions) or None (viewport)."""

    def __init__(self, schema: pa.Schema, *, viewport: bool = False):
        self.schema = schema
        self.viewport = viewport
        self.keys: np.ndarray = _EMPTY.copy()
        self.columns: list[pa.Array] = [pa.array([], type=f.type) for f in schema]
        self.table_size = 0
        self.last_seq = 0
        self.updates = 0

    def __len__(self) -> int:
        return self.keys.size

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_arrays(self.columns, schema=self.schema)

    def values_at(self, rows) -> list[pa.Array]:
        """Current values of `rows` ((n, 2) ranges: keys for full, indices for viewport)."""
        r = _keys(rows)
        pos = r if self.viewport else self._positions(r, "rows")
        return [_take(c, pos) for c in self.columns]

    def append(self, values: list) -> None:
        """Appends rows after the last one (plain Arrow batches, DoGet snapshot pieces)."""
        n = max((len(v) for v in values if v is not None), default=0)
        if n == 0:
            return
        start = int(self.keys[-1]) + 1 if self.keys.size else 0
        self._insert_rows(np.arange(start, start + n, dtype=np.int64), values, by_position=False)
        self.table_size = self.keys.size

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
            self.keys = _shift_keys(self.keys, md.shift_data)
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
        self.table_size = md.table_size if self.viewport or md.table_size else self.keys.size
        self.last_seq = md.last_seq
        self.updates += 1

    def _reset(self) -> None:
        self.keys = _EMPTY.copy()
        self.columns = [pa.array([], type=f.type) for f in self.schema]

    def _positions(self, keys: np.ndarray, what: str) -> np.ndarray:
        pos = np.searchsorted(self.keys, keys)
        ok = pos < self.keys.size
        ok[ok] = self.keys[pos[ok]] == keys[ok]
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
        if removed[-1] >= self.keys.size:
            raise ProtocolError(f"removed_rows index {int(removed[-1])} past the {self.keys.size} rows held")
        self._drop(removed)

    def _drop(self, pos: np.ndarray) -> None:
        keep = np.ones(self.keys.size, dtype=bool)
        keep[pos] = False
        idx = np.flatnonzero(keep)
        self.keys = self.keys[idx]
        self.columns = [_take(c, idx) for c in self.columns]

    def _insert_rows(self, added: np.ndarray, values: list, *, by_position: bool) -> None:
        if added.size == 0:
            return
        n_old = self.keys.size
        n_new = n_old + added.size
        if by_position:
            # `added` are indices in the result: the kept rows fill the other slots, in order
            if added[-1] >= n_new:
                raise ProtocolError(f"added_rows index {int(added[-1])} past the {n_new} rows after the update")
            is_new = np.zeros(n_new, dtype=bool)
            is_new[added] = True
            new_keys = np.arange(n_new, dtype=np.int64)
        else:
            merged = np.concatenate([self.keys, added])
            order = np.argsort(merged, kind="stable")
            new_keys = merged[order]
            if new_keys.size > 1 and np.any(new_keys[1:] == new_keys[:-1]):
                raise ProtocolError("added_rows collide with rows still held")
            is_new = order >= n_old
        # source index into concat(old, added values) for each result slot
        src = np.empty(n_new, dtype=np.int64)
        src[~is_new] = np.arange(n_old)
        src[is_new] = n_old + np.arange(added.size)
        cols = []
        for c, old in enumerate(self.columns):
            v = values[c] if c < len(values) else None
            if v is None or len(v) == 0:
                v = pa.nulls(added.size, type=old.type)
            elif len(v) != added.size:
                raise ProtocolError(f"column {c}: {added.size} added rows but {len(v)} values")
            if v.type != old.type:
                v = v.cast(old.type)
            cols.append(_take(pa.concat_arrays([old, v]), src))
        self.columns = cols
        self.keys = new_keys

    def _modify(self, c: int, rows: np.ndarray, vals: pa.Array) -> None:
        pos = rows if self.viewport else self._positions(rows, "modified_rows")
        if self.viewport and rows.size and rows[-1] >= self.keys.size:
            raise ProtocolError(f"modified_rows index {int(rows[-1])} past the {self.keys.size} rows held")
        old = self.columns[c]
        if vals.type != old.type:
            vals = vals.cast(old.type)
        src = np.arange(len(old), dtype=np.int64)
        src[pos] = len(old) + np.arange(rows.size)
        self.columns[c] = _take(pa.concat_arrays([old, vals]), src)
