"""What the derived tables of this package share: `_Op`, the base of a derived table with one
parent whose row set lives in a private bitmap, and the helpers the operations use (bitmaps of
row keys, shifts, expression evaluation, default names)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
from pyroaring import BitMap64

from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData, keys_to_bitmap
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.graph.tables import Rows, Table, unique_name

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["unique_name", "expression_columns", "shifted_rows"]

_EMPTY = np.zeros(0, dtype=np.int64)
# row-set changes of at most this many keys are queued, up to these totals, before they are folded
QUEUE_KEYS = 1 << 14
_QUEUE_MAX_KEYS = 1 << 16
_QUEUE_MAX_CHANGES = 32


def _bitmap(keys: np.ndarray) -> BitMap64:
    k = np.asarray(keys, dtype=np.int64)
    return keys_to_bitmap(k) if k.size else BitMap64()


def _bm_keys(bm: BitMap64) -> np.ndarray:
    return np.frombuffer(bm.to_array(), dtype=np.uint64).view(np.int64)


def _rs_bitmap(rs: RowSet, copy: bool = True) -> BitMap64:
    """A RowSet's keys as a bitmap: a private copy, or (copy=False) one only to be read."""
    if rs.is_empty():
        return BitMap64()
    bm = rs.bitmap()
    return bm.copy() if copy and not rs.is_single_range else bm


@contextmanager
def _unregistered_on_error(graph: "UpdateGraph", table: Table) -> Iterator[None]:
    """A derived table whose first computation raises leaves the graph: it is registered (by
    `Table.__init__`) before its rows are computed."""
    try:
        yield
    except BaseException:
        name = getattr(table, "name", None)
        if name is not None and graph.tables.get(name) is table:
            graph.remove_table(name)
        raise


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
    own: Optional[tuple[np.ndarray, np.ndarray]] = getattr(table, "_moves", None)
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
    fast: Optional[Callable[[int, bool], np.ndarray]] = getattr(table, "_edge_keys", None)
    if fast is not None:
        return fast(n, front)
    rs = table.rowset
    size = len(rs)
    if front:
        return rs.subset_by_positions(0, n - 1).keys()
    return rs.subset_by_positions(size - n, size - 1).keys()


class _Op(Table):
    """A derived table with one parent whose row set lives in a private bitmap (see the module
    docstring). Subclasses implement `_follow(step, update) -> Optional[TableUpdate]` and change
    `self._bm` in it; the base keeps `rowset`, `prev_rowset`, `_moves` and timings. A table with
    several parents (`others` besides `parent`, the one whose rows it follows) implements
    `_follow_all(step, updates)` instead: it runs once per cycle in which any parent changed, after
    all of them, with every parent's update."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, schema: pa.Schema,
                 others: Sequence[Table] = ()):
        self._fold_lock = threading.Lock()
        self._bm = BitMap64()
        self._rs: Optional[RowSet] = RowSet()
        self._prev_rs: Optional[RowSet] = None
        self._update: Optional[TableUpdate] = None
        self._moves: Optional[tuple[np.ndarray, np.ndarray]] = None
        self.parent = parent
        self.cycle_seconds: list[float] = []  # time spent following the parent, last 1000 cycles
        parents = [parent] + [t for i, t in enumerate(others) if t is not parent and t not in others[:i]]
        Table.__init__(self, graph, name, schema, parents=parents)
        self.is_refreshing = any(p.is_refreshing for p in parents)

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
            self._rs = RowSet.from_bitmap(self._bm.copy())
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
            empty: np.ndarray = _EMPTY.copy()
            return empty
        part = self._bm[0:n] if front else self._bm[size - n:size]
        return _bm_keys(part)

    # -- the cycle ------------------------------------------------------------------------------
    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        t0 = time.perf_counter()
        before = self._rs
        update = self._follow_all(step, updates)
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

    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        """This cycle's update from the parents' (a table with several parents overrides it)."""
        up = updates.get(self.parent.name)
        if up is None:
            return None
        return self._follow(step, up)

    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        raise NotImplementedError

    def _commit(self, gone: Union[RowSet, np.ndarray], come: Union[RowSet, np.ndarray]) -> None:
        """Row set change: keys `gone` leave, then keys `come` arrive (arrays or RowSets). Both
        small: queued (see `_bm`); otherwise applied at once."""
        ng = len(gone) if isinstance(gone, RowSet) else gone.size
        nc = len(come) if isinstance(come, RowSet) else come.size
        if ng == 0 and nc == 0:
            return
        self._size += nc - ng
        if ng + nc <= QUEUE_KEYS:
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

    def end_cycle(self) -> None:
        self._prev = None
        self._prev_rs = None
        self._update = None
        self._moves = None

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """Previous values of this cycle's modified rows (read from the parent's)."""
        k = self._prev_keys(keys)
        if k.size == 0:
            return self.gather(columns, k)
        return self.parent.prev_gather(columns, self._parent_keys(k))

    def _prev_keys(self, keys: Optional[Rows]) -> np.ndarray:
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
