"""ungroup: list columns expanded to one row per element, the other columns repeated, incremental.

Deephaven's rules (`ungroup(nullFill, columns)`): with no columns named, every list column is
ungrouped; a null list counts as empty; a row whose lists are empty gives no rows. Without
`null_fill` the lists of one row must have the same length (else the table fails with Deephaven's
message "Array sizes differ at row key K (position P), A has size M, B has size N", comparing with
the first column); with `null_fill` the row gives as many rows as its longest list and the shorter
ones are padded with nulls. An ungrouped column has its lists' element type; the other columns
(list columns not named included) keep theirs.

Row keys: element j of the parent row with key p has the key ``((p - off) << base) | j``, as in
Deephaven (whose `off` is always 0): `base` starts at Deephaven's minimum, 10 bits (1024 elements
per row), or the bits of the longest list, and `off` is 0 unless the parent's row keys are too large
for it (a sorted parent's keys lie around 2**62): then it is a little below the smallest parent row
key. Rows follow the parent's shifts (one shift range per parent shift range). When a list outgrows
2**base elements, or a parent row key leaves the range the offset allows, every row is re-keyed in
that cycle: base grows (at least doubling the room) or the offset moves, and every surviving row is
reported as a shift to its new keys (one range per parent row), never as a remove and add. A parent
key range too wide for any offset is refused as Deephaven refuses it (flatten the parent first).

Values are never copied: a row's values are read from the parent's row (the list's element j for
the ungrouped columns). A cycle looks only at the parent rows the update names (and, when the rows
are re-keyed, at every row once).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.errors import OperationError, UnknownColumnError
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error, shifted_rows
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["UngroupTable", "is_list_type"]

MIN_BASE = 10  # Deephaven's minimum ungroup base: 1024 elements per row before re-keying
_KEY_BITS = 63


def is_list_type(t: pa.DataType) -> bool:
    """Whether a column of type `t` can be ungrouped (Deephaven's arrays and vectors arrive as lists)."""
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _required_bits(size: int) -> int:
    return max(1, (int(size) - 1).bit_length()) if size > 0 else 1


def _blocks(starts: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """starts[i] + j for j in [lo[i], hi[i]), concatenated (ascending when the blocks are)."""
    counts = np.maximum(hi - lo, 0)
    total = int(counts.sum())
    if total == 0:
        return _EMPTY
    owner = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    keys: np.ndarray = starts[owner] + lo[owner] + (np.arange(total, dtype=np.int64) - first[owner])
    return keys


def _elements(lists: pa.Array, rows: np.ndarray, j: np.ndarray, out_type: pa.DataType) -> pa.Array:
    """Element j[i] of list lists[rows[i]] (null past its end or for a null list)."""
    n = rows.size
    if n == 0:
        return pa.array([], out_type)
    if pa.types.is_fixed_size_list(lists.type):
        lists = lists.cast(pa.list_(lists.type.value_type))
    lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = lists.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = lists.values
    ok = j < lengths[rows]
    pos = offsets[rows] + j
    if not ok.any() or len(values) == 0:
        return pa.nulls(n, out_type)
    out = values.take(pa.array(np.where(ok, pos, 0), pa.int64()))
    if not ok.all():
        out = pc.if_else(pa.array(ok), out, pa.nulls(n, out_type))
    return out.cast(out_type) if out.type != out_type else out


class _UngroupedStore:
    """What an ungroup table reads: its slots are its own row keys, decoded to (parent row, element)."""

    def __init__(self, table: "UngroupTable"):
        self.table = table

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        return self.table.values_at(np.asarray(slots, dtype=np.int64), columns, prev=False)

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class UngroupTable(_Op):
    """The parent's rows with the lists of `columns` expanded, one row per element (see the module
    docstring)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, columns: Sequence[str] = (),
                 null_fill: bool = False):
        ps = parent.schema
        cols = [columns] if isinstance(columns, str) else list(dict.fromkeys(columns))
        unknown = [c for c in cols if c not in ps.names]
        if unknown:
            raise UnknownColumnError(f"table {name!r}: ungroup: unknown column names {unknown}, available column "
                                     f"names are {ps.names}")
        for c in cols:
            if not is_list_type(ps.field(c).type):
                raise OperationError(f"table {name!r}: ungroup: column {c} is not an array or Vector "
                                     f"(its type is {ps.field(c).type})")
        if not cols:
            cols = [f.name for f in ps if is_list_type(f.type)]
            if not cols:
                raise OperationError(f"table {name!r}: ungroup: the table has no array columns")
        self.columns = cols
        self.null_fill = bool(null_fill)
        self._ucols = frozenset(cols)
        fields = [pa.field(f.name, f.type.value_type) if f.name in self._ucols else f for f in ps]
        self._sizes = KeyMap()  # parent row key -> its number of rows here (rows with none absent)
        self.base = MIN_BASE
        self.off = 0
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, pa.schema(fields))
            self.store = _UngroupedStore(self)
            self.attributes = {k: v for k, v in parent.attributes.items() if k == "BlinkTable"}
            pkeys = parent.rowset.keys()
            sizes = self._sizes_of(pkeys)
            has = sizes > 0
            if has.any():
                self.base, self.off = self._layout(int(sizes.max()), int(pkeys[has][0]), int(pkeys[has][-1]),
                                                   MIN_BASE)
            self._sizes.set(pkeys[has], sizes[has])
            self._commit(_EMPTY, _blocks(self._key(pkeys[has]), np.zeros(int(has.sum()), np.int64), sizes[has]))
            self._rs = None

    # -- keys -----------------------------------------------------------------------------------
    def _key(self, pkeys: np.ndarray, base: Optional[int] = None, off: Optional[int] = None) -> np.ndarray:
        """The row key of element 0 of each parent row."""
        b = self.base if base is None else base
        o = self.off if off is None else off
        keys: np.ndarray = (np.asarray(pkeys, dtype=np.int64) - o) << b
        return keys

    def _fits(self, pkeys: np.ndarray, base: int, off: int) -> bool:
        if pkeys.size == 0:
            return True
        return int(pkeys.min()) >= off and int(pkeys.max()) <= off + (1 << (_KEY_BITS - base)) - 1

    def _layout(self, max_size: int, lo: int, hi: int, base: int) -> tuple[int, int]:
        """(base, offset) for lists of up to `max_size` elements and parent keys in [lo, hi]."""
        base = max(base, _required_bits(max_size))
        if base >= _KEY_BITS - 1:
            raise OperationError(f"table {self.name!r}: ungroup: a list of {max_size} elements is too long")
        room = 1 << (_KEY_BITS - base)   # parent keys a layout can hold
        if hi < room:
            return base, 0
        span = hi - lo + 1
        for off in (max(0, lo - span), lo):
            if hi - off < room:
                return base, off
        raise OperationError(f"table {self.name!r}: ungroup: key overflow, the parent's row keys ({lo} to {hi}) are "
                             f"too far apart for lists of {max_size} elements; flatten the parent first")

    # -- reading --------------------------------------------------------------------------------
    def values_at(self, okeys: np.ndarray, columns: Optional[Sequence[str]], prev: bool = False) -> pa.Table:
        """The values (or, `prev`, the previous values) of the rows at row keys `okeys`."""
        names = list(columns) if columns is not None else self.schema.names
        p = (okeys >> self.base) + self.off
        j = okeys & ((1 << self.base) - 1)
        parent = self.parent
        read = parent.prev_gather if prev else parent.gather
        got: dict[str, pa.Array] = {}
        rest = [c for c in names if c not in self._ucols]
        if rest:
            vals = read(rest, p)
            got.update({c: vals.column(c).combine_chunks() for c in rest})
        lists = [c for c in names if c in self._ucols]
        if lists:
            up, inv = np.unique(p, return_inverse=True)
            vals = read(lists, up)
            for c in lists:
                got[c] = _elements(vals.column(c).combine_chunks(), inv.ravel(), j, self.schema.field(c).type)
        return pa.Table.from_arrays([got[c] for c in names], schema=pa.schema([self.schema.field(c) for c in names]))

    def slots(self, keys: np.ndarray) -> np.ndarray:
        return np.asarray(keys, dtype=np.int64)

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        k = self._prev_keys(keys)
        return self.values_at(k, columns, prev=True)

    def _sizes_of(self, pkeys: np.ndarray) -> np.ndarray:
        """How many rows each parent row gives (Deephaven's rules, see the module docstring)."""
        if pkeys.size == 0:
            none: np.ndarray = _EMPTY.copy()
            return none
        vals = self.parent.gather(self.columns, pkeys)
        sizes: Optional[np.ndarray] = None
        for c in self.columns:
            n = pc.list_value_length(vals.column(c).combine_chunks()).fill_null(0).to_numpy(
                zero_copy_only=False).astype(np.int64)
            if sizes is None:
                sizes = n
            elif self.null_fill:
                sizes = np.maximum(sizes, n)
            elif np.any(n != sizes):
                i = int(np.flatnonzero(n != sizes)[0])
                pos = int(self.parent.rowset.find(pkeys[i:i + 1])[0])
                raise OperationError(f"Array sizes differ at row key {int(pkeys[i])} (position {pos}), "
                                     f"{self.columns[0]} has size {int(sizes[i])}, {c} has size {int(n[i])}")
        assert sizes is not None
        return sizes

    # -- the cycle ------------------------------------------------------------------------------
    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        parent, sizes = self.parent, self._sizes
        rem_p = up.removed.keys()
        rem_sz = np.maximum(sizes.get(rem_p), 0)
        old_s = new_s = _EMPTY
        if not up.shifted.is_empty():
            old_s, new_s = shifted_rows(parent, up)
        shift_sz = np.maximum(sizes.get(old_s), 0)
        add_p = up.added.keys()
        add_sz = self._sizes_of(add_p)
        mod_p = up.modified.keys()
        mod_pre = mod_p
        if mod_p.size and new_s.size:
            i = np.minimum(np.searchsorted(new_s, mod_p), new_s.size - 1)
            mod_pre = np.where(new_s[i] == mod_p, old_s[i], mod_p)
        mod_old = np.maximum(sizes.get(mod_pre), 0)
        mod_new = self._sizes_of(mod_p) if mod_p.size and self._ucols & up.modified_columns else mod_old
        # a re-keying when a list outgrows its room or a parent key leaves the offset's range
        grown = np.concatenate((add_sz, mod_new))
        cand = np.concatenate((add_p[add_sz > 0], mod_p[mod_new > 0], new_s[shift_sz > 0]))
        longest = int(grown.max()) if grown.size else 0
        rekey = longest > (1 << self.base) or not self._fits(cand, self.base, self.off)
        before = sizes.items() if rekey else None
        # the sizes follow
        sizes.delete(rem_p)
        if old_s.size:
            on = shift_sz > 0
            sizes.remap(old_s[on], new_s[on])
        sizes.delete(mod_p[mod_new == 0])
        sizes.set(mod_p[mod_new > 0], mod_new[mod_new > 0])
        sizes.set(add_p[add_sz > 0], add_sz[add_sz > 0])
        if before is not None:
            return self._rekey(up, before, rem_p, rem_sz, old_s, new_s, add_p, add_sz, mod_p, mod_pre, mod_new,
                               longest)
        k_rem = self._key(rem_p)
        removed = [_blocks(k_rem, np.zeros(rem_p.size, np.int64), rem_sz)]
        # modified rows: elements past the new length leave, those past the old one come
        k_mod_pre, k_mod = self._key(mod_pre), self._key(mod_p)
        removed.append(_blocks(k_mod_pre, mod_new, mod_old))
        added = [_blocks(k_mod, mod_old, mod_new), _blocks(self._key(add_p), np.zeros(add_p.size, np.int64), add_sz)]
        modified = _blocks(k_mod, np.zeros(mod_p.size, np.int64), np.minimum(mod_old, mod_new))
        # shifted rows: their elements move with them (what stays of a shrunk row)
        shifted = RowSetShiftData()
        moves = None
        if old_s.size:
            keep_n = shift_sz.copy()
            if mod_p.size:
                at = np.searchsorted(mod_p, new_s)
                hit = (at < mod_p.size) & (mod_p[np.minimum(at, mod_p.size - 1)] == new_s)
                keep_n[hit] = np.minimum(mod_old, mod_new)[at[hit]]
            mo = _blocks(self._key(old_s), np.zeros(old_s.size, np.int64), keep_n)
            mn = _blocks(self._key(new_s), np.zeros(new_s.size, np.int64), keep_n)
            if mo.size:
                moves = (mo, mn)
            shifted = self._mapped_shifts(up.shifted, old_s[shift_sz > 0])
        return self._emit(up, np.concatenate(removed), moves, np.concatenate(added), modified, shifted)

    def _mapped_shifts(self, sh: RowSetShiftData, rows: np.ndarray) -> RowSetShiftData:
        """The parent's shift ranges as ranges of this table's keys: each from the block of the
        first to that of the last of `rows` (the shifted parent rows with rows here, ascending) it
        moves."""
        b, off = self.base, self.off
        first = np.searchsorted(rows, sh.starts, side="left")
        last = np.searchsorted(rows, sh.ends, side="right") - 1
        use = last >= first
        if not use.any():
            return RowSetShiftData()
        lo, hi = rows[first[use]], rows[last[use]]
        return RowSetShiftData.build((lo - off) << b, ((hi - off) << b) + ((1 << b) - 1), sh.deltas[use] << b)

    def _rekey(self, up: TableUpdate, before: tuple[np.ndarray, np.ndarray], rem_p: np.ndarray, rem_sz: np.ndarray,
               old_s: np.ndarray, new_s: np.ndarray, add_p: np.ndarray, add_sz: np.ndarray, mod_p: np.ndarray,
               mod_pre: np.ndarray, mod_new: np.ndarray, longest: int) -> TableUpdate:
        """The cycle when every row takes a new key (see the module docstring): surviving rows
        shift to their new keys, one range per parent row. `before`: the parent rows that had
        rows here before the cycle, with their counts."""
        base0, off0 = self.base, self.off
        now_p, now_sz = self._sizes.items()
        lo, hi = (int(now_p[0]), int(now_p[-1])) if now_p.size else (0, 0)
        want = int(now_sz.max()) if now_sz.size else 0
        self.base, self.off = self._layout(want, lo, hi, base0 + 1 if longest > (1 << base0) else base0)
        # survivors: the rows that had rows here and were not removed, and the modified rows
        pre_p, pre_sz = before
        live = ~np.isin(pre_p, rem_p) if rem_p.size else np.ones(pre_p.size, dtype=bool)
        p0 = np.union1d(pre_p[live], mod_pre)
        s0 = np.zeros(p0.size, np.int64)
        s0[np.searchsorted(p0, pre_p[live])] = pre_sz[live]
        p1 = p0.copy()
        if old_s.size:
            i = np.minimum(np.searchsorted(old_s, p0), old_s.size - 1)
            hit = old_s[i] == p0
            p1[hit] = new_s[i[hit]]
        s1 = s0.copy()
        at = np.searchsorted(p1, mod_p)
        s1[at] = mod_new
        m = np.minimum(s0, s1)
        k0, k1 = self._key(p0, base0, off0), self._key(p1)
        zero = np.zeros(p0.size, np.int64)
        removed = [_blocks(self._key(rem_p, base0, off0), np.zeros(rem_p.size, np.int64), rem_sz),
                   _blocks(k0, s1, s0)]
        added = [_blocks(k1, s0, s1), _blocks(self._key(add_p), np.zeros(add_p.size, np.int64), add_sz)]
        modified = _blocks(k1[at], np.zeros(mod_p.size, np.int64), m[at])
        mv = (k1 != k0) & (m > 0)
        shifted = RowSetShiftData.build(k0[mv], k0[mv] + m[mv] - 1, k1[mv] - k0[mv])
        mo, mn = _blocks(k0[mv], zero[mv], m[mv]), _blocks(k1[mv], zero[mv], m[mv])
        return self._emit(up, np.concatenate(removed), (mo, mn) if mo.size else None, np.concatenate(added),
                          modified, shifted)

    def _emit(self, up: TableUpdate, removed: np.ndarray, moves: Optional[tuple[np.ndarray, np.ndarray]],
              added: np.ndarray, modified: np.ndarray, shifted: RowSetShiftData) -> TableUpdate:
        removed_rs, added_rs = RowSet.from_keys(np.sort(removed)), RowSet.from_keys(np.sort(added))
        self._moves = moves
        if moves is not None:
            self._commit(removed_rs, _EMPTY)
            self._commit(moves[0], moves[1])
            self._commit(_EMPTY, added_rs)
        else:
            self._commit(removed_rs, added_rs)
        cols = up.modified_columns & set(self.schema.names) if modified.size else set()
        return TableUpdate(added=added_rs, removed=removed_rs, modified=RowSet.from_keys(np.sort(modified)),
                           shifted=shifted, modified_columns=ModifiedColumnSet(cols))


register_operation("ungroup", lambda graph, name, parent, columns=(), null_fill=False:
                   UngroupTable(graph, name, parent, columns, null_fill))
