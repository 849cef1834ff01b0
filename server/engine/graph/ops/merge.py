"""merge: tables of one schema one after the other, each source's rows in its own region of row keys
(the same columns by name, in the first table's order, as Deephaven merges them).

Source i's row key k is the merged table's row key `k - base_i + i * 2**bits`, where `bits` leaves
room for every source (62 bits shared among them: 61 for two sources, 60 for up to four, ...) and
`base_i` is 0 for a source whose keys start near 0, or half a region below its first row key for
one whose keys live high (a sort's keys sit around 2**62), so that the region has room on both
sides. A source's rows therefore never move because another source changed: each cycle's update is
the union of the sources' updates, each moved into its region, shifts included. Values are read
from the sources through those row keys (nothing is copied). A source whose row keys leave its
region fails the merge, naming it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError, SchemaMismatchError
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error, shifted_rows
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["MergeTable"]


class _MergeStore:
    def __init__(self, merge: "MergeTable"):
        self.merge = merge

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None, prev: bool = False) -> pa.Table:
        m = self.merge
        names = list(columns) if columns is not None else m.schema.names
        keys = np.asarray(slots, dtype=np.int64)
        schema = pa.schema([m.schema.field(n) for n in names])
        region = keys >> m.bits
        order = np.argsort(region, kind="stable")
        parts = []
        r_sorted = region[order]
        for i in np.unique(region).tolist():
            lo, hi = np.searchsorted(r_sorted, [i, i + 1])
            src = m.sources[i]
            local = keys[order[lo:hi]] - (i << m.bits) + m.base[i]
            read = src.prev_gather if prev else src.gather
            parts.append(read(names, local).cast(schema))
        if not parts:
            return pa.Table.from_arrays([pa.array([], f.type) for f in schema], schema=schema)
        out = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        if keys.size and not np.all(order[1:] >= order[:-1]):
            inverse = np.empty(keys.size, dtype=np.int64)
            inverse[order] = np.arange(keys.size, dtype=np.int64)
            out = out.take(pa.array(inverse, type=pa.int64()))
        return out

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class MergeTable(_Op):
    """The rows of `sources` (one schema: names and types), source after source."""

    def __init__(self, graph: "UpdateGraph", name: str, first: Table, sources: Sequence[Table]):
        sources = list(sources)
        if not sources or sources[0] is not first:
            sources = [first] + sources
        schema = first.schema
        for s in sources[1:]:  # as Deephaven: the same columns by name, in any order
            if sorted(s.schema.names) != sorted(schema.names) or any(
                    s.schema.field(f.name).type != f.type for f in schema):
                raise SchemaMismatchError(f"table {name!r}: merged tables must have the same columns: "
                                          f"{s.name!r} has {_describe(s.schema)}, {first.name!r} has "
                                          f"{_describe(schema)}")
        self.sources = sources
        self.bits = 62 - max(0, (len(sources) - 1).bit_length())
        self.base: list[int] = [-1] * len(sources)  # -1: not known until the source has rows
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, first, schema, others=sources[1:])
            self.store = self._store = _MergeStore(self)
            parts = [self._merged(i, s.rowset.keys()) for i, s in enumerate(sources)]
            keys = np.concatenate(parts) if parts else _EMPTY
            self._commit(_EMPTY, keys)
            self._rs = None

    def _merged(self, i: int, keys: np.ndarray) -> np.ndarray:
        """Source i's row keys as the merge's."""
        if keys.size == 0:
            return _EMPTY
        half = 1 << (self.bits - 1)
        if self.base[i] < 0:
            self.base[i] = max(0, int(keys.min()) - half)
        local = keys - self.base[i]
        if int(local.min()) < 0 or int(local.max()) >> self.bits:
            bad = int(keys[(local < 0) | (local >= (1 << self.bits))][0])
            raise OperationError(f"table {self.name!r}: row key {bad} of {self.sources[i].name!r} is outside its "
                                 f"region of the merge ({self.bits} bits from {self.base[i]})")
        return local + (i << self.bits)

    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        added, removed, modified = [], [], []
        starts, ends, deltas = [], [], []
        moved_old, moved_new = [], []
        cols: set[str] = set()
        for i, s in enumerate(self.sources):
            up = updates.get(s.name)
            if up is None:
                continue
            removed.append(self._merged(i, up.removed.keys()))
            if not up.modified.is_empty():
                modified.append(self._merged(i, up.modified.keys()))
                cols |= set(up.modified_columns)
            sh = up.shifted
            if not sh.is_empty():
                o, n = shifted_rows(s, up)
                if o.size:
                    moved_old.append(self._merged(i, o))
                    moved_new.append(self._merged(i, n))
                    # the ranges as the merge's: clipped to the region (they only ever hold its keys)
                    lo, hi = self.base[i], self.base[i] + (1 << self.bits) - 1
                    st, en = np.clip(sh.starts, lo, hi), np.clip(sh.ends, lo, hi)
                    keep = st <= en
                    starts.append(st[keep] - lo + (i << self.bits))
                    ends.append(en[keep] - lo + (i << self.bits))
                    deltas.append(sh.deltas[keep])
            added.append(self._merged(i, up.added.keys()))
        if not added and not removed and not modified and not starts:
            return None
        add, rem, mod = _cat(added), _cat(removed), _cat(modified)
        self._commit(rem, _EMPTY)
        if starts:
            o, n = _cat(moved_old), _cat(moved_new)
            self._commit(o, n)
            self._moves = (o, n)
        self._commit(_EMPTY, add)
        return TableUpdate(added=RowSet.from_keys(np.sort(add)), removed=RowSet.from_keys(np.sort(rem)),
                           modified=RowSet.from_keys(np.sort(mod)),
                           shifted=RowSetShiftData(_cat(starts), _cat(ends), _cat(deltas)) if starts
                           else RowSetShiftData(),
                           modified_columns=ModifiedColumnSet([c for c in self.schema.names if c in cols]
                                                              if mod.size else ()))

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        k = self._prev_keys(keys)
        return self._store.gather(k, column_names(self.schema, columns), prev=True)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else _EMPTY


def _describe(schema: pa.Schema) -> str:
    return "[" + ", ".join(f"{f.name} ({f.type})" for f in schema) + "]"


def _merge(graph: "UpdateGraph", name: str, first: Table, sources: Sequence[Table]) -> Table:
    return MergeTable(graph, name, first, sources)


register_operation("merge", _merge)
