"""update_by: cumulative, exponential and rolling operations per bucket, incrementally.

The result has the parent's rows, row keys and shifts (a `LeftRowsJoin` over one parent): the
parent's columns are read through, the operations' output columns live in the table's own store
(one slot per row, `KeyMap` row key -> slot). Rows are bucketed by the `by` columns (`KeySpace`;
one bucket without them), and each bucket's rows are kept in row-key order (`JoinSide.members`).

What a cycle recomputes: in each bucket the cycle touched (rows added, removed, moved between
buckets, or modified in a column some operation reads), the rows from the first touched position to
the bucket's end. Scans (cumulative and exponential operations) start from the state the operation
kept for the row just before (`_state`), so an append computes only the appended rows; windows
(rolling operations) read the rows their windows reach back to. Every kernel runs over the rows of
all touched buckets at once (`update_by_kernels`). A recomputed row is reported modified only in
the columns whose value changed.

Deephaven's rules are followed where they are known (result types, nulls skipped, NaN, the
ordering requirement of time-based operations); see `OPS` and the README.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, equal_mask
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops import update_by_formula as F
from tickwire.server.engine.graph.ops import update_by_kernels as K
from tickwire.server.engine.graph.ops import update_by_minmax as MM
from tickwire.server.engine.graph.ops.aggregate import _vector_type
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.join_keys import JoinSide, KeySpace, java_type, unknown_columns
from tickwire.server.engine.graph.ops.natural_join import LeftRowsJoin, _JoinStore, take_two
from tickwire.server.engine.graph.order import NONE_HI, NONE_LO
from tickwire.server.engine.graph.table_update import TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["UpdateByOp", "UpdateByTable", "OPS", "CONTROLS"]

_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
END = np.iinfo(np.int64).max // 2  # a start past every row of a bucket

CUMULATIVE = ("cum_sum", "cum_prod", "cum_min", "cum_max", "fill", "delta", "cum_count_where")
EXPONENTIAL = ("ema", "ems", "em_min", "em_max", "em_std")
ROLLING = ("rolling_sum", "rolling_avg", "rolling_min", "rolling_max", "rolling_prod", "rolling_count",
           "rolling_std", "rolling_wavg", "rolling_group", "rolling_count_where", "rolling_formula")
OPS = CUMULATIVE + EXPONENTIAL + ROLLING
# what an exponential operation does with a bad value or time: Deephaven's BadDataBehavior
BEHAVIOURS = ("throw", "reset", "skip", "poison")
CONTROLS = ("on_null", "on_nan", "on_null_time", "on_negative_time", "on_zero_time")
DEFAULT_CONTROL = {"on_null": "skip", "on_nan": "skip", "on_null_time": "skip", "on_negative_time": "throw",
                   "on_zero_time": "skip"}
DELTAS = ("null_dominates", "value_dominates", "zero_dominates")


@dataclass(frozen=True)
class UpdateByOp:
    """One operation of an update_by: `kind` (one of OPS) over `pairs` ((output, input) columns;
    for the count_where kinds one pair (output, "")).

    Exponential kinds decay over `decay_ticks` rows, or over `decay_time` nanoseconds of `time_col`;
    rolling kinds look `rev` back and `fwd` ahead, in rows or (with `time_col`) in nanoseconds.
    `control`: BadDataBehavior per CONTROLS key; `delta`: one of DELTAS; `weight`: the weight column
    of rolling_wavg; `filters`: the predicate of the count_where kinds (a pyarrow Expression);
    `formula`: rolling_formula's tree (see update_by_formula.parse)."""

    kind: str
    pairs: tuple[tuple[str, str], ...]
    time_col: Optional[str] = None
    decay_ticks: float = 0.0
    decay_time: int = 0
    rev: int = 0
    fwd: int = 0
    control: tuple[tuple[str, str], ...] = ()
    delta: str = "null_dominates"
    weight: Optional[str] = None
    filters: Any = None
    filter_columns: tuple[str, ...] = ()
    formula: Any = None

    def behaviour(self, what: str) -> str:
        return dict(self.control).get(what, DEFAULT_CONTROL[what])

    @property
    def windowed(self) -> bool:
        return self.kind in ROLLING


def _is_int(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


def _output_type(op: UpdateByOp, t: pa.DataType, name: str) -> pa.DataType:
    """The result type Deephaven gives `op` on an input of type `t` (or raises its refusal)."""
    k = op.kind
    if k == "fill":
        return t
    if k in ("cum_count_where", "rolling_count_where"):
        return pa.int64()
    if k == "rolling_count":
        if pa.types.is_temporal(t):  # as Deephaven 42.7, which counts strings but not Instants
            raise OperationError(f"rolling_count does not support column {name!r} of type {java_type(t)}")
        return pa.int64()
    if k == "rolling_group":
        return pa.list_(t)
    if k == "rolling_formula":
        return F.result_type(op.formula, t)
    if pa.types.is_timestamp(t) and k in ("cum_min", "cum_max", "rolling_min", "rolling_max"):
        return t  # Instants compare as their nanoseconds
    if _is_string(t) and k in ("cum_min", "cum_max", "rolling_min", "rolling_max"):
        return t  # as Deephaven: Strings compare (see _string_codes)
    if pa.types.is_timestamp(t) and k == "delta":
        return pa.int64()  # as Deephaven: nanoseconds between the Instants
    if not _numeric(t):
        raise OperationError(f"{_op_title(op)} does not support column {name!r} of type {java_type(t)}")
    if k in ("cum_min", "cum_max", "rolling_min", "rolling_max"):
        return t
    if k in ("cum_sum", "cum_prod", "rolling_sum"):
        return pa.int64() if _is_int(t) else pa.float64()
    if k == "delta":
        return t  # as Deephaven: the input's type (integers wrap)
    return pa.float64()  # averages, deviations, exponential kinds


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _string_codes(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(code, valid) of each string: its rank among the distinct values of `a` (0 first), so that
    min and max of strings are min and max of integers. Strings order by their bytes, which is the
    order of their code points (Java's String.compareTo orders UTF-16 units: the two differ only
    between characters U+E000..U+FFFF and those above U+FFFF)."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    codes = np.asarray(pc.rank(a, sort_keys="ascending", tiebreaker="dense"), dtype=np.int64) - 1
    valid = np.ones(len(a), dtype=bool) if a.null_count == 0 else \
        np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return codes, valid


def _string_extreme(a: pa.Array, codes: np.ndarray, picked: np.ndarray, ok: np.ndarray) -> pa.Array:
    """The strings of `a` whose codes are `picked` (null where not `ok`)."""
    rep = np.zeros(int(codes.max()) + 1 if codes.size else 1, dtype=np.int64)
    rep[codes] = np.arange(codes.size)  # a row holding each code
    return a.take(pa.array(rep[np.where(ok, picked, 0)], mask=~ok))


def _op_title(op: UpdateByOp) -> str:
    return op.kind


def _values(a: pa.Array, t: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of a numeric or temporal array: integers as int64, floats as float64."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    valid = np.ones(len(a), dtype=bool) if a.null_count == 0 else \
        np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_temporal(t):
        a = a.cast(pa.int64())
    if pa.types.is_boolean(t):
        a = a.cast(pa.int8())
    if pa.types.is_floating(t):
        v = np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
    else:
        v = np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return v, valid


def _arrow(values: np.ndarray, ok: np.ndarray, t: pa.DataType) -> pa.Array:
    mask = None if ok.all() else ~ok
    if pa.types.is_floating(t):
        return pa.array(values.astype(t.to_pandas_dtype()), mask=mask, type=t)
    if pa.types.is_integer(t):
        return pa.array(values.astype(t.to_pandas_dtype()), mask=mask, type=t)
    return pa.array(values, mask=mask).cast(t)


@dataclass
class _Rows:
    """Rows handed to the kernels: segments (one per bucket) in row order."""
    keys: np.ndarray
    seg: np.ndarray
    pos: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.pos = K.positions(self.seg)


class UpdateByTable(LeftRowsJoin):
    """`parent` with the output columns of `ops` (see UpdateByOp), computed per bucket of the `by`
    columns in row order."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, ops: Sequence[UpdateByOp],
                 by: Sequence[str] = ()):
        by = [str(c) for c in by]
        missing = [c for c in by if c not in parent.schema.names]
        if missing:
            raise unknown_columns(parent, missing)
        self.ops = list(ops)
        if not self.ops:
            raise OperationError("update_by needs at least one operation")
        self.by = by
        fields: dict[str, pa.Field] = {}
        reads: set[str] = set()
        for op in self.ops:
            if op.kind not in OPS:
                raise OperationError(f"unknown update_by operation {op.kind!r}")
            need = [c for _o, c in op.pairs if c] + ([op.time_col] if op.time_col else []) + \
                ([op.weight] if op.weight else []) + list(op.filter_columns)
            missing = [c for c in need if c not in parent.schema.names]
            if missing:
                raise unknown_columns(parent, missing)
            reads |= set(need)
            if op.time_col is not None:
                tt = parent.schema.field(op.time_col).type
                if not (pa.types.is_timestamp(tt) or tt == pa.int64()):
                    raise OperationError(f"time column {op.time_col!r} has type {java_type(tt)}: an Instant or a "
                                         f"long is needed")
            for out, col in op.pairs:
                t = pa.bool_() if not col else parent.schema.field(col).type
                if op.kind == "rolling_wavg":
                    wt = parent.schema.field(op.weight).type if op.weight else None
                    if not _numeric(t) or wt is None or not _numeric(wt):
                        raise OperationError(f"rolling_wavg needs numeric value and weight columns ({col!r}: "
                                             f"{java_type(t)})")
                if out in fields:
                    raise OperationError(f"update_by output column {out!r} is given twice")
                ot = _output_type(op, t, col)
                # as Deephaven: a rolling group is a vector of the column's type
                meta = {b"deephaven:type": _vector_type(t)} if op.kind == "rolling_group" else None
                fields[out] = pa.field(out, ot, metadata=meta)
        self.reads = reads
        self.left = parent
        self.left_names = set(parent.schema.names) - set(fields)
        schema = pa.schema([fields.get(f.name, f) for f in parent.schema] +
                           [f for n, f in fields.items() if n not in parent.schema.names])
        self.out_schema = pa.schema(list(fields.values()))
        self.space = KeySpace([parent.schema.field(c).type for c in by])
        self.side = JoinSide(self.space, parent, by)
        self.values = ColumnStore(self.out_schema)
        self.slot_of = KeyMap()
        self._last = np.full(0, -1, dtype=np.int64)  # bucket -> slot of its last row (-1: unknown)
        # the cycle's added rows, their buckets, rows per bucket before it, buckets rows moved into
        self._appended: Optional[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = None
        self.row_at = KeyMap()  # bucket * _POS + position in the bucket -> slot (state "#key": its row key)
        self._state: dict[str, np.ndarray] = {}  # hidden scan state per slot, by "output/what"
        self._nslots = 0
        self._free = _EMPTY.copy()
        self._dying = _EMPTY.copy()
        self._lup: Optional[TableUpdate] = None
        self._pinfo: Optional[tuple[np.ndarray, pa.Table]] = None  # rewritten slots (sorted), old values
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, schema)
            self.store = _JoinStore(self)
            self.attributes: dict[str, Any] = {}
            ch = self.side.follow(TableUpdate(added=parent.rowset))
            self._new_slots(ch.added)
            if ch.added.size:
                G, first = np.unique(ch.added_groups, return_index=True)
                start = np.zeros(G.size, dtype=np.int64)  # every row of each bucket
                self._recompute(G, start, full=True)
            self._update = None

    # -- storage ----------------------------------------------------------------------------------
    def right_values(self, keys: np.ndarray, names: Sequence[str]) -> pa.Table:
        return self.values.gather(self.slot_of.get(keys), names)

    def _new_slots(self, keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        take = min(keys.size, self._free.size)
        slots = np.concatenate((self._free[self._free.size - take:],
                                np.arange(self._nslots, self._nslots + keys.size - take, dtype=np.int64)))
        self._free = self._free[:self._free.size - take]
        self._nslots += keys.size - take
        self.values.ensure(self._nslots)
        for name, arr in list(self._state.items()):
            if arr.size < self._nslots:
                grown = np.zeros(max(self._nslots, 2 * arr.size), dtype=arr.dtype)
                grown[:arr.size] = arr
                self._state[name] = grown
        self.slot_of.set(keys, slots)

    def _get_state(self, name: str, slots: np.ndarray, dtype: Any) -> np.ndarray:
        arr = self._state.get(name)
        if arr is None:
            arr = self._state[name] = np.zeros(max(self._nslots, 16), dtype=dtype)
        out: np.ndarray = arr[slots]
        return out

    def _put_state(self, name: str, slots: np.ndarray, values: np.ndarray) -> None:
        arr = self._state.get(name)
        if arr is None or arr.size < self._nslots:
            old = arr
            arr = np.zeros(max(self._nslots, 16), dtype=values.dtype)
            if old is not None:
                arr[:old.size] = old
            self._state[name] = arr
        arr[slots] = values

    # -- which rows -------------------------------------------------------------------------------
    def _last_slot(self, G: np.ndarray, slots: Optional[np.ndarray] = None) -> np.ndarray:
        """The slot of each bucket's last row (-1: unknown); with `slots`, sets them."""
        need = int(G.max()) + 1 if G.size else 0
        if self._last.size < max(need, self.space.n):
            grown = np.full(max(need, self.space.n, 2 * self._last.size), -1, dtype=np.int64)
            grown[:self._last.size] = self._last
            self._last = grown
        if slots is not None:
            self._last[G] = slots
        out: np.ndarray = self._last[G]
        return out

    def _append_hint(self, groups: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """For rows added after their bucket's last row: that row's element in the bucket index
        (the element just before them), else -1."""
        out = np.full(keys.size, -1, dtype=np.int64)
        if self._last.size == 0:
            return out
        have = groups < self._last.size
        last = np.full(keys.size, -1, dtype=np.int64)
        last[have] = self._last[groups[have]]
        ok = last >= 0
        if not ok.any():
            return out
        lkey = self._get_state("#key", last[ok], np.int64)
        # still that bucket's row (a slot is reused once its row is gone)
        live = (self.slot_of.get(lkey) == last[ok]) & (self.side.group_of.get(lkey) == groups[ok]) & \
            (lkey < keys[ok])
        idx = np.flatnonzero(ok)[live]
        if idx.size:
            m = self.side.members
            assert m is not None
            e = m.key_of(lkey[live])
            # only if it is the bucket's last element now (a row may have moved in behind it)
            nxt = m.after(np.maximum(e, 0))
            last_now = (e >= 0) & (nxt == NONE_HI)
            if (~last_now & (e >= 0)).any():
                w = m.words_at(nxt[~last_now & (e >= 0)])
                other = np.ones(e.size, dtype=bool)
                other[~last_now & (e >= 0)] = w[0].astype(np.int64) != groups[idx][~last_now & (e >= 0)] + 1
                last_now |= (e >= 0) & other
            out[idx] = np.where(last_now, e, -1)
        return out

    def _find_tails(self, G: np.ndarray, start: np.ndarray) -> tuple[_Rows, np.ndarray]:
        """`_tails`, with a shortcut for buckets the cycle only appended to (every touched row
        after the bucket's last row before the cycle, which is still there): their tails are their
        added rows and the row before is that last row, found without searching the index."""
        if self._appended is None:
            return self._tails(G, start)
        added, added_g, was, moved_to = self._appended
        last = self._last_slot(G)
        known = last >= 0
        lkey = np.full(G.size, -1, dtype=np.int64)
        if known.any():
            lkey[known] = self._get_state("#key", last[known], np.int64)
            # still that bucket's row (a slot is reused once its row is gone)
            live = (self.slot_of.get(lkey[known]) == last[known]) & (self.side.group_of.get(lkey[known]) == G[known])
            known[np.flatnonzero(known)[~live]] = False
        fresh = was == 0  # a bucket that had no rows: all of its rows are new
        fast = (known & (start > lkey)) | fresh
        if moved_to.size:  # a row that moved in is not among the added ones
            fast &= ~np.isin(G, moved_to)
        if not fast.any():
            return self._tails(G, start)
        slow = ~fast
        tail_s, before_s = self._tails(G[slow], start[slow]) if slow.any() else \
            (_Rows(_EMPTY.copy(), _EMPTY.copy()), _EMPTY)
        fi = np.flatnonzero(fast)
        gi = np.searchsorted(G[fi], added_g)
        hit = gi < fi.size
        hit[hit] = G[fi][gi[hit]] == added_g[hit]
        fk, fs = added[hit], fi[gi[hit]]
        o = np.lexsort((fk, fs))
        keys = np.concatenate((tail_s.keys, fk[o]))
        seg = np.concatenate((np.flatnonzero(slow)[tail_s.seg], fs[o]))
        order = np.argsort(seg, kind="stable")
        before = np.full(G.size, -1, dtype=np.int64)
        before[slow] = before_s
        before[fast & ~fresh] = lkey[fast & ~fresh]
        return _Rows(keys[order], seg[order]), before

    def _tails(self, G: np.ndarray, start: np.ndarray) -> tuple[_Rows, np.ndarray]:
        """The rows of each bucket in `G` whose row key is at least `start` (in order, one segment
        per bucket, segment id = index in G), and the row just before each tail (-1: none)."""
        m = self.side.members
        assert m is not None
        g1 = (G + 1).astype(np.uint64)
        q0 = np.where(start > 0, g1, G.astype(np.uint64))
        q1 = np.where(start > 0, (start - 1).astype(np.uint64), _U64_MAX)
        pred, succ = m.locate([q0, q1])
        last, _s = m.locate([g1, np.full(G.size, _U64_MAX)])
        before = np.full(G.size, -1, dtype=np.int64)
        okp = pred != NONE_LO
        if okp.any():
            w = m.words_at(pred[okp])
            same = w[0] == g1[okp]
            idx = np.flatnonzero(okp)[same]
            before[idx] = w[1][same].astype(np.int64)
        ok = (succ != NONE_HI) & (last != NONE_LO)
        if ok.any():
            ok[ok] = succ[ok] <= last[ok]
        if not ok.any():
            return _Rows(_EMPTY.copy(), _EMPTY.copy()), before
        keys, which = m.keys_between(np.where(ok, succ, 0), np.where(ok, last, -1))
        rows = m.words_at(keys)[1].astype(np.int64)
        return _Rows(rows, which), before

    # -- the cycle ------------------------------------------------------------------------------
    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        up = updates.get(self.left.name)
        if up is None:
            return None
        self._lup = up
        rem = up.removed.keys()
        tg: list[np.ndarray] = []
        tk: list[np.ndarray] = []
        if rem.size:  # the rows after a removed row are recomputed from the first that stays
            g_s, k_s = self._survivors_after(rem)
            if not up.shifted.is_empty():
                real = k_s != END
                k_s[real] = up.shifted.apply_to_keys(k_s[real])
            tg.append(g_s)
            tk.append(k_s)
        ch = self.side.follow(up, self._append_hint if up.shifted.is_empty() else None)
        if rem.size:
            self._dying = np.concatenate((self._dying, self.slot_of.get(rem)))
            self.slot_of.delete(rem)
        if ch.shift_old.size:
            self.slot_of.remap(ch.shift_old, ch.shift_new)
            self._put_state("#key", self.slot_of.get(ch.shift_new), ch.shift_new)
        self._moves = (ch.shift_old, ch.shift_new) if ch.shift_old.size else None
        self._new_slots(ch.added)
        if ch.added.size:
            tg.append(ch.added_groups)
            tk.append(ch.added)
        if ch.moved.size:
            tg += [ch.moved_from, ch.moved_to]
            tk += [ch.moved, ch.moved]
        mods: list[np.ndarray] = []
        cols: set[str] = set()
        if not up.modified.is_empty():
            mk = up.modified.keys()
            mods.append(mk)
            cols |= set(up.modified_columns) & self.left_names
            if self.reads & up.modified_columns:
                tg.append(self.side.group_of.get(mk))
                tk.append(mk)
        self._pinfo = None
        if tg:
            g_all, k_all = np.concatenate(tg), np.concatenate(tk)
            order = np.lexsort((k_all, g_all))
            g_all, k_all = g_all[order], k_all[order]
            first = np.ones(g_all.size, dtype=bool)
            first[1:] = g_all[1:] != g_all[:-1]
            G, start = g_all[first], k_all[first]
            now, was = self.side.counts(G), ch.counts_before(self.side, G)
            shrunk = now < was
            if shrunk.any():  # positions past a bucket's new end no longer have a row
                n = (was - now)[shrunk]
                at = _ranges(now[shrunk], was[shrunk])
                self.row_at.delete(np.repeat(G[shrunk], n) * _POS + at)
            keep = now > 0
            self._appended = (ch.added, ch.added_groups, was[keep], ch.moved_to)
            changed_rows, changed_cols = self._recompute(G[keep], start[keep], full=False)
            self._appended = None
            if changed_rows.size:
                if not up.added.is_empty():
                    changed_rows = changed_rows[~up.added.contains(changed_rows)]
                mods.append(changed_rows)
                cols |= changed_cols
        return self._left_update(up, mods, cols)

    def _survivors_after(self, rem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Before the cycle's removals: for each removed row, its bucket and the first row after it
        in that bucket that is not removed (row key before the cycle's shifts; END when the bucket
        has none, so that only windows reaching forward recompute)."""
        m = self.side.members
        assert m is not None
        e = np.sort(m.key_of(rem))
        nxt = m.after(e)
        # runs of removed elements next to each other end where the next element stays
        ends = np.ones(e.size, dtype=bool)
        ends[:-1] = nxt[:-1] != e[1:]
        run = np.concatenate(([0], np.cumsum(ends)[:-1]))
        surv = nxt[np.flatnonzero(ends)][run]
        g = m.words_at(e)[0].astype(np.int64)
        keys = np.full(e.size, END, dtype=np.int64)
        ok = surv != NONE_HI
        if ok.any():
            w = m.words_at(surv[ok])
            same = w[0].astype(np.int64) == g[ok]
            idx = np.flatnonzero(ok)[same]
            keys[idx] = w[1][same].astype(np.int64)
        return g - 1, keys

    def end_cycle(self) -> None:
        LeftRowsJoin.end_cycle(self)
        if self._dying.size:
            self._free = np.concatenate((self._free, self._dying))
            self._dying = _EMPTY.copy()

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        """Previous values of this cycle's modified rows: the parent's for its columns, the values
        this table kept before it rewrote them for the others."""
        k = self._prev_keys(keys)
        names = column_names(self.schema, columns)
        now = self.gather(names, k)
        if k.size == 0:
            return now
        cols = dict(zip(names, now.columns))
        self._left_prev(names, k, cols)
        onames = [n for n in names if n not in self.left_names]
        if onames and self._pinfo is not None:
            rewritten, old = self._pinfo
            slots = self.slot_of.get(k)
            vals = self.values.gather(slots, onames)
            if rewritten.size:
                j = np.minimum(np.searchsorted(rewritten, slots), rewritten.size - 1)
                hit = rewritten[j] == slots
                vals = take_two(vals, old.select(onames), hit, j[hit])
            cols.update(zip(onames, vals.columns))
        return pa.Table.from_arrays([cols[n] for n in names], schema=pa.schema([self.schema.field(n) for n in names]))

    # -- recomputation ----------------------------------------------------------------------------
    def _recompute(self, G: np.ndarray, start: np.ndarray, full: bool) -> tuple[np.ndarray, set[str]]:
        """Recomputes every operation for the rows of buckets `G` from row key `start` on; writes
        the outputs that changed. Returns (rows whose outputs changed, sorted; their columns)."""
        if G.size == 0:
            return _EMPTY, set()
        results: list[tuple[np.ndarray, dict[str, pa.Array]]] = []
        scans = [op for op in self.ops if not op.windowed]
        windows = [op for op in self.ops if op.windowed]
        tail, before = self._find_tails(G, start)
        # positions in the bucket: the tail's follow the row before it
        has_before = before >= 0
        ppos = np.full(G.size, -1, dtype=np.int64)
        if has_before.any():
            ppos[has_before] = self._get_state("#pos", self.slot_of.get(before[has_before]), np.int64)
        tpos = ppos[tail.seg] + 1 + tail.pos
        if tail.keys.size:
            tslots = self.slot_of.get(tail.keys)
            self._put_state("#pos", tslots, tpos)
            self._put_state("#key", tslots, tail.keys)
            self.row_at.set(G[tail.seg] * _POS + tpos, tslots)
        # each bucket's last row: its tail's last, or the row before an empty tail
        last = np.where(has_before, self.slot_of.get(np.maximum(before, 0)), -1)
        if tail.keys.size:
            ends = np.flatnonzero(np.append(tail.seg[1:] != tail.seg[:-1], True))
            last[tail.seg[ends]] = tslots[ends]
        self._last_slot(G, last)
        if scans and tail.keys.size:
            results.append((tail.keys, self._run_scans(scans, tail, before)))
        prefix = [op for op in windows if op.time_col is None and op.kind in PREFIX_KINDS]
        if prefix:
            results += self._run_prefix_windows(prefix, G, tail, tpos, ppos + 1)
        ticks = [op for op in windows if op.time_col is None and op.kind not in PREFIX_KINDS]
        if ticks:
            results += self._run_tick_windows(ticks, G, start, tail)
        times = [op for op in windows if op.time_col is not None]
        if times:
            results += self._run_windows(times, G, start)
        return self._write(results, full)

    def _write(self, results: list[tuple[np.ndarray, dict[str, pa.Array]]], full: bool) -> tuple[np.ndarray, set[str]]:
        changed: list[np.ndarray] = []
        cols: set[str] = set()
        old_parts: list[tuple[np.ndarray, pa.Table]] = []
        for keys, outs in results:
            if keys.size == 0:
                continue
            slots = self.slot_of.get(keys)
            names = list(outs)
            new = pa.Table.from_arrays([outs[n] for n in names],
                                       schema=pa.schema([self.out_schema.field(n) for n in names]))
            if full:
                self._write_columns(slots, new)
                continue
            old = self.values.gather(slots, names)
            diff = np.zeros(keys.size, dtype=bool)
            for n in names:
                d = ~equal_mask(old.column(n).combine_chunks(), new.column(n).combine_chunks())
                if d.any():
                    cols.add(n)
                    diff |= d
            if diff.any():
                mask = pa.array(diff)
                changed.append(keys[diff])
                s = slots[diff]
                old_parts.append((s, self.values.gather(s)))
                self._write_columns(s, new.filter(mask))
        if old_parts:
            s_all = np.concatenate([s for s, _t in old_parts])
            t_all = pa.concat_tables([t for _s, t in old_parts])
            s_u, first = np.unique(s_all, return_index=True)  # a slot's value before the first write
            self._pinfo = (s_u, t_all.take(pa.array(first)))
        if not changed:
            return _EMPTY, cols
        return unique(np.concatenate(changed)), cols

    def _write_columns(self, slots: np.ndarray, table: pa.Table) -> None:
        for n in table.column_names:
            self.values.columns[self.values.index[n]].write(slots, table.column(n).combine_chunks())

    def _gather(self, names: Sequence[str], keys: np.ndarray) -> dict[str, pa.Array]:
        names = list(dict.fromkeys(names))
        got = self.left.gather(names, keys)
        return {n: got.column(n).combine_chunks() for n in names}

    def _check_times(self, op: UpdateByOp, seg: np.ndarray, ts: np.ndarray, ok: np.ndarray,
                     order: Optional[np.ndarray] = None) -> None:
        """Deephaven requires a time-based operation's stamps not to go backwards within a bucket
        (rows without a stamp aside); `order`: the rows' order when they are not in it."""
        if order is not None:
            seg, ts, ok = seg[order], ts[order], ok[order]
        if op.kind == "rolling_group" and not ok.all():
            # Deephaven 42.7 fails (an internal error of its row sets) when a row without a stamp
            # comes before a stamped row of its bucket; rows without one at a bucket's end are fine
            last_ok = np.full(int(seg.max()) + 1 if seg.size else 0, -1, dtype=np.int64)
            np.maximum.at(last_ok, seg[ok], np.flatnonzero(ok))
            if (~ok & (np.arange(seg.size) < last_ok[seg])).any():
                raise OperationError(f"rolling_group over time (column {op.time_col!r}): a row without a stamp "
                                     f"comes before a stamped row of its bucket, which Deephaven 42.7 does "
                                     f"not compute")
        idx = np.flatnonzero(ok)
        if idx.size < 2:
            return
        s, t = seg[idx], ts[idx]
        back = (s[1:] == s[:-1]) & (t[1:] < t[:-1])
        if back.any():
            raise OperationError(f"Timestamp values in UpdateBy operators must not decrease (column "
                                 f"{op.time_col!r} goes from {int(t[:-1][back][0])} to {int(t[1:][back][0])} "
                                 f"in a bucket)")

    # -- scans ------------------------------------------------------------------------------------
    def _run_scans(self, ops: list[UpdateByOp], rows: _Rows, before: np.ndarray) -> dict[str, pa.Array]:
        need: list[str] = []
        for op in ops:
            need += [c for _o, c in op.pairs if c] + list(op.filter_columns) + ([op.time_col] if op.time_col else [])
        data = self._gather(need, rows.keys) if need else {}
        has_before = before >= 0
        bslots = np.full(before.size, -1, dtype=np.int64)
        if has_before.any():
            bslots[has_before] = self.slot_of.get(before[has_before])
        bdata: dict[str, pa.Array] = {}
        if any(op.kind == "delta" for op in ops) and has_before.any():
            bdata = self._gather([c for op in ops if op.kind == "delta" for _o, c in op.pairs], before[has_before])
        out: dict[str, pa.Array] = {}
        for op in ops:
            if op.kind == "cum_count_where":
                flag = _predicate(op, rows.keys.size, data)
                seed = np.where(has_before, self._get_state(op.pairs[0][0] + "/n", np.maximum(bslots, 0), np.int64), 0)
                n = K.seg_accumulate(np.add, flag.astype(np.int64), rows.pos) + seed[rows.seg]
                self._put_state(op.pairs[0][0] + "/n", self.slot_of.get(rows.keys), n)
                out[op.pairs[0][0]] = pa.array(n, type=pa.int64())
                continue
            ts = None
            if op.time_col is not None:
                tt = self.left.schema.field(op.time_col).type
                tv, tok = _values(data[op.time_col], tt)
                ts = (tv, tok)
                if op.behaviour("on_negative_time") == "throw":
                    pv, pok = np.zeros(before.size, dtype=np.int64), np.zeros(before.size, dtype=bool)
                    if has_before.any():
                        pv[has_before], pok[has_before] = _values(
                            self._gather([op.time_col], before[has_before])[op.time_col], tt)
                    # each tail after the stamp of the row before it
                    self._check_times(op, np.concatenate((np.arange(before.size), rows.seg)),
                                      np.concatenate((pv, tv)), np.concatenate((pok, tok)),
                                      order=np.lexsort((np.concatenate((np.zeros(before.size), 1 + rows.pos)),
                                                        np.concatenate((np.arange(before.size), rows.seg)))))
            for name, col in op.pairs:
                t = self.left.schema.field(col).type
                ft = self.out_schema.field(name).type
                seed_slots = np.maximum(bslots, 0)
                if op.kind == "fill":  # any type: the last non-null value, or the row before's output
                    arr = data[col]
                    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                    idx = K.last_index(valid, rows.pos)
                    seed = self.values.gather_column(name, seed_slots)
                    seed = pc.if_else(pa.array(has_before), seed, pa.nulls(len(seed), ft))
                    take = np.where(idx >= 0, idx, arr.__len__() + rows.seg)
                    out[name] = pa.concat_arrays([arr.cast(ft), seed.cast(ft)]).take(pa.array(take))
                    continue
                if op.kind in ("cum_min", "cum_max") and _is_string(t):
                    # from the row before's output (the extreme so far), over string codes
                    seed = self.values.gather_column(name, seed_slots)
                    both = pa.concat_arrays([data[col].cast(ft),
                                             pc.if_else(pa.array(has_before), seed, pa.nulls(len(seed), ft))])
                    codes, cv = _string_codes(both)
                    n = rows.keys.size
                    uf, ident = (np.minimum, codes.size) if op.kind == "cum_min" else (np.maximum, -1)
                    acc = K.seg_accumulate(uf, np.where(cv[:n], codes[:n], ident), rows.pos)
                    acc = uf(acc, np.where(cv[n:], codes[n:], ident)[rows.seg])
                    out[name] = _string_extreme(both, codes, acc, acc != ident)
                    continue
                x, xv = _values(data[col], t)
                if op.kind == "delta":
                    px = np.zeros(before.size, dtype=x.dtype)
                    pv = np.zeros(before.size, dtype=bool)
                    if has_before.any():
                        bx, bv = _values(bdata[col], t)
                        px[has_before], pv[has_before] = bx, bv
                    out[name] = _delta(op, x, xv, rows, px, pv, ft)
                    continue
                if op.kind in CUMULATIVE:
                    sv = self._get_state(name + "/v", seed_slots, x.dtype)
                    so = self._get_state(name + "/ok", seed_slots, bool) & has_before
                    v, ok = _cumulative(op.kind, x, xv, rows, sv, so)
                    slots = self.slot_of.get(rows.keys)
                    self._put_state(name + "/v", slots, v)
                    self._put_state(name + "/ok", slots, ok)
                    out[name] = _arrow(v, ok, ft)
                    continue
                st = {w: self._get_state(f"{name}/{w}", seed_slots, dt) for w, dt in _EM_STATE}
                st["ok"] = st["ok"] & has_before
                st["poison"] = st["poison"] & has_before
                res, new_state = _exponential(op, x, xv, rows, ts, st)
                slots = self.slot_of.get(rows.keys)
                for w, arr in new_state.items():
                    self._put_state(f"{name}/{w}", slots, arr)
                out[name] = _arrow(res[0], res[1], ft)
        return out

    # -- windows ----------------------------------------------------------------------------------
    def _run_prefix_windows(self, ops: list[UpdateByOp], G: np.ndarray, tail: _Rows, tpos: np.ndarray,
                            first_pos: np.ndarray) -> list[tuple[np.ndarray, dict[str, pa.Array]]]:
        """Tick windows of sums and counts from per-row prefix sums within the bucket (kept as
        state, double-double for floats): a window is the difference of two prefixes, each found
        through its row's position (`row_at`), so an appended row costs O(1) whatever the window.
        Recomputes the tail's prefixes (from the row before's) and the outputs of the tail and of
        the `fwd` rows before it, whose windows reach into it."""
        n_g = self.side.counts(G)
        results = []
        for op in ops:
            fwd, rev = op.fwd, op.rev
            # output rows: fwd rows before each tail, then the tail
            back = np.minimum(max(fwd, 0), first_pos)
            bpos = _ranges(first_pos - back, first_pos)
            bseg = np.repeat(np.arange(G.size), back)
            bkeys = self._get_state("#key", self.row_at.get(G[bseg] * _POS + bpos), np.int64)
            okeys = np.concatenate((bkeys, tail.keys))
            oseg = np.concatenate((bseg, tail.seg))
            opos = np.concatenate((bpos, tpos))
            need = [c for _o, c in op.pairs if c] + ([op.weight] if op.weight else []) + list(op.filter_columns)
            data = self._gather(need, tail.keys)
            hi_pos = np.minimum(opos + fwd, n_g[oseg] - 1)
            lo_pos = np.maximum(opos - rev + 1, 0)
            empty = lo_pos > hi_pos
            outs: dict[str, pa.Array] = {}
            for name, col in op.pairs:
                parts = _prefix_parts(op, col, data, self.left.schema, tail.keys.size)
                # prefixes of the tail rows, continuing from the row before each tail
                bslot = self._pslots(G, first_pos - 1)
                for part, (vals, kind) in parts.items():
                    key = f"{name}/{part}"
                    if kind == "i":
                        seed = np.where(bslot >= 0, self._get_state(key, np.maximum(bslot, 0), np.int64), 0)
                        pre = _seg_cumsum_int(vals, tail.pos) + seed[tail.seg]
                        if tail.keys.size:
                            self._put_state(key, self.slot_of.get(tail.keys), pre)
                    else:
                        sh = np.where(bslot >= 0, self._get_state(key + "h", np.maximum(bslot, 0), np.float64), 0.0)
                        sl = np.where(bslot >= 0, self._get_state(key + "l", np.maximum(bslot, 0), np.float64), 0.0)
                        ph, pl = _seg_cumsum_dd(vals, tail.pos, sh[tail.seg], sl[tail.seg])
                        if tail.keys.size:
                            slots = self.slot_of.get(tail.keys)
                            self._put_state(key + "h", slots, ph)
                            self._put_state(key + "l", slots, pl)
                # window sums: prefix(hi) - prefix(lo - 1)
                hs = self._pslots(G[oseg], hi_pos)
                ls = self._pslots(G[oseg], lo_pos - 1)
                sums = {}
                dd = {}
                for part, (_vals, kind) in parts.items():
                    key = f"{name}/{part}"
                    if kind == "i":
                        a = np.where(hs >= 0, self._get_state(key, np.maximum(hs, 0), np.int64), 0)
                        b = np.where(ls >= 0, self._get_state(key, np.maximum(ls, 0), np.int64), 0)
                        with np.errstate(over="ignore"):
                            sums[part] = np.where(empty, 0, a - b)
                    else:
                        ah = np.where(hs >= 0, self._get_state(key + "h", np.maximum(hs, 0), np.float64), 0.0)
                        al = np.where(hs >= 0, self._get_state(key + "l", np.maximum(hs, 0), np.float64), 0.0)
                        bh = np.where(ls >= 0, self._get_state(key + "h", np.maximum(ls, 0), np.float64), 0.0)
                        bl = np.where(ls >= 0, self._get_state(key + "l", np.maximum(ls, 0), np.float64), 0.0)
                        with np.errstate(invalid="ignore", over="ignore"):
                            dh, dl = _two_sum(ah, -bh)
                            dh = np.where(empty, 0.0, dh)
                            dl = np.where(empty, 0.0, dl + (al - bl))
                            sums[part] = dh + dl
                        dd[part] = (dh, dl)
                outs[name] = _prefix_result(op, sums, self.out_schema.field(name).type, dd)
            results.append((okeys, outs))
        return results

    def _pslots(self, g: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Slot of the row at position `pos` of bucket `g` (-1 for a negative position)."""
        out = np.full(pos.size, -1, dtype=np.int64)
        ok = pos >= 0
        if ok.any():
            out[ok] = self.row_at.get(g[ok] * _POS + pos[ok])
        return out

    def _rows_before(self, G: np.ndarray, start: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to `count` rows of each bucket of G just before row key `start`: (row keys, index in
        G), in order. Reads about as many index slots as rows it returns (a window widened until it
        holds `count` rows of the bucket or reaches the bucket's first row)."""
        m = self.side.members
        assert m is not None
        if count <= 0 or G.size == 0 or len(m) == 0:
            return _EMPTY, _EMPTY
        g1 = (G + 1).astype(np.uint64)
        q0 = np.where(start > 0, g1, G.astype(np.uint64))
        q1 = np.where(start > 0, (start - 1).astype(np.uint64), _U64_MAX)
        pred, _succ = m.locate([q0, q1])
        _p, gfirst = m.locate([G.astype(np.uint64), np.full(G.size, _U64_MAX)])
        live = (pred != NONE_LO) & (gfirst != NONE_HI)
        live[live] = pred[live] >= gfirst[live]
        q = np.flatnonzero(live)
        width = np.full(q.size, 2 * max(m.spacing, 1) * count + 16, dtype=np.int64)
        got_k: list[np.ndarray] = []
        got_w: list[np.ndarray] = []
        while q.size:
            lo = np.maximum(pred[q] - width + 1, gfirst[q])
            keys, which = m.keys_between(lo, pred[q])
            n = np.bincount(which, minlength=q.size)
            done = (n >= count) | (lo <= gfirst[q])
            take = done[which]
            got_k.append(keys[take])
            got_w.append(q[which[take]])
            q, width = q[~done], width[~done] * 4
        if not got_k:
            return _EMPTY, _EMPTY
        keys = np.concatenate(got_k)
        which = np.concatenate(got_w)
        order = np.lexsort((keys, which))
        keys, which = keys[order], which[order]
        # the last `count` of each bucket
        end = np.searchsorted(which, which, side="right")
        keep = end - np.arange(keys.size) <= count
        rows = m.words_at(keys[keep])[1].astype(np.int64)
        return rows, which[keep]

    def _run_tick_windows(self, ops: list[UpdateByOp], G: np.ndarray, start: np.ndarray, tail: _Rows
                          ) -> list[tuple[np.ndarray, dict[str, pa.Array]]]:
        """Tick windows: each bucket's rows from `start` on and the rows before them that the
        windows reach (fwd rows whose windows reach forward to the change, rev - 1 rows those read)."""
        reach_out = max(max(op.fwd, 0) for op in ops)
        reach_in = max(max(op.rev - 1, 0) for op in ops)
        bk, bseg = self._rows_before(G, start, reach_out + reach_in)
        keys = np.concatenate((bk, tail.keys))
        seg = np.concatenate((bseg, tail.seg))
        order = np.argsort(seg, kind="stable")  # before-rows first within each bucket, both in order
        keys, seg = keys[order], seg[order]
        if keys.size == 0:
            return []
        nbefore = np.bincount(bseg, minlength=G.size)
        pos = K.positions(seg)
        seg_len = np.bincount(seg, minlength=G.size)
        results = []
        for op in ops:
            out_from = np.maximum(nbefore[seg] - max(op.fwd, 0), 0)
            lo, hi = K.tick_windows(pos, seg_len[seg], op.rev, op.fwd)
            sel = np.flatnonzero(pos >= out_from)
            need = [c for _o, c in op.pairs if c] + ([op.weight] if op.weight else []) + list(op.filter_columns)
            data = self._gather(need, keys)
            outs: dict[str, pa.Array] = {}
            for name, col in op.pairs:
                ft = self.out_schema.field(name).type
                outs[name] = _rolling(op, col, data, self.left.schema, lo[sel], hi[sel], ft, keys.size,
                                      runs=seg[sel])
            results.append((keys[sel], outs))
        return results

    def _run_windows(self, ops: list[UpdateByOp], G: np.ndarray, start: np.ndarray
                     ) -> list[tuple[np.ndarray, dict[str, pa.Array]]]:
        g, keys = self.side.rows_of(G)
        if keys.size == 0:
            return []
        seg = np.searchsorted(G, g)
        pos = K.positions(seg)
        seg_start = np.flatnonzero(pos == 0)
        seg_len = np.diff(np.concatenate((seg_start, [keys.size])))
        # the first touched row of each bucket (flat index)
        first_idx = _first_at_least(seg, keys, start, G.size)
        results = []
        for op in ops:
            ts = ts_ok = None
            if op.time_col is not None:
                tv, tok = _values(self._gather([op.time_col], keys)[op.time_col],
                                  self.left.schema.field(op.time_col).type)
                ts, ts_ok = tv, tok
                self._check_times(op, seg, tv, tok)
            # rows whose output may change: from the first touched row back by the forward reach
            if op.time_col is None:
                out_from = np.maximum(first_idx - max(op.fwd, 0), seg_start)
                ctx_from = np.maximum(out_from - max(op.rev - 1, 0), seg_start)
            else:
                assert ts is not None and ts_ok is not None
                out_from, ctx_from = _time_reach(seg, ts, ts_ok, first_idx, seg_start, op.rev, op.fwd)
            # the flat rows [ctx_from, end] of each segment
            take = _ranges(ctx_from, seg_start + seg_len)
            sub_keys = keys[take]
            sub_seg = seg[take]
            sub_pos = K.positions(sub_seg)
            sub_len = np.bincount(sub_seg, minlength=G.size)[sub_seg]
            outmask = take >= out_from[seg[take]]
            if op.time_col is None:
                lo, hi = K.tick_windows(sub_pos, sub_len, op.rev, op.fwd)
            else:
                assert ts is not None and ts_ok is not None
                lo, hi = K.time_windows(sub_seg, ts[take], ts_ok[take], op.rev, op.fwd)
            need = [c for _o, c in op.pairs if c] + ([op.weight] if op.weight else []) + list(op.filter_columns)
            data = self._gather(need, sub_keys)
            outs: dict[str, pa.Array] = {}
            sel = np.flatnonzero(outmask)
            member = ts_ok[take] if ts_ok is not None else None
            for name, col in op.pairs:
                ft = self.out_schema.field(name).type
                outs[name] = _rolling(op, col, data, self.left.schema, lo[sel], hi[sel], ft,
                                      sub_keys.size, member, None if member is None else member[sel],
                                      runs=sub_seg[sel])
            results.append((sub_keys[sel], outs))
        return results


_EM_STATE = (("v", np.float64), ("ok", bool), ("ts", np.int64), ("mean", np.float64), ("poison", bool),
             ("two", bool))


_POS = np.int64(1) << 32  # bucket * _POS + position: the key of `row_at`
PREFIX_KINDS = ("rolling_sum", "rolling_avg", "rolling_count", "rolling_std", "rolling_wavg", "rolling_count_where")


def _prefix_parts(op: UpdateByOp, col: str, data: dict[str, pa.Array], schema: pa.Schema, n: int
                  ) -> dict[str, tuple[np.ndarray, str]]:
    """The per-row quantities whose prefix sums a window operation needs: name -> (values, "i"
    for exact int64 sums or "f" for double-double float sums). Floats: NaN and infinities are
    counted apart (their sums would poison every later window)."""
    kind = op.kind
    if kind == "rolling_count_where":
        return {"n": (_predicate(op, n, data).astype(np.int64), "i")}
    t = schema.field(col).type
    if kind == "rolling_count":  # any type: the values that are not null
        a = data[col]
        valid = np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if a.null_count else \
            np.ones(len(a), dtype=bool)
        return {"n": (valid.astype(np.int64), "i")}
    x, xv = _values(data[col], t)
    parts: dict[str, tuple[np.ndarray, str]] = {"n": (xv.astype(np.int64), "i")}
    if x.dtype.kind == "i":
        if kind == "rolling_wavg":
            assert op.weight is not None
            w, wv = _values(data[op.weight], schema.field(op.weight).type)
            both = xv & wv
            xf, wf = x.astype(np.float64), w.astype(np.float64)
            parts.update({"n": (both.astype(np.int64), "i"), "xw": (np.where(both, xf * wf, 0.0), "f"),
                          "w": (np.where(both, wf, 0.0), "f")})
            _special(parts, np.where(both, xf * wf, 0.0), "")
            _special(parts, np.where(both, wf, 0.0), "w")
            return parts
        parts["s"] = (np.where(xv, x, 0), "i")
        if kind == "rolling_std":
            xf = np.where(xv, x.astype(np.float64), 0.0)
            qh, ql = _two_prod(xf, xf)  # the squares exactly, as two doubles
            parts["q"] = (qh, "f")
            parts["qe"] = (ql, "f")
            parts["sf"] = (xf, "f")
        return parts
    if kind == "rolling_wavg":
        assert op.weight is not None
        w, wv = _values(data[op.weight], schema.field(op.weight).type)
        both = xv & wv
        wf = w.astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            xw = np.where(both, x * wf, 0.0)
        parts["n"] = (both.astype(np.int64), "i")
        _special(parts, xw, "")
        _special(parts, np.where(both, wf, 0.0), "w")
        return parts
    xs = np.where(xv, x, 0.0)
    _special(parts, xs, "")
    if kind == "rolling_std":
        fin = np.where(np.isfinite(xs), xs, 0.0)
        with np.errstate(over="ignore", invalid="ignore"):
            qh, ql = _two_prod(fin, fin)
        _special(parts, qh, "q")  # a square too large for a double counts as +inf
        parts["qe"] = (np.where(np.isfinite(qh), ql, 0.0), "f")
    return parts


def _special(parts: dict[str, tuple[np.ndarray, str]], v: np.ndarray, p: str) -> None:
    """Prefix parts of a float quantity: its finite sum, and counts of NaN, +inf and -inf."""
    parts[p + "nan"] = (np.isnan(v).astype(np.int64), "i")
    parts[p + "pinf"] = (np.isposinf(v).astype(np.int64), "i")
    parts[p + "ninf"] = (np.isneginf(v).astype(np.int64), "i")
    parts[p + "f"] = (np.where(np.isfinite(v), v, 0.0), "f")


def _with_special(sums: dict[str, np.ndarray], p: str) -> np.ndarray:
    """A float window sum with its NaN and infinities: NaN wins, +inf and -inf together give NaN."""
    s: np.ndarray = np.array(sums[p + "f"], dtype=np.float64, copy=True)
    nan, pinf, ninf = sums[p + "nan"] > 0, sums[p + "pinf"] > 0, sums[p + "ninf"] > 0
    s[pinf] = np.inf
    s[ninf] = -np.inf
    s[nan | (pinf & ninf)] = np.nan
    return s


def _prefix_result(op: UpdateByOp, sums: dict[str, np.ndarray], t: pa.DataType,
                   dd: Optional[dict[str, tuple[np.ndarray, np.ndarray]]] = None) -> pa.Array:
    """The window results from the window sums of the parts (`dd`: those sums as double-doubles,
    which rolling_std needs)."""
    kind = op.kind
    cnt = sums["n"]
    if kind in ("rolling_count", "rolling_count_where"):
        return pa.array(cnt, type=pa.int64())
    if kind == "rolling_wavg":
        with np.errstate(invalid="ignore", divide="ignore"):
            return _arrow(_with_special(sums, "") / _with_special(sums, "w"), cnt > 0, t)
    isint = "s" in sums
    if kind == "rolling_sum":
        return _arrow(sums["s"] if isint else _with_special(sums, ""), cnt > 0, t)
    total = sums["s"].astype(np.float64) if isint else _with_special(sums, "")
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / cnt
        if kind == "rolling_avg":
            return _arrow(mean, cnt > 0, t)
        assert dd is not None
        s1 = dd["sf"] if isint else dd["f"]
        s2 = _dd_add(dd["q"] if isint else dd["qf"], dd["qe"])
        var = _dd_var(cnt, s1, s2)
        if not isint:
            var = np.where(sums["qpinf"] > 0, np.nan, var)  # as Deephaven: an infinite sum of squares
        std = np.where(cnt > 1, np.sqrt(var), np.nan)  # as Deephaven: one value gives NaN
        if not isint:
            std = np.where(np.isfinite(total), std, np.nan)
    return _arrow(std, cnt > 0, t)


_SPLIT = 134217729.0  # 2**27 + 1: Dekker's split of a double into two 26-bit halves
_SPLIT_SAFE = 1e150   # beyond it the split overflows (and a square is not finite anyway)


def _two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a*b as hi + lo exactly (Dekker); lo is 0 where a factor is too large to split."""
    with np.errstate(over="ignore", invalid="ignore"):
        p = a * b
    safe = (np.abs(a) < _SPLIT_SAFE) & (np.abs(b) < _SPLIT_SAFE)
    a, b = np.where(safe, a, 0.0), np.where(safe, b, 0.0)
    ca, cb = _SPLIT * a, _SPLIT * b
    ah = ca - (ca - a)
    bh = cb - (cb - b)
    al, bl = a - ah, b - bh
    err = ((ah * bh - a * b) + ah * bl + al * bh) + al * bl
    return p, np.where(safe, err, 0.0)


def _dd_add(x: tuple[np.ndarray, np.ndarray], y: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    h, e = _two_sum(x[0], y[0])
    return h, e + x[1] + y[1]


def _dd_var(cnt: np.ndarray, s1: tuple[np.ndarray, np.ndarray], s2: tuple[np.ndarray, np.ndarray]
            ) -> np.ndarray:
    """Sample variance (n*S2 - S1^2) / (n*(n-1)) of windows with n values, value sum S1 and sum of
    squares S2, both double-doubles: the difference is taken in double-double, so that values far
    from zero and close together keep their digits (a sum of squares in one double loses them).
    As Deephaven, a difference S2 - S1^2/n within one ulp of S2 is taken as 0 (a window of one
    repeated value has variance exactly 0)."""
    n = cnt.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s1, s2 = _two_sum(*s1), _two_sum(*s2)  # normalised: a difference of prefixes may leave all in lo
        ah, al = _two_prod(n, s2[0])
        al = al + n * s2[1]
        bh, bl = _two_prod(s1[0], s1[0])
        bl = bl + 2.0 * s1[0] * s1[1]
        dh, dl = _two_sum(ah, -bh)
        num = dh + (dl + (al - bl))
        var: np.ndarray = num / (n * (n - 1.0))
        tiny = np.abs(num / n) <= np.spacing(np.abs(s2[0] + s2[1]))
    return np.where(tiny | (var < 0), 0.0, var)


def _seg_cumsum_int(v: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Cumulative sums within segments, exact in int64 (wrapping as Java's long)."""
    if v.size == 0:
        return v.astype(np.int64)
    with np.errstate(over="ignore"):
        c = np.cumsum(v.astype(np.int64))
        base = np.concatenate(([0], c[:-1]))[np.arange(v.size) - pos]
        out: np.ndarray = c - base
    return out


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a+b as hi + lo exactly (Knuth); infinities give NaN in lo, which callers leave out."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = a + b
        bb = s - a
        return s, (a - (s - bb)) + (b - bb)


def _seg_cumsum_dd(v: np.ndarray, pos: np.ndarray, seed_hi: np.ndarray, seed_lo: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative sums within segments as double-doubles (hi, lo) continuing from each row's
    segment seed: a sequential cumsum with its rounding errors summed beside it, so that the
    difference of two prefixes is right even far from zero."""
    if v.size == 0:
        return v.astype(np.float64), v.astype(np.float64)
    c = np.cumsum(v)
    prev = np.concatenate(([0.0], c[:-1]))
    _s, err = _two_sum(prev, v)
    e = np.cumsum(err)
    start = np.arange(v.size) - pos
    cb = np.concatenate(([0.0], c))[start]
    eb = np.concatenate(([0.0], e))[start]
    hi, lo = _two_sum(c, -cb)
    lo = lo + (e - eb)
    hi2, err2 = _two_sum(seed_hi, hi)
    return hi2, seed_lo + lo + err2


def _window_dd(v: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums of v[lo:hi+1] as double-doubles, from one double-double prefix of v (empty: 0)."""
    ph, pl = _seg_cumsum_dd(v, np.arange(v.size), np.zeros(v.size), np.zeros(v.size))
    ph, pl = np.concatenate(([0.0], ph)), np.concatenate(([0.0], pl))
    ok = hi >= lo
    b, a = np.where(ok, hi + 1, 0), np.where(ok, lo, 0)
    h, e = _two_sum(ph[b], -ph[a])
    return h, e + (pl[b] - pl[a])


def _search(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """For each i, the first index in [lo[i], hi[i]) whose value is at least bound[i] (hi[i] when
    none); values ascend within each range. A binary search per range, all ranges at once."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        go = lo < hi
        if not go.any():
            return lo
        mid = (lo + hi) // 2
        less = go & (values[np.minimum(mid, values.size - 1)] < bound)
        lo = np.where(less, mid + 1, lo)
        hi = np.where(go & ~less, mid, hi)


def _first_at_least(seg: np.ndarray, keys: np.ndarray, start: np.ndarray, nseg: int) -> np.ndarray:
    """Flat index of the first row of each segment whose key is at least its segment's start
    (the segment's end when none); keys ascend within a segment."""
    for_s = np.arange(nseg)
    return _search(keys, np.searchsorted(seg, for_s, side="left"), np.searchsorted(seg, for_s, side="right"), start)


def _ranges(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The concatenation of arange(a[i], b[i])."""
    n = np.maximum(b - a, 0)
    total = int(n.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(a - (np.cumsum(n) - n), n)
    out: np.ndarray = starts + np.arange(total, dtype=np.int64)
    return out


def _time_reach(seg: np.ndarray, ts: np.ndarray, ok: np.ndarray, first_idx: np.ndarray, seg_start: np.ndarray,
                rev: int, fwd: int) -> tuple[np.ndarray, np.ndarray]:
    """For time windows: the first flat row of each segment whose output may change (a window
    reaching the touched rows), and the first row those windows read."""
    nseg = seg_start.size
    out_from = seg_start.copy()
    ctx_from = seg_start.copy()
    # the stamp just before the first touched row (stamped rows only): outputs from there - fwd
    have = np.flatnonzero(ok)
    if have.size == 0:
        return out_from, ctx_from
    s_have = seg[have]
    t_have = ts[have]
    # last stamped row before first_idx in the same segment
    j = np.searchsorted(have, first_idx, side="left") - 1
    valid = (j >= 0)
    valid[valid] = s_have[j[valid]] == np.arange(nseg)[valid]
    bound = np.full(nseg, np.iinfo(np.int64).min, dtype=np.int64)
    bound[valid] = t_have[j[valid]] - max(fwd, 0)
    # first stamped row of the segment with stamp >= bound; unstamped rows before it are kept too
    for_s = np.arange(nseg)
    s_lo = np.searchsorted(s_have, for_s, side="left")
    s_hi = np.searchsorted(s_have, for_s, side="right")
    lo = _search(t_have, s_lo, s_hi, bound)
    first_out = np.where(lo < s_hi, have[np.minimum(lo, have.size - 1)], first_idx)
    out_from = np.maximum(seg_start, np.minimum(first_out, first_idx))
    # windows of those rows reach back to stamp - rev
    none = np.iinfo(np.int64).max
    tfirst = np.where(lo < s_hi, t_have[np.minimum(lo, have.size - 1)], none)
    lo2 = _search(t_have, s_lo, s_hi, np.where(tfirst == none, tfirst, tfirst - max(rev, 0)))
    first_ctx = np.where(lo2 < s_hi, have[np.minimum(lo2, have.size - 1)], out_from)
    ctx_from = np.maximum(seg_start, np.minimum(first_ctx, out_from))
    return out_from, ctx_from


def _predicate(op: UpdateByOp, n: int, data: dict[str, pa.Array]) -> np.ndarray:
    """The count_where filter of each row (a null result counts as false)."""
    if op.filters is None:
        return np.ones(n, dtype=bool)
    cols = {c: data[c] for c in op.filter_columns} if op.filter_columns else {"_": pa.nulls(n)}
    got = ds.dataset(pa.table(cols)).to_table(columns={"_v": op.filters}).column("_v").combine_chunks()
    return np.asarray(pc.fill_null(got, False).to_numpy(zero_copy_only=False), dtype=bool)


def _cumulative(kind: str, x: np.ndarray, xv: np.ndarray, rows: _Rows, seed: np.ndarray, seed_ok: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    pos, seg = rows.pos, rows.seg
    isint = x.dtype.kind == "i"
    anyv = K.seg_accumulate(np.logical_or, xv, pos) | seed_ok[seg]
    if kind == "fill":
        idx = K.last_index(xv, pos)
        got = idx >= 0
        v = np.where(got, x[np.maximum(idx, 0)], seed[seg])
        return v, got | seed_ok[seg]
    uf: np.ufunc
    ident: float
    if kind == "cum_sum":
        uf, ident = np.add, 0
    elif kind == "cum_prod":
        uf, ident = np.multiply, 1
    elif kind == "cum_min":
        uf, ident = np.minimum, (np.iinfo(np.int64).max if isint else np.inf)
    else:
        uf, ident = np.maximum, (np.iinfo(np.int64).min if isint else -np.inf)
    if isint or kind in ("cum_sum", "cum_prod"):
        xi = np.where(xv, x, ident).astype(x.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            acc = K.seg_accumulate(uf, xi, pos)
            sd = np.where(seed_ok, seed, ident).astype(x.dtype)[seg]
            return uf(sd, acc), anyv
    # as Deephaven's comparisons: a NaN is passed over, unless it is the bucket's first value,
    # which then stays (nothing compares below or above NaN)
    nan = xv & np.isnan(x)
    xi = np.where(xv & ~nan, x, ident)
    acc = K.seg_accumulate(uf, xi, pos)
    sd = np.where(seed_ok & ~np.isnan(seed), seed, ident)[seg]
    acc = uf(sd, acc)
    before = np.concatenate(([False], anyv[:-1])) & (pos > 0)
    first = xv & ~before & ~seed_ok[seg]  # the bucket's first value
    at = K.last_index(first, pos)
    stuck = (seed_ok & np.isnan(seed))[seg] | ((at >= 0) & nan[np.maximum(at, 0)])
    return np.where(stuck, np.nan, acc), anyv


def _delta(op: UpdateByOp, x: np.ndarray, xv: np.ndarray, rows: _Rows, px: np.ndarray, pv: np.ndarray,
           t: pa.DataType) -> pa.Array:
    """x minus the previous row's x in the bucket (the first row's previous: the row before the
    tail, `px`/`pv` per segment)."""
    pos, seg = rows.pos, rows.seg
    prev = np.empty_like(x)
    prev_ok = np.empty(x.size, dtype=bool)
    inner = pos > 0
    idx = np.flatnonzero(inner)
    prev[idx], prev_ok[idx] = x[idx - 1], xv[idx - 1]
    head = np.flatnonzero(~inner)
    prev[head], prev_ok[head] = px[seg[head]], pv[seg[head]]
    with np.errstate(over="ignore", invalid="ignore"):
        d = x - prev
    ok = xv & prev_ok
    mode = op.delta
    if mode == "value_dominates":
        d = np.where(xv & ~prev_ok, x, d)
        ok = xv
    elif mode == "zero_dominates":
        d = np.where(xv & ~prev_ok, 0, d)
        ok = xv
    return _arrow(d, ok, t)


def _exponential(op: UpdateByOp, x: np.ndarray, xv: np.ndarray, rows: _Rows,
                 ts: Optional[tuple[np.ndarray, np.ndarray]], st: dict[str, np.ndarray]
                 ) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, np.ndarray]]:
    """ema, ems, em_min, em_max, em_std over the rows, each segment continuing from its seed state
    `st` (per segment: v, ok, ts, mean, poison, two). As Deephaven: alpha = exp(-1/ticks) or
    exp(-dt/decay) with dt from the last row used; ema = a*prev + (1-a)*x, ems = a*prev + x,
    em_min/em_max = min/max(a*prev, x), em_std = sqrt(var) with var = a*(var + (1-a)*(x - ema)^2)
    (NaN until two values); the first value starts the state. A row with a null or NaN value, a
    null stamp or a stamp equal to the last used one is handled as its control says (skip: the
    output keeps the last value; reset: null output and a fresh start; poison: NaN from there on;
    throw: the table fails)."""
    n = x.size
    integral = x.dtype.kind == "i"
    x = x.astype(np.float64)
    seg = rows.seg
    isnan = xv & np.isnan(x)
    cls = {"on_null": ~xv, "on_nan": isnan}
    if ts is not None:
        tv, tok = ts
        cls["on_null_time"] = ~tok
    bad = np.zeros(n, dtype=bool)
    reset = np.zeros(n, dtype=bool)
    poison = np.zeros(n, dtype=bool)
    for what, rows_bad in cls.items():
        if not rows_bad.any():
            continue
        b = op.behaviour(what)
        if b == "throw":
            kind = {"on_null": "null value", "on_nan": "NaN value", "on_null_time": "null timestamp"}[what]
            raise OperationError(f"{op.kind}: encountered a {kind} (column {op.pairs[0][1]!r}) and its control "
                                 f"says to throw")
        bad |= rows_bad
        if b == "reset":
            reset |= rows_bad
        elif b == "poison" and what != "on_null":  # as Deephaven: a poisoned null is skipped
            poison |= rows_bad
    good = ~bad
    # chains: a segment, cut at each reset row (which itself has no state)
    cut = (rows.pos == 0) | reset
    chain = np.cumsum(cut) - 1
    cpos = K.positions(chain)
    chain_start = np.flatnonzero(cpos == 0)
    seeded_chain = (rows.pos[chain_start] == 0) & ~reset[chain_start]
    seeded = seeded_chain[chain] & st["ok"][seg]
    seed_ts = st["ts"][seg]
    # rows used: good values, and for time-based ops a stamp after the last used one
    if ts is not None:
        tv = ts[0]
        prev_good = K.last_index(good, cpos, inclusive=False)
        none = np.iinfo(np.int64).min
        last_t = np.where(prev_good >= 0, tv[np.maximum(prev_good, 0)], np.where(seeded, seed_ts, none))
        has_t = (prev_good >= 0) | seeded
        used = good & (~has_t | (tv > last_t))
        tie = good & has_t & (tv == last_t)
    else:
        used = good
        tie = np.zeros(n, dtype=bool)
    if op.kind == "em_std" or integral:  # as Deephaven: a value at the last one's time applies, with
        used = used | tie                   # alpha 1 (for integers and em_std; other floats skip it)
    if ts is not None and (poison.any() or (seeded_chain[chain] & st["poison"][seg]).any()):
        _refuse_unstamped_poison(op, ts[0], good, used, poison, seeded, cpos,
                                 seeded_chain[chain] & st["poison"][seg] & ~st["ok"][seg])
    prev_used = K.last_index(used, cpos, inclusive=False)
    has_prev = (prev_used >= 0) | seeded
    if ts is not None:
        tv = ts[0]
        t_prev = np.where(prev_used >= 0, tv[np.maximum(prev_used, 0)], seed_ts)
        dt = np.where(used & has_prev, tv - t_prev, 0).astype(np.float64)
        a = np.exp(-dt / float(op.decay_time))
    else:
        with np.errstate(divide="ignore"):  # as Deephaven: 0 ticks give alpha exp(-inf) = 0
            a = np.full(n, np.exp(np.float64(-1.0) / np.float64(op.decay_ticks)))
    start = used & ~has_prev
    step = used & has_prev
    y0 = np.where(seeded, st["v"][seg], 0.0)
    kind = op.kind
    with np.errstate(invalid="ignore", over="ignore"):
        if kind in ("ema", "ems", "em_std"):
            A = np.where(step, a, np.where(start, 0.0, 1.0))
            if kind == "ems":
                B = np.where(used, x, 0.0)
            else:
                B = np.where(step, (1 - a) * x, np.where(start, x, 0.0))
            if kind == "em_std":
                m0 = np.where(seeded, st["mean"][seg], 0.0)
                # rows after a fresh start do not read the seed (0 * seed + -0.0 would be +0.0)
                AA, BB, FF = K.linear_scan(A, B, cpos, start)
                mean = np.where(FF, BB, AA * _chain_seed(m0, chain_start, chain, cpos) + BB)
                mean_before = np.where(prev_used >= 0, mean[np.maximum(prev_used, 0)], m0)
                bv = np.where(step, a * (1 - a) * (x - mean_before) ** 2, 0.0)
                Av = np.where(step, a, np.where(start, 0.0, 1.0))
                AV, BV, _f = K.linear_scan(Av, bv, cpos, start)
                var = AV * _chain_seed(y0, chain_start, chain, cpos) + BV
                v, extra_mean = var, mean
            else:
                AA, BB, FF = K.linear_scan(A, B, cpos, start)
                v = np.where(FF, BB, AA * _chain_seed(y0, chain_start, chain, cpos) + BB)
                extra_mean = np.zeros(n)
        elif step.any() and not (step & (a != 0) & ~np.isnan(a)).any():
            # em_min/em_max with a decay of 0: what a step reads of the previous value is 0.0, -0.0 or
            # NaN (0 * an infinity), taken row by row as Deephaven does
            base = _chain_seed(y0, chain_start, chain, cpos)
            v = MM.zero_decay_extreme(kind == "em_min", x, a, start, step, cpos, base)
            extra_mean = np.zeros(n)
        else:
            big = np.inf if kind == "em_min" else -np.inf
            C = np.where(step, a, np.where(start, 0.0, 1.0))
            D = np.where(used, x, big)
            CC, DD, FF = _minmax_scan(C, D, cpos, np.minimum if kind == "em_min" else np.maximum, start, used)
            base = _chain_seed(y0, chain_start, chain, cpos)
            uf = np.minimum if kind == "em_min" else np.maximum
            v = np.where(FF, DD, uf(CC * base, DD))
            extra_mean = np.zeros(n)
    ok = K.seg_accumulate(np.logical_or, used, cpos) | seeded
    ok &= ~reset
    two_used = K.seg_accumulate(np.add, used.astype(np.int64), cpos) + np.where(seeded & st["two"][seg], 2,
                                                                                np.where(seeded, 1, 0))
    pois = K.seg_accumulate(np.logical_or, poison, cpos) | (seeded_chain[chain] & st["poison"][seg])
    last_used = K.last_index(used, cpos)
    t_last = np.where(last_used >= 0, ts[0][np.maximum(last_used, 0)] if ts is not None else 0,
                      np.where(seeded, seed_ts, 0))
    state = {"v": v, "ok": ok, "ts": t_last.astype(np.int64), "mean": extra_mean, "poison": pois,
             "two": two_used >= 2}
    if kind == "em_std":
        out = np.where(two_used >= 2, np.sqrt(np.maximum(v, 0.0)), np.nan)
        out = np.where(pois, np.nan, out)
        return (np.where(reset, np.nan, out), np.ones(n, dtype=bool)), state  # as Deephaven: a reset row is NaN
    out = np.where(pois, np.nan, v)
    return (out, ok | (pois & ~reset)), state


def _chain_seed(y0: np.ndarray, chain_start: np.ndarray, chain: np.ndarray, cpos: np.ndarray) -> np.ndarray:
    """The seed of each row's chain (y0 is per row; a chain's seed is its first row's)."""
    out: np.ndarray = y0[chain_start][chain]
    return out


def _refuse_unstamped_poison(op: UpdateByOp, tv: np.ndarray, good: np.ndarray, used: np.ndarray,
                             poison: np.ndarray, seeded: np.ndarray, cpos: np.ndarray,
                             seed_unstamped: np.ndarray) -> None:
    """As Deephaven 42.7: a time-decay state poisoned before its chain used any stamped value has no
    last stamp (Long.MIN_VALUE), and the next stamped value's time delta from it overflows to a
    negative one, which Deephaven refuses as a decreasing stamp (a stamp before 1970 does not
    overflow). OperationError there."""
    unstamped = poison & ~(K.seg_accumulate(np.logical_or, used, cpos) | seeded)
    after = (K.seg_accumulate(np.logical_or, unstamped, cpos) & ~unstamped) | seed_unstamped
    if (after & good & (tv >= 0)).any():
        raise OperationError(f"{op.kind}: Timestamp values in UpdateBy operators must not decrease (as Deephaven "
                             f"42.7 answers a NaN poisoning a bucket before any stamped value of it, followed by a "
                             f"stamped value; column {op.pairs[0][1]!r})")


def _minmax_scan(c: np.ndarray, d: np.ndarray, pos: np.ndarray, uf: np.ufunc, fresh: np.ndarray,
                 used: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For y[i] = uf(c[i] * y[i-1], d[i]) (c >= 0) within each segment, rows not `used` leaving y
    as it was: (C, D, F) with y[i] = D[i] where F (a fresh start at or before i) and y[i] =
    uf(C[i] * y0, D[i]) elsewhere (D is the identity of uf where no row was used). A c of 0 on a
    row that is not fresh multiplies literally, as Deephaven (0 * inf is NaN)."""
    C, D, F, E = c.copy(), d.copy(), fresh.astype(bool, copy=True), ~used
    if C.size == 0:
        return C, D, F
    dd = 1
    top = int(pos.max())
    with np.errstate(invalid="ignore", over="ignore"):
        while dd <= top:
            i = np.flatnonzero(pos >= dd)
            ci, di, cp, dp, keep, fp, ei, ep = C[i], D[i], C[i - dd], D[i - dd], F[i], F[i - dd], E[i], E[i - dd]
            C[i] = np.where(keep, ci, cp * ci)
            D[i] = np.where(keep | ep, di, np.where(ei, ci * dp, uf(ci * dp, di)))
            F[i] = keep | fp
            E[i] = ei & (ep | keep)
            dd *= 2
    return C, D, F


def _rolling(op: UpdateByOp, col: str, data: dict[str, pa.Array], schema: pa.Schema, lo: np.ndarray,
             hi: np.ndarray, t: pa.DataType, n: int, member: Optional[np.ndarray] = None,
             out_ok: Optional[np.ndarray] = None, runs: Optional[np.ndarray] = None) -> pa.Array:
    """A rolling operation over the windows [lo, hi] of the gathered rows; `member`: the rows that
    may be in a window (time windows leave out rows without a stamp), `out_ok`: the output rows
    that have a window at all (others are null); `runs`: the bucket of each output row (a bucket's
    first output row is where this cycle's computation of it starts)."""
    kind = op.kind
    inwin = np.ones(n, dtype=bool) if member is None else member
    has = np.ones(lo.size, dtype=bool) if out_ok is None else out_ok
    if kind == "rolling_count_where":
        flag = _predicate(op, n, data) & inwin
        return pa.array(K.window_count(flag, lo, hi), mask=~has, type=pa.int64())
    it = schema.field(col).type
    arr = data[col]
    if kind == "rolling_group":
        take = _ranges(lo, np.maximum(hi + 1, lo))
        take = take[inwin[take]]
        lengths = K.window_count(inwin, lo, hi)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
        lists = pa.ListArray.from_arrays(pa.array(offsets), arr.take(pa.array(take, type=pa.int64())), type=t)
        return lists if out_ok is None else pc.if_else(pa.array(has), lists, pa.nulls(len(lists), t))
    if kind == "rolling_formula":
        def leaf(agg: str) -> pa.Array:
            if agg == "median":
                x, xv = _values(arr, it)
                med, ok = F.window_median(x, xv & inwin, lo, hi)
                return pa.array(med, mask=~(ok & has), type=pa.float64())
            sub = replace(op, kind=F.AGGREGATIONS[agg], formula=None)
            # a formula's min and max are Deephaven's Numeric functions over the window, not the
            # rolling operator's walk (no runs)
            return _rolling(sub, col, data, schema, lo, hi, F.leaf_type(agg, it), n, member, out_ok,
                            None if agg in ("min", "max") else runs)
        return F.evaluate(op.formula, it, lo.size, leaf)
    if kind in ("rolling_min", "rolling_max") and _is_string(it):
        codes, cv = _string_codes(arr)
        uf, nothing = (np.minimum, codes.size) if kind == "rolling_min" else (np.maximum, -1)
        got = K.window_reduce(uf, np.where(cv & inwin, codes, nothing), lo, hi, nothing)
        return _string_extreme(arr, codes, got, (got != nothing) & has)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if arr.null_count else \
        np.ones(len(arr), dtype=bool)
    cnt = K.window_count(valid & inwin, lo, hi)
    if kind == "rolling_count":
        return pa.array(cnt, mask=~has, type=pa.int64())
    x, xv = _values(arr, it)
    xv = xv & inwin
    cnt = K.window_count(xv, lo, hi)
    isint = x.dtype.kind == "i"
    some = (cnt > 0) & has
    if kind in ("rolling_sum", "rolling_avg", "rolling_std"):
        xf = np.where(xv, x, 0)
        s = K.window_reduce(np.add, xf, lo, hi, 0)
        if not isint:
            s = s + 0.0  # as Deephaven's sums, which start from +0.0: a window of -0.0 sums to 0.0
        if kind == "rolling_sum":
            return _arrow(s, some, t)
        sf = K.window_reduce(np.add, np.where(xv, x.astype(np.float64), 0.0), lo, hi, 0.0) + 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sf / cnt
            if kind == "rolling_avg":
                return _arrow(mean, some, t)
            # as the prefix path: sums and the sum of squares as double-doubles
            fin = np.where(xv & np.isfinite(xf), xf, 0.0).astype(np.float64)
            qh, ql = _two_prod(fin, fin)
            big = np.isinf(qh)
            s1 = _window_dd(fin, lo, hi)
            s2 = _dd_add(_window_dd(np.where(big, 0.0, qh), lo, hi), _window_dd(np.where(big, 0.0, ql), lo, hi))
            var = _dd_var(cnt, s1, s2)
            var = np.where(K.window_count(big, lo, hi) > 0, np.nan, var)  # as Deephaven: an infinite sum
            std = np.where(cnt > 1, np.sqrt(var), np.nan)  # as Deephaven: one value gives NaN
            if not isint:
                std = np.where(np.isfinite(sf), std, np.nan)
        return _arrow(std, some, t)
    if kind == "rolling_prod":
        # as Deephaven: zeros are counted apart (a zero in the window gives +0.0, with an infinity NaN)
        xf = np.where(xv, x, 1).astype(np.float64)
        zero = xv & (xf == 0)
        p = K.window_reduce(np.multiply, np.where(zero, 1.0, xf), lo, hi, 1.0)
        zeros = K.window_count(zero, lo, hi) > 0
        with np.errstate(invalid="ignore"):
            p = np.where(zeros, np.where(np.isinf(p) | np.isnan(p), np.nan, 0.0), p)
        return _arrow(p, some, t)
    if kind in ("rolling_min", "rolling_max"):
        if not isint and runs is not None:  # floats: Deephaven's operator, NaN and MAX_VALUE as it has them
            big = float(np.finfo(np.float32 if t == pa.float32() else np.float64).max)
            vals, got = MM.float_extreme(kind == "rolling_min", x, xv, lo, hi, has, runs, big)
            return _arrow(vals, got, t)
        if kind == "rolling_min":
            ident = np.iinfo(np.int64).max if isint else np.inf
            r = K.window_reduce(np.minimum, np.where(xv, x, ident).astype(x.dtype), lo, hi, ident)
        else:
            ident = np.iinfo(np.int64).min if isint else -np.inf
            r = K.window_reduce(np.maximum, np.where(xv, x, ident).astype(x.dtype), lo, hi, ident)
        return _arrow(r, some, t)
    if kind == "rolling_wavg":
        assert op.weight is not None
        w, wv = _values(data[op.weight], schema.field(op.weight).type)
        both = xv & wv
        xw = np.where(both, x.astype(np.float64) * w.astype(np.float64), 0.0)
        ws = np.where(both, w.astype(np.float64), 0.0)
        num = K.window_reduce(np.add, xw, lo, hi, 0.0) + 0.0  # from +0.0, as Deephaven's sums
        den = K.window_reduce(np.add, ws, lo, hi, 0.0) + 0.0
        c2 = K.window_count(both, lo, hi)
        with np.errstate(invalid="ignore", divide="ignore"):
            return _arrow(num / den, (c2 > 0) & has, t)
    raise OperationError(f"unknown rolling operation {kind!r}")


def _update_by(graph: "UpdateGraph", name: str, parent: Table, ops: Sequence[UpdateByOp],
               by: Sequence[str] = ()) -> Table:
    return UpdateByTable(graph, name, parent, ops, by)


register_operation("update_by", _update_by)
