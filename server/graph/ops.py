"""Derived tables: sort, where, view/select, head/tail and last_by, each incremental.

Every operation follows its parent's update of the cycle with work proportional to that update
(bulk numpy / pyarrow / roaring), and emits one `TableUpdate` that validates against its previous
and new row sets. Values are never copied: an operation reads its parent's storage through its own
row keys (`_slots`), except `select`, which stores the columns it computes.

Row keys:
- `where`, `view`, `select`, `head`, `tail` keep the parent's row keys (and pass its shifts on);
- `sort` has its own sparse key space (`OrderIndex`): keys follow the sort order with free keys
  between neighbours, so a row usually goes in without moving others; when it cannot, a window of
  neighbours is re-spread and the rows that move are reported as shifts. A modification of a sort
  column that keeps the row between its neighbours stays a modification; one that moves the row is
  a remove plus an add;
- `last_by` gives each group a row key when the group first appears (in the order of its first
  row) and keeps it while the group has rows; groups are never shifted.

The row set of an operation lives in a private roaring bitmap changed in place each cycle; the
immutable `rowset` is built from it only when read (and the previous one is kept or rebuilt from
the update on demand), so a cycle costs what the change costs even on very large tables.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
from pyroaring import BitMap64

from tickwire.server.graph.columns import ColumnStore, check_hashable, hash_columns, key_verifier
from tickwire.server.graph.graph import TableFailedError
from tickwire.server.graph.keyindex import KeyIndex
from tickwire.server.graph.keymap import KeyMap
from tickwire.server.graph.order import NONE_LO, OrderIndex, SortKeys
from tickwire.server.graph.rowset import RowSet, RowSetShiftData, _keys_to_bitmap
from tickwire.server.graph.tables import FilterTable, Table, _mask
from tickwire.server.graph.update import TableUpdate, column_names

if TYPE_CHECKING:
    from tickwire.server.graph.graph import UpdateGraph

__all__ = ["SortTable", "WhereTable", "ProjectTable", "HeadTailTable", "LastByTable", "unique_name",
           "expression_columns"]

log = logging.getLogger("tickwire.graph")

_EMPTY = np.zeros(0, dtype=np.int64)
# row-set changes of at most this many keys are queued, up to these totals, before they are folded
_QUEUE_KEYS = 1 << 14
_QUEUE_MAX_KEYS = 1 << 16
_QUEUE_MAX_CHANGES = 32
_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def _bitmap(keys: np.ndarray) -> BitMap64:
    k = np.asarray(keys, dtype=np.int64)
    return _keys_to_bitmap(k) if k.size else BitMap64()


def _bm_keys(bm: BitMap64) -> np.ndarray:
    return np.frombuffer(bm.to_array(), dtype=np.uint64).view(np.int64)


def _rs_bitmap(rs: RowSet, copy: bool = True) -> BitMap64:
    """A RowSet's keys as a bitmap: a private copy, or (copy=False) one only to be read."""
    if rs.is_empty():
        return BitMap64()
    bm = rs._bitmap()
    return bm.copy() if copy and not rs.is_single_range else bm


@contextmanager
def _unregistered_on_error(graph: "UpdateGraph", table: Table):
    """A derived table whose first computation raises leaves the graph: it is registered (by
    `Table.__init__`) before its rows are computed."""
    try:
        yield
    except BaseException:
        name = getattr(table, "name", None)
        if name is not None and graph.tables.get(name) is table:
            graph.remove_table(name)
        raise


def unique_name(graph: "UpdateGraph", base: str) -> str:
    """`base`, or `base#2`, `base#3`, ... : the first name no table of the graph has."""
    with graph.shared_lock():
        if base not in graph.tables:
            return base
        i = 2
        while f"{base}#{i}" in graph.tables:
            i += 1
        return f"{base}#{i}"


def expression_columns(expr: pc.Expression, schema: pa.Schema) -> list[str]:
    """The columns of `schema` an expression reads (found by binding it without each column)."""
    _evaluate(pa.table({f.name: pa.array([], f.type) for f in schema}), [expr], ["_"])  # binds or raises
    used = []
    for name in schema.names:
        rest = pa.table({f.name: pa.array([], f.type) for f in schema if f.name != name})
        try:
            _evaluate(rest, [expr], ["_"])
        except (pa.ArrowInvalid, pa.ArrowKeyError, KeyError):
            used.append(name)
    return used


def _evaluate(values: pa.Table, exprs: Sequence[pc.Expression], names: Sequence[str]) -> pa.Table:
    """Expressions evaluated on a table (one Acero projection, single-threaded)."""
    decl = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(values)),
        acero.Declaration("project", acero.ProjectNodeOptions(list(exprs), list(names))),
    ])
    out = decl.to_table(use_threads=False)
    if out.num_rows != values.num_rows:  # Acero drops nothing in a projection; keep the promise explicit
        raise RuntimeError(f"projection returned {out.num_rows} rows for {values.num_rows}")
    return out


def shifted_rows(table: Table, update: TableUpdate) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `table` that `update` shifted: (keys before, keys after), ascending.

    Operations of this module report their own; for other tables they are read from the
    previous row set, one range query per shift."""
    if update.shifted.is_empty():
        return _EMPTY, _EMPTY
    own = getattr(table, "_moves", None)
    if own is not None:
        return own
    prev = table.prev_rowset
    if prev is None:
        raise RuntimeError(f"table {table.name!r} shifted rows but has no previous row set")
    sh = update.shifted
    olds, news = [], []
    for s, e, d in zip(sh.starts.tolist(), sh.ends.tolist(), sh.deltas.tolist()):  # one query per shift
        part = prev.subset_by_key_range(s, e)
        if part.is_empty():
            continue
        k = part.keys()
        if not update.removed.is_empty():
            k = k[~update.removed.contains(k)]
        olds.append(k)
        news.append(k + d)
    if not olds:
        return _EMPTY, _EMPTY
    return np.concatenate(olds), np.concatenate(news)


def _shifts_from_moves(old: np.ndarray, new: np.ndarray, brk: Optional[np.ndarray] = None) -> RowSetShiftData:
    """Shift ranges for rows moving from `old` to `new` keys (ascending, order-preserving): one
    range per run of rows with equal delta; `brk[i]` starts a new run (a row that stays lies
    between rows i-1 and i)."""
    if old.size == 0:
        return RowSetShiftData()
    d = new - old
    start = np.ones(old.size, dtype=bool)
    start[1:] = d[1:] != d[:-1]
    if brk is not None:
        start |= brk
    first = np.flatnonzero(start)
    last = np.append(first[1:], old.size) - 1
    return RowSetShiftData.build(old[first], old[last], d[first])


def _restrict_shifts(shifted: RowSetShiftData, old: np.ndarray) -> RowSetShiftData:
    """The shift ranges that move at least one of the keys `old` (ascending)."""
    if shifted.is_empty() or old.size == 0:
        return RowSetShiftData()
    a = np.searchsorted(old, shifted.starts, side="left")
    b = np.searchsorted(old, shifted.ends, side="right")
    use = b > a
    if use.all():
        return shifted
    return RowSetShiftData(shifted.starts[use], shifted.ends[use], shifted.deltas[use])


def _first_keys(table: Table, n: int, front: bool) -> np.ndarray:
    """The first (or last) n row keys of a table."""
    fast = getattr(table, "_edge_keys", None)
    if fast is not None:
        return fast(n, front)
    rs = table.rowset
    size = len(rs)
    if front:
        return rs.subset_by_positions(0, n - 1).keys()
    return rs.subset_by_positions(size - n, size - 1).keys()


# ----------------------------------------------------------------------------------------------
# the common base
# ----------------------------------------------------------------------------------------------

class _Op(Table):
    """A derived table with one parent whose row set lives in a private bitmap (see the module
    docstring). Subclasses implement `_follow(step, update) -> Optional[TableUpdate]` and change
    `self._bm` in it; the base keeps `rowset`, `prev_rowset`, `_moves` and timings."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, schema: pa.Schema):
        self._fold_lock = threading.Lock()
        self._bm = BitMap64()
        self._rs: Optional[RowSet] = RowSet()
        self._prev_rs: Optional[RowSet] = None
        self._update: Optional[TableUpdate] = None
        self._moves: Optional[tuple[np.ndarray, np.ndarray]] = None
        self.parent = parent
        self.cycle_seconds: list[float] = []  # time spent following the parent, last 1000 cycles
        Table.__init__(self, graph, name, schema, parents=[parent])
        self.is_refreshing = parent.is_refreshing

    # -- the row set ----------------------------------------------------------------------------
    # Small row-set changes are not applied to the bitmap at once: `_commit` queues them, and they
    # are folded in together when the bitmap is next read or enough are queued. A change's keys
    # spread over a large key space touch one bitmap container each, so folding several cycles'
    # changes at once touches each container once instead of once a cycle.
    @property
    def _bm(self) -> BitMap64:
        if self._queued:
            self._fold()
        return self._bmap

    @_bm.setter
    def _bm(self, value: BitMap64) -> None:
        with self._fold_lock:
            self._bmap = value
            self._queued: list[tuple[np.ndarray, np.ndarray]] = []
            self._queued_keys = 0
            self._size = len(value)

    def _fold(self) -> None:
        """Applies the queued changes: each key ends as its last queued change left it."""
        with self._fold_lock:  # readers under the graph's shared lock may get here together
            queued = self._queued
            if not queued:
                return
            parts = [k for pair in queued for k in pair]  # gone, come, gone, come, ...
            keys = np.concatenate(parts)
            arrive = np.repeat(np.tile([False, True], len(queued)), [k.size for k in parts])
            # the last change of each key: unique on the reversed sequence keeps first occurrences
            ukeys, first = np.unique(keys[::-1], return_index=True)
            last_arrive = arrive[::-1][first]
            gone, come = ukeys[~last_arrive], ukeys[last_arrive]
            if gone.size:
                self._bmap.difference_update(_bitmap(gone))
            if come.size:
                self._bmap.update(_bitmap(come))
            self._queued = []
            self._queued_keys = 0

    @property
    def rowset(self) -> RowSet:
        if self._rs is None:
            self._rs = RowSet._from_bitmap(self._bm.copy())
        return self._rs

    @rowset.setter
    def rowset(self, value: RowSet) -> None:
        self._bm = _rs_bitmap(value)
        self._rs = value

    @property
    def prev_rowset(self) -> Optional[RowSet]:
        if self._update is None:
            return None
        if self._prev_rs is None:
            up = self._update
            self._prev_rs = up.shifted.unapply(self.rowset.minus(up.added)).union(up.removed)
        return self._prev_rs

    @prev_rowset.setter
    def prev_rowset(self, value: Optional[RowSet]) -> None:
        self._prev_rs = value

    @property
    def size(self) -> int:
        return self._size

    def _edge_keys(self, n: int, front: bool) -> np.ndarray:
        size = len(self._bm)
        n = min(int(n), size)
        if n <= 0:
            return _EMPTY.copy()
        part = self._bm[0:n] if front else self._bm[size - n:size]
        return _bm_keys(part)

    # -- the cycle ------------------------------------------------------------------------------
    def _on_parents(self, step, updates):
        up = updates.get(self.parent.name)
        if up is None:
            return None
        t0 = time.perf_counter()
        before = self._rs
        update = self._follow(step, up)
        if update is not None and update.is_empty():
            update = None
        if update is not None:
            self._prev_rs = before
            self._rs = None
            self._update = update
        self.cycle_seconds.append(time.perf_counter() - t0)
        if len(self.cycle_seconds) > 1000:
            del self.cycle_seconds[:-1000]
        return update

    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        raise NotImplementedError

    def _commit(self, gone, come) -> None:
        """Row set change: keys `gone` leave, then keys `come` arrive (arrays or RowSets). Both
        small: queued (see `_bm`); otherwise applied at once."""
        ng = len(gone) if isinstance(gone, RowSet) else gone.size
        nc = len(come) if isinstance(come, RowSet) else come.size
        if ng == 0 and nc == 0:
            return
        self._size += nc - ng
        if ng + nc <= _QUEUE_KEYS:
            # copies: the caller's arrays may change before the queue is folded
            g = gone.keys() if isinstance(gone, RowSet) else np.array(gone, dtype=np.int64)
            c = come.keys() if isinstance(come, RowSet) else np.array(come, dtype=np.int64)
            self._queued.append((g, c))
            self._queued_keys += ng + nc
            if self._queued_keys > _QUEUE_MAX_KEYS or len(self._queued) > _QUEUE_MAX_CHANGES:
                self._fold()
            return
        bm = self._bm  # folds what is queued first: the order of changes matters
        for keys, op in ((gone, bm.difference_update), (come, bm.update)):
            if isinstance(keys, RowSet):
                if not keys.is_empty():
                    op(_rs_bitmap(keys, copy=False))
            elif keys.size:
                op(_bitmap(keys))

    def _end_cycle(self) -> None:
        self._prev = None
        self._prev_rs = None
        self._update = None
        self._moves = None

    def prev_gather(self, columns=None, keys=None) -> pa.Table:
        """Previous values of this cycle's modified rows (read from the parent's)."""
        k = self._prev_keys(keys)
        if k.size == 0:
            return self.gather(columns, k)
        return self.parent.prev_gather(columns, self._parent_keys(k))

    def _prev_keys(self, keys) -> np.ndarray:
        if self._update is None:
            raise RuntimeError(f"table {self.name!r}: previous values exist only during a cycle that modified it")
        if keys is None:
            keys = self._update.modified
        k = keys.keys() if isinstance(keys, RowSet) else np.asarray(keys, dtype=np.int64).ravel()
        if k.size and not self._update.modified.contains(k).all():
            raise KeyError(f"table {self.name!r}: previous values exist only for rows modified this cycle")
        return k

    def _parent_keys(self, keys: np.ndarray) -> np.ndarray:
        return keys


# ----------------------------------------------------------------------------------------------
# sort
# ----------------------------------------------------------------------------------------------

class SortTable(_Op):
    """The parent's rows ordered by `columns` (each ascending or descending), ties in parent row
    key order; nulls sort first ascending (last descending) and NaN after every number. See the
    module docstring for the key space and shifts; `spacing` fixes the free keys per row (by
    default they follow the table's size, see `OrderIndex.spacing`)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, columns: Union[str, Sequence[str]],
                 descending: Union[bool, Sequence[bool]] = False, spacing: Optional[int] = None):
        cols = [columns] if isinstance(columns, str) else list(columns)
        if not cols:
            raise ValueError(f"table {name!r}: sort needs at least one column")
        column_names(parent.schema, cols)
        desc = [bool(descending)] * len(cols) if isinstance(descending, (bool, np.bool_)) else \
            [bool(d) for d in descending]
        if len(desc) != len(cols):
            raise ValueError(f"table {name!r}: {len(desc)} descending flags for {len(cols)} sort columns")
        self.sort_columns = cols
        self.descending = desc
        self.encoder = SortKeys(parent.schema, cols, desc)
        with graph.shared_lock(), _unregistered_on_error(graph, self):
            super().__init__(graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k == "BlinkTable"}
            pkeys = parent.rowset.keys()
            values = parent.gather(cols, pkeys)
            self.encoder.needs_more_words(values)
            self.index = OrderIndex(self.encoder.nwords, spacing)
            okeys = self.index.build(self.encoder.encode(values, pkeys))
            self._bm = _bitmap(okeys)
            self._rs = None

    def _parent_keys(self, keys: np.ndarray) -> np.ndarray:
        return self.index.id_at(keys)

    def _slots(self, keys):
        return self.parent._slots(self.index.id_at(np.asarray(keys, dtype=np.int64)))

    def _edge_keys(self, n, front):
        return self.index.first_keys(n) if front else self.index.last_keys(n)

    def _words(self, pkeys: np.ndarray) -> list[np.ndarray]:
        return self.encoder.encode(self.parent.gather(self.sort_columns, pkeys), pkeys)

    def _follow(self, step, up):
        idx, parent = self.index, self.parent
        sort_cols = set(self.sort_columns)
        # 1. rows the parent removed (pre-shift parent keys)
        rem_p = up.removed.keys()
        rem_o = idx.key_of(rem_p)
        if np.any(rem_o < 0):
            raise RuntimeError(f"table {self.name!r}: the parent removed rows this table does not have")
        idx.delete(rem_o)
        # 2. rows the parent shifted: new parent keys, same place in the order
        if not up.shifted.is_empty():
            old_p, new_p = shifted_rows(parent, up)
            if old_p.size:
                idx.set_last_word(idx.key_of(old_p), new_p)
        add_p = up.added.keys()
        mod_p = up.modified.keys()
        sort_mod = bool(mod_p.size) and bool(sort_cols & up.modified_columns)
        add_vals = parent.gather(self.sort_columns, add_p)
        mod_vals = parent.gather(self.sort_columns, mod_p) if sort_mod else None
        # 3. longer strings than the encoding holds: every row is re-encoded (their order does not
        # change); rows whose sort values were modified leave their place first
        grew = self.encoder.needs_more_words(add_vals)
        if mod_vals is not None:
            grew = self.encoder.needs_more_words(mod_vals) or grew
        # 4. modified rows: those whose sort values changed leave their place
        stay_p, move_p, move_o = mod_p, _EMPTY, _EMPTY
        if sort_mod:
            cur_o = idx.key_of(mod_p)
            if grew:
                changed = np.ones(mod_p.size, dtype=bool)
            else:
                have = idx.words_at(cur_o)
                changed = np.zeros(mod_p.size, dtype=bool)
                for a, b in zip(have, self.encoder.encode(mod_vals, mod_p)):
                    changed |= a != b
            stay_p, move_p, move_o = mod_p[~changed], mod_p[changed], cur_o[changed]
            idx.delete(move_o)
        if grew and len(idx):
            okeys = idx.keys()
            idx.reword(self.encoder.nwords, self._words(idx.id_at(okeys)), okeys)
        move_words = None
        if move_p.size:
            move_words = self.encoder.encode(mod_vals.filter(pa.array(changed)), move_p)
        # 5. new rows and moving rows go in; a moving row keeps its key when it is still between
        # the same neighbours
        add_words = self.encoder.encode(add_vals, add_p)
        if move_words is not None:
            ins_words = [np.concatenate((a, b)) for a, b in zip(add_words, move_words)]
            prefer = np.concatenate((np.full(add_p.size, -1, dtype=np.int64), move_o))
        else:
            ins_words, prefer = add_words, None
        new_o, mo, mn, brk, kept_all = idx.insert(ins_words, prefer)
        add_o = new_o[:add_p.size]
        moved_new_o = new_o[add_p.size:]
        kept = kept_all[add_p.size:]
        out_old, out_new = move_o[~kept], moved_new_o[~kept]
        stay_o = idx.key_of(np.concatenate((stay_p, move_p[kept])))
        removed = np.concatenate((rem_o, out_old))
        added = np.concatenate((add_o, out_new))
        shifted = _shifts_from_moves(mo, mn, brk)
        self._moves = (mo, mn) if mo.size else None
        added_rs, removed_rs = RowSet.from_keys(added), RowSet.from_keys(removed)
        if mo.size:
            self._commit(removed_rs, _EMPTY)
            self._commit(mo, mn)
            self._commit(_EMPTY, added_rs)
        else:
            self._commit(removed_rs, added_rs)
        modified = RowSet.from_keys(stay_o)
        return TableUpdate(added=added_rs, removed=removed_rs, modified=modified, shifted=shifted,
                           modified_columns=up.modified_columns if not modified.is_empty() else ())


# ----------------------------------------------------------------------------------------------
# where
# ----------------------------------------------------------------------------------------------

Predicate = Union[pc.Expression, Callable[[pa.Table], object]]


class WhereTable(_Op, FilterTable):
    """The parent's rows for which a predicate holds, under the parent's row keys and storage.

    The predicate is a pyarrow compute expression (``pc.field("x") > 3``; null counts as false)
    or a callable ``values -> boolean array`` (evaluated on `columns` of the rows when given).
    Each cycle evaluates it only on the parent's added rows and, when a column the predicate
    reads was modified, on the modified rows' new and previous values (the previous ones say
    whether the row was in, without a lookup in the row set)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, predicate: Predicate,
                 columns: Optional[Sequence[str]] = None):
        if isinstance(predicate, pc.Expression):
            used = expression_columns(predicate, parent.schema)
            if columns is None:
                columns = used or [parent.schema.names[0]]
        elif not callable(predicate):
            raise TypeError(f"table {name!r}: a filter is a pyarrow Expression or a callable, "
                            f"got {type(predicate).__name__}")
        self.predicate = predicate
        self.columns = column_names(parent.schema, columns) if columns is not None else None
        with graph.shared_lock(), _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k in ("AddOnly", "BlinkTable")}
            keys = parent.rowset.keys()
            self._bm = _bitmap(keys[self._passes(keys)]) if keys.size else BitMap64()
            self._rs = None

    def _slots(self, keys):
        return self.parent._slots(keys)

    def _passes(self, keys: np.ndarray, extra: Optional[pa.Table] = None) -> np.ndarray:
        """Whether the parent's rows `keys` (then the rows of `extra`, values of the same columns) pass."""
        if keys.size == 0 and extra is None:
            return np.zeros(0, dtype=bool)
        values = self.parent.gather(self.columns, keys)
        if extra is not None:
            values = pa.concat_tables([values, extra])
        n = values.num_rows
        if n == 0:
            return np.zeros(0, dtype=bool)
        if isinstance(self.predicate, pc.Expression):
            result = _evaluate(values, [self.predicate], ["_"]).column(0).combine_chunks()
        else:
            result = self.predicate(values)
        return _mask(result, n)

    def _prev_values(self, mkeys: np.ndarray) -> Optional[pa.Table]:
        """The previous values of the parent's modified rows, in the columns the filter reads (None
        when the parent keeps none)."""
        try:
            prev = self.parent.prev_gather(self.columns, mkeys)
        except (RuntimeError, KeyError):
            return None
        names = self.columns if self.columns is not None else self.parent.schema.names
        if prev.schema.names != list(names) or any(f.type != self.parent.schema.field(c).type
                                                   for f, c in zip(prev.schema, names)):
            return None
        return prev

    def _follow(self, step, up):
        # the row set is read only when the parent removed or shifted rows, or modified rows
        # without changing what the filter reads
        removed_bm = self._bm & _rs_bitmap(up.removed, copy=False) if not up.removed.is_empty() else BitMap64()
        if len(removed_bm):
            self._commit(_bm_keys(removed_bm), _EMPTY)
        shifted = RowSetShiftData()
        moved_old, moved_new = _EMPTY, _EMPTY
        if not up.shifted.is_empty():
            sh = up.shifted
            parts = []
            bm = self._bm
            for s, e, d in zip(sh.starts.tolist(), sh.ends.tolist(), sh.deltas.tolist()):  # per shift range
                rng = BitMap64()
                rng.add_range(s, e + 1)
                part = bm & rng
                if len(part):
                    parts.append((part, d))
            if parts:
                moved_old = np.concatenate([_bm_keys(p) for p, _ in parts])
                moved_new = np.concatenate([_bm_keys(p) + d for p, d in parts])
                self._commit(moved_old, moved_new)
                shifted = _restrict_shifts(sh, moved_old)
        self._moves = (moved_old, moved_new) if moved_old.size else None
        add_p = up.added.keys()
        modified, leaving = _EMPTY, _EMPTY
        if not up.modified.is_empty() and (self.columns is None or set(self.columns) & up.modified_columns):
            mkeys = up.modified.keys()
            # one evaluation for the added rows, the modified ones, and (when the parent has them)
            # the modified rows' previous values: a row was in this table exactly when they passed,
            # which spares a lookup in the row set (its cost grows with the key space the change
            # is spread over)
            prev = self._prev_values(mkeys)
            passes = self._passes(np.concatenate((add_p, mkeys)), extra=prev)
            entering = add_p[passes[:add_p.size]]
            mpass = passes[add_p.size:add_p.size + mkeys.size]
            if prev is not None:
                was = passes[add_p.size + mkeys.size:]
            else:
                inside = _bm_keys(self._bm & _rs_bitmap(up.modified, copy=False))
                was = np.isin(mkeys, inside, assume_unique=True)
            modified = mkeys[was & mpass]
            leaving = mkeys[was & ~mpass]
            entering = np.concatenate((entering, mkeys[~was & mpass]))
        else:
            entering = add_p[self._passes(add_p)]
            modified = (_bm_keys(self._bm & _rs_bitmap(up.modified, copy=False)) if not up.modified.is_empty()
                        else _EMPTY)
        removed = _bm_keys(removed_bm)
        if leaving.size:
            # back to pre-shift keys
            pre = leaving.copy()
            if moved_new.size:
                i = np.searchsorted(moved_new, leaving)
                hit = i < moved_new.size
                hit[hit] = moved_new[i[hit]] == leaving[hit]
                pre[hit] = moved_old[i[hit]]
                # rows that moved and then left are not moves of this table
                stay = ~np.isin(moved_new, leaving, assume_unique=True)
                moved_old, moved_new = moved_old[stay], moved_new[stay]
                self._moves = (moved_old, moved_new) if moved_old.size else None
                shifted = _restrict_shifts(shifted, moved_old)
            removed = np.concatenate((removed, pre))
        added = RowSet.from_keys(entering)
        self._commit(leaving, added)
        mod = RowSet.from_keys(modified)
        return TableUpdate(added=added, removed=RowSet.from_keys(removed), modified=mod,
                           shifted=shifted, modified_columns=up.modified_columns if not mod.is_empty() else ())


# ----------------------------------------------------------------------------------------------
# view / select
# ----------------------------------------------------------------------------------------------

ColumnSpec = Union[str, tuple]


class _ViewStore:
    """Storage of a view, addressed by the parent's storage slots: plain and renamed columns are
    the parent's, computed columns are evaluated on the parent's values at the same slots."""

    def __init__(self, table: "ProjectTable"):
        self.table = table
        self.schema = table.schema

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        t = self.table
        names = list(columns) if columns is not None else self.schema.names
        computed = [n for n in names if t.sources[n] is None]
        need = list(dict.fromkeys([t.sources[n] for n in names if t.sources[n] is not None]
                                  + sorted({c for n in computed for c in t.inputs[n]})))
        base = t.parent.store.gather(slots, need) if need else pa.table({"_": pa.nulls(len(slots))})
        if t.failure is not None:
            raise TableFailedError(t.failure)
        try:
            return t._assemble(names, base, base, slots.size)
        except Exception as exc:  # a formula that raises on these values fails the view
            raise TableFailedError(t.graph.fail(t, "computing its columns", exc)) from exc

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class _SelectStore:
    """Storage of a select, addressed by its own slots (one per row, found by row key): computed
    columns are stored, plain and renamed columns are read from the parent by row key."""

    def __init__(self, table: "ProjectTable"):
        self.table = table
        self.schema = table.schema

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        t = self.table
        names = list(columns) if columns is not None else self.schema.names
        plain = list(dict.fromkeys(t.sources[n] for n in names if t.sources[n] is not None))
        computed = [n for n in names if t.sources[n] is None]
        base = t.parent.gather(plain, t._key_of_slot[slots]) if plain else None
        stored = t.computed_store.gather(slots, computed) if computed else None
        return t._assemble(names, base, stored, slots.size)

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class ProjectTable(_Op):
    """Columns of the parent (kept, renamed) and columns computed from pyarrow compute
    expressions, under the parent's row keys. A `view` (materialize=False) computes on read; a
    `select` stores the computed columns, by its own row keys, and recomputes them for added
    rows and for modified rows whose inputs changed. A modification is reported only on the
    columns whose inputs the parent modified."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, columns, materialize: bool = False):
        specs = self._parse(columns, parent.schema)
        self.sources: dict[str, Optional[str]] = {}
        self.exprs: dict[str, pc.Expression] = {}
        self.inputs: dict[str, list[str]] = {}
        fields = []
        empty = pa.table({f.name: pa.array([], f.type) for f in parent.schema})
        for out, spec in specs:
            if out in self.sources:
                raise ValueError(f"table {name!r}: column {out!r} is given twice")
            if isinstance(spec, str):
                field = parent.schema.field(column_names(parent.schema, [spec])[0])
                self.sources[out] = spec
                self.inputs[out] = [spec]
                fields.append(pa.field(out, field.type, field.nullable, field.metadata))
            else:
                typ = _evaluate(empty, [spec], [out]).schema.field(0).type
                self.sources[out] = None
                self.exprs[out] = spec
                self.inputs[out] = expression_columns(spec, parent.schema)
                fields.append(pa.field(out, typ))
        schema = pa.schema(fields)
        self.materialize = bool(materialize) and bool(self.exprs)
        self.computed_store: Optional[ColumnStore] = None
        with graph.shared_lock(), _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, schema)
            self.attributes = {k: v for k, v in parent.attributes.items()
                               if k in ("AddOnly", "AppendOnly", "BlinkTable")}
            if self.materialize:
                self.computed_store = ColumnStore(pa.schema([schema.field(n) for n in self.exprs]))
                self._slot_of = KeyMap()
                self._key_of_slot = np.full(1024, -1, dtype=np.int64)
                self._free = _EMPTY.copy()
                self._next_slot = 0
                self.store = _SelectStore(self)
                self._store_rows(parent.rowset.keys())
            else:
                self.store = _ViewStore(self)

    @staticmethod
    def _parse(columns, schema: pa.Schema) -> list[tuple[str, Union[str, pc.Expression]]]:
        if isinstance(columns, dict):
            items = list(columns.items())
        else:
            if isinstance(columns, (str, tuple)):
                columns = [columns]
            items = []
            for c in columns:
                if isinstance(c, str):
                    items.append((c, c))
                elif isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str):
                    items.append(c)
                else:
                    raise TypeError(f"a column is a name or a (name, column name or Expression) pair, got {c!r}")
        for out, spec in items:
            if not isinstance(spec, (str, pc.Expression)):
                raise TypeError(f"column {out!r}: expected a column name or a pyarrow Expression, "
                                f"got {type(spec).__name__}")
        return items

    def _assemble(self, names, base: Optional[pa.Table], computed_src: Optional[pa.Table], n: int) -> pa.Table:
        """Output columns from the parent's columns (`base`) and, for computed columns, either
        stored values (select) or values evaluated on `computed_src` (view)."""
        computed = [n_ for n_ in names if self.sources[n_] is None]
        values = {}
        if computed:
            if self.materialize:
                values = {c: computed_src.column(c) for c in computed}
            else:
                inputs = sorted({c for c in computed for c in self.inputs[c]})
                src = computed_src.select(inputs) if inputs else pa.table({"_": pa.nulls(n)})
                got = _evaluate(src, [self.exprs[c] for c in computed], computed)
                values = {c: got.column(c) for c in computed}
        arrays = []
        for c in names:
            col = values[c] if self.sources[c] is None else base.column(self.sources[c])
            want = self.schema.field(c).type
            arrays.append(col.cast(want) if col.type != want else col)
        return pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(c) for c in names]))

    # rows are the parent's
    @property
    def rowset(self) -> RowSet:
        return self.parent.rowset

    @rowset.setter
    def rowset(self, value) -> None:
        pass

    @property
    def prev_rowset(self):
        return self.parent.prev_rowset if self._update is not None else None

    @prev_rowset.setter
    def prev_rowset(self, value) -> None:
        pass

    @property
    def size(self) -> int:
        return self.parent.size

    def _edge_keys(self, n, front):
        return _first_keys(self.parent, n, front)

    def _slots(self, keys):
        if self.materialize:
            return self._slot_of.get(np.asarray(keys, dtype=np.int64))
        return self.parent._slots(keys)

    # -- the stored columns of a select ---------------------------------------------------------
    def _store_rows(self, keys: np.ndarray) -> None:
        """Gives rows new slots (reusing freed ones) and stores their computed values."""
        if keys.size == 0:
            return
        reuse = min(self._free.size, keys.size)
        slots = np.concatenate((self._free[self._free.size - reuse:],
                                np.arange(self._next_slot, self._next_slot + keys.size - reuse, dtype=np.int64)))
        self._free = self._free[:self._free.size - reuse]
        self._next_slot += keys.size - reuse
        if self._next_slot > self._key_of_slot.size:
            size = self._key_of_slot.size
            while size < self._next_slot:
                size *= 2
            grown = np.full(size, -1, dtype=np.int64)
            grown[:self._key_of_slot.size] = self._key_of_slot
            self._key_of_slot = grown
        self._slot_of.set(keys, slots)
        self._key_of_slot[slots] = keys
        self._compute(keys, slots)

    def _compute(self, keys: np.ndarray, slots: np.ndarray) -> None:
        if keys.size == 0:
            return
        names = list(self.exprs)
        inputs = sorted({c for n in names for c in self.inputs[n]})
        src = self.parent.gather(inputs, keys) if inputs else pa.table({"_": pa.nulls(keys.size)})
        got = _evaluate(src, [self.exprs[n] for n in names], names)
        got = pa.Table.from_arrays([got.column(n).cast(self.schema.field(n).type) for n in names],
                                   schema=self.computed_store.schema)
        self.computed_store.ensure(int(slots.max()) + 1)
        self.computed_store.write(slots, got)

    def prev_gather(self, columns=None, keys=None) -> pa.Table:
        names = column_names(self.schema, columns)
        k = self._prev_keys(keys)
        if k.size == 0:
            return self.gather(names, k)
        need = sorted({c for n in names for c in self.inputs[n]})
        prev = self.parent.prev_gather(need, k)
        materialize, self.materialize = self.materialize, False  # evaluate on the previous inputs
        try:
            return self._assemble(names, prev, prev, k.size)
        finally:
            self.materialize = materialize

    def _follow(self, step, up):
        changed = {out for out, ins in self.inputs.items() if set(ins) & up.modified_columns}
        if self.materialize:
            if not up.removed.is_empty():
                rk = up.removed.keys()
                slots = self._slot_of.get(rk)
                self._slot_of.delete(rk)
                self._key_of_slot[slots] = -1
                self._free = np.concatenate((self._free, slots))
            if not up.shifted.is_empty():
                old, new = shifted_rows(self.parent, up)
                if old.size:
                    self._slot_of.remap(old, new)
                    self._key_of_slot[self._slot_of.get(new)] = new
            self._store_rows(up.added.keys())
            if {n for n in changed if self.sources[n] is None} and not up.modified.is_empty():
                mk = up.modified.keys()
                self._compute(mk, self._slot_of.get(mk))
        self._moves = getattr(self.parent, "_moves", None)
        mod = up.modified if changed else RowSet()
        return TableUpdate(added=up.added, removed=up.removed, modified=mod, shifted=up.shifted,
                           modified_columns=changed if not mod.is_empty() else ())

    def _on_parents(self, step, updates):
        up = updates.get(self.parent.name)
        if up is None:
            return None
        t0 = time.perf_counter()
        update = self._follow(step, up)
        if update.is_empty():
            update = None
        self._update = update
        self.cycle_seconds.append(time.perf_counter() - t0)
        if len(self.cycle_seconds) > 1000:
            del self.cycle_seconds[:-1000]
        return update

    def _end_cycle(self) -> None:
        self._prev = None
        self._update = None
        self._moves = None


# ----------------------------------------------------------------------------------------------
# head / tail
# ----------------------------------------------------------------------------------------------

class HeadTailTable(_Op):
    """The first (`head`) or last (`tail`) n rows of the parent, under the parent's row keys.
    Each cycle reads the parent's first or last n keys and compares them with its own: cost
    O(n + the parent's change)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, n: int, tail: bool = False):
        if int(n) < 0:
            raise ValueError(f"table {name!r}: {'tail' if tail else 'head'} needs n >= 0, got {n}")
        self.n = int(n)
        self.from_end = bool(tail)
        with graph.shared_lock(), _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self.attributes = {k: v for k, v in parent.attributes.items() if k == "BlinkTable"}
            self._keys = _first_keys(parent, self.n, not self.from_end) if self.n else _EMPTY.copy()
            self._bm = _bitmap(self._keys)
            self._rs = None

    def _slots(self, keys):
        return self.parent._slots(keys)

    def _edge_keys(self, n, front):
        n = min(int(n), self._keys.size)
        return self._keys[:n].copy() if front else self._keys[self._keys.size - n:].copy()

    def _follow(self, step, up):
        h0 = self._keys
        h1 = _first_keys(self.parent, self.n, not self.from_end) if self.n else _EMPTY.copy()
        gone = up.removed.contains(h0) if h0.size and not up.removed.is_empty() else np.zeros(h0.size, dtype=bool)
        s0 = h0[~gone]
        s0_new = up.shifted.apply_to_keys(s0)
        stays = np.isin(s0_new, h1, assume_unique=True)
        removed = np.concatenate((h0[gone], s0[~stays]))
        kept_old, kept_new = s0[stays], s0_new[stays]
        added = h1[~np.isin(h1, kept_new, assume_unique=True)]
        moved = kept_old != kept_new
        shifted = _restrict_shifts(up.shifted, kept_old[moved]) if moved.any() else RowSetShiftData()
        self._moves = (kept_old[moved], kept_new[moved]) if moved.any() else None
        modified = RowSet()
        if not up.modified.is_empty() and kept_new.size:
            m = up.modified.keys()
            modified = RowSet.from_keys(m[np.isin(m, kept_new, assume_unique=True)])
        self._keys = h1
        self._bm = _bitmap(h1)
        return TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(removed), modified=modified,
                           shifted=shifted, modified_columns=up.modified_columns if not modified.is_empty() else ())


# ----------------------------------------------------------------------------------------------
# last_by
# ----------------------------------------------------------------------------------------------

class LastByTable(_Op):
    """One row per distinct value of the key columns: the group's latest row (the one with the
    largest parent row key), as a keyed table. A group gets the next row key when it first
    appears (groups appearing in one cycle are numbered in the order of their first rows, as
    Deephaven orders groups by first appearance) and keeps it while it has rows; a group that empties is removed, and one that comes back is a new
    row. The group's row is modified when its latest row changes (every non-key column is then
    reported modified) or when the parent modifies that row (its modified columns)."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, keys: Union[str, Sequence[str]]):
        keys = [keys] if isinstance(keys, str) else list(keys)
        if not keys:
            raise ValueError(f"table {name!r}: last_by needs at least one key column")
        for k in column_names(parent.schema, keys):
            if not check_hashable(parent.schema.field(k).type):
                raise ValueError(f"table {name!r}: key column {k!r} has type {parent.schema.field(k).type}, "
                                 f"which cannot be a key")
        self.keys = keys
        self.value_columns = [n for n in parent.schema.names if n not in keys]
        self._groups = KeyIndex()
        self._group_keys = ColumnStore(pa.schema([parent.schema.field(k) for k in keys]))
        self._ngroups = 0
        self._gid_of = KeyMap()                       # parent row key -> group
        self._members = OrderIndex(2)                 # (group, parent row key) in order
        self._rep = np.full(1024, -1, dtype=np.int64)    # group -> its latest parent row key
        self._count = np.zeros(1024, dtype=np.int64)     # group -> rows
        self._okey = np.full(1024, -1, dtype=np.int64)   # group -> output row key
        self._gid_at = np.full(1024, -1, dtype=np.int64)  # output row key -> group
        self._next_okey = 0
        with graph.shared_lock(), _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, parent.schema)
            self.store = parent.store
            self._cycle(TableUpdate(added=parent.rowset))
            self._rs = None

    # -- storage --------------------------------------------------------------------------------
    def _grow(self, groups: int) -> None:
        size = self._rep.size
        if groups <= size:
            return
        while size < groups:
            size *= 2
        for name, fill in (("_rep", -1), ("_count", 0), ("_okey", -1)):
            old = getattr(self, name)
            new = np.full(size, fill, dtype=np.int64)
            new[:old.size] = old
            setattr(self, name, new)

    def _reps(self, okeys: np.ndarray) -> np.ndarray:
        return self._rep[self._gid_at[okeys]]

    def _parent_keys(self, keys):
        return self._reps(np.asarray(keys, dtype=np.int64))

    def _slots(self, keys):
        return self.parent._slots(self._reps(np.asarray(keys, dtype=np.int64)))

    def prev_gather(self, columns=None, keys=None):
        raise RuntimeError(f"table {self.name!r}: last_by does not keep previous values")

    # -- groups ---------------------------------------------------------------------------------
    def _group_of(self, values: pa.Table) -> np.ndarray:
        """Group of each row of key values, creating groups for new keys."""
        n = values.num_rows
        if n == 0:
            return _EMPTY.copy()
        cols = [values.column(k).combine_chunks() for k in self.keys]
        # booleans hash as int8 (hash_columns cannot read a boolean column with nulls)
        h = hash_columns([c.cast(pa.int8()) if pa.types.is_boolean(c.type) else c for c in cols])

        same = key_verifier(self._group_keys, self.keys, cols)
        gids, _ = self._groups.lookup(h, same)
        missing = np.flatnonzero(gids < 0)
        if missing.size:
            # one new group per distinct new key (its first row stands for it)
            sub = values.select(self.keys).take(pa.array(missing)).append_column(
                "__i", pa.array(np.arange(missing.size, dtype=np.int64)))
            firsts = np.sort(sub.group_by(self.keys, use_threads=False).aggregate([("__i", "min")])
                             .column("__i_min").to_numpy())
            rows = missing[firsts]
            new = np.arange(self._ngroups, self._ngroups + rows.size, dtype=np.int64)
            self._ngroups += rows.size
            self._grow(self._ngroups)
            self._group_keys.ensure(self._ngroups)
            self._group_keys.write(new, values.select(self.keys).take(pa.array(rows)))
            self._groups.insert(h[rows], new)
            again, _ = self._groups.lookup(h[missing], lambda qi, g: same(missing[qi], g))
            gids[missing] = again
        return gids

    def _new_reps(self, groups: np.ndarray) -> None:
        """Finds the latest row of each group (groups with rows)."""
        if groups.size == 0:
            return
        q = [groups.astype(np.uint64), np.full(groups.size, _U64_MAX, dtype=np.uint64)]
        pred, _ = self._members.locate(q)
        ok = pred != NONE_LO
        w = self._members.words_at(pred[ok])
        same = w[0].astype(np.int64) == groups[ok]
        rep = np.full(groups.size, -1, dtype=np.int64)
        rep[np.flatnonzero(ok)[same]] = w[1][same].astype(np.int64)
        self._rep[groups] = rep

    def _follow(self, step, up):
        return self._cycle(up)

    def _cycle(self, up: TableUpdate) -> Optional[TableUpdate]:
        parent, members, gid_of = self.parent, self._members, self._gid_of
        rec_g: list[np.ndarray] = []       # touched groups, with their latest row before the cycle
        rec_rep: list[np.ndarray] = []     # (post-shift key; -2 when that row left)
        lost: list[np.ndarray] = []        # groups whose latest row left
        # 1. removed rows (pre-shift keys)
        rem_p = up.removed.keys()
        if rem_p.size:
            g = gid_of.get(rem_p)
            if np.any(g < 0):
                raise RuntimeError(f"table {self.name!r}: the parent removed rows this table does not have")
            rep_b = self._rep[g]
            gone = np.isin(rep_b, rem_p)
            rep_b = np.where(gone, -2, up.shifted.apply_to_keys(rep_b))
            rec_g.append(g)
            rec_rep.append(rep_b)
            lost.append(g[gone])
            gid_of.delete(rem_p)
            members.delete(members.key_of(rem_p))
            np.subtract.at(self._count, g, 1)
        # 2. shifted rows: new parent keys
        if not up.shifted.is_empty():
            old, new = shifted_rows(parent, up)
            if old.size:
                g = gid_of.get(old)
                gid_of.remap(old, new)
                members.set_last_word(members.key_of(old), new)
                is_rep = self._rep[g] == old
                self._rep[g[is_rep]] = new[is_rep]
        # 3. modified rows that changed group move to it
        mod_p = up.modified.keys()
        moved_in_p, moved_in_g = _EMPTY, _EMPTY
        if mod_p.size and set(self.keys) & up.modified_columns:
            cur = gid_of.get(mod_p)
            new_g = self._group_of(parent.gather(self.keys, mod_p))
            ch = new_g != cur
            if ch.any():
                mp, cg, ng = mod_p[ch], cur[ch], new_g[ch]
                rec_g.extend([cg, ng])
                rec_rep.extend([self._rep[cg], self._rep[ng]])
                lost.append(cg[self._rep[cg] == mp])
                members.delete(members.key_of(mp))
                np.subtract.at(self._count, cg, 1)
                moved_in_p, moved_in_g = mp, ng
        # 4. added rows (and rows that moved in) join their groups
        add_p = up.added.keys()
        add_g = self._group_of(parent.gather(self.keys, add_p))
        in_p = np.concatenate((add_p, moved_in_p))
        in_g = np.concatenate((add_g, moved_in_g))
        if in_p.size:
            rec_g.append(in_g)
            rec_rep.append(self._rep[in_g])
            gid_of.set(in_p, in_g)
            members.insert([in_g.astype(np.uint64), in_p.astype(np.uint64)])
            np.add.at(self._count, in_g, 1)
            np.maximum.at(self._rep, in_g, in_p)
        # 5. groups whose latest row left find their new latest row
        if lost:
            lg = np.unique(np.concatenate(lost))
            has = self._count[lg] > 0
            self._rep[lg[~has]] = -1
            self._new_reps(lg[has])
        if not rec_g:
            mod_o = self._modified_reps(mod_p)
            return self._emit(_EMPTY, _EMPTY, mod_o, up, False)
        # 6. what each touched group's output row does
        allg = np.concatenate(rec_g)
        allrep = np.concatenate(rec_rep)
        G, first = np.unique(allg, return_index=True)
        rep_b = allrep[first]
        existed = self._okey[G] >= 0
        now = self._count[G] > 0
        gone_o = self._okey[G[existed & ~now]]
        self._gid_at[gone_o] = -1
        self._okey[G[existed & ~now]] = -1
        born = G[~existed & now]
        if born.size:
            # new groups in the order of their first rows (all their rows came in this cycle)
            o = np.argsort(in_p, kind="stable")
            firsts_g, firsts_i = np.unique(in_g[o], return_index=True)
            first_row = np.full(self._ngroups, np.iinfo(np.int64).max, dtype=np.int64)
            first_row[firsts_g] = in_p[o][firsts_i]
            born = born[np.argsort(first_row[born], kind="stable")]
        new_o = np.arange(self._next_okey, self._next_okey + born.size, dtype=np.int64)
        self._next_okey += born.size
        if new_o.size:
            size = self._gid_at.size
            while size < self._next_okey:
                size *= 2
            if size > self._gid_at.size:
                grown = np.full(size, -1, dtype=np.int64)
                grown[:self._gid_at.size] = self._gid_at
                self._gid_at = grown
            self._gid_at[new_o] = born
            self._okey[born] = new_o
        both = existed & now
        rep_changed = both & (self._rep[G] != rep_b)
        changed_o = self._okey[G[rep_changed]]
        mod_o = np.union1d(changed_o, self._modified_reps(mod_p))
        return self._emit(new_o, gone_o, mod_o, up, bool(changed_o.size))

    def _modified_reps(self, mod_p: np.ndarray) -> np.ndarray:
        """Output keys of groups whose latest row the parent modified in place."""
        if mod_p.size == 0:
            return _EMPTY
        g = self._gid_of.get(mod_p)
        ok = g >= 0
        g, p = g[ok], mod_p[ok]
        is_rep = self._rep[g] == p
        return self._okey[g[is_rep]]

    def _emit(self, added, removed, modified, up, reps_changed: bool) -> TableUpdate:
        self._commit(removed, added)
        modified = np.setdiff1d(modified, added)
        cols = set()
        if modified.size:
            cols = set(self.value_columns) if reps_changed else set()
            cols |= up.modified_columns
        return TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(removed),
                           modified=RowSet.from_keys(modified), modified_columns=cols)
