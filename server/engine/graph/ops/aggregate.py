"""agg_by: aggregations of the rows of each group (the distinct values of key columns), incremental.

One output row per group. Groups are found by hashing the key columns in bulk (`hash_columns`,
`KeyIndex`); a group gets its row key when it is first seen (groups first seen in one cycle in the
order of their first rows, groups of `initial_groups` first) and keeps it while it lives, so
the output never shifts: a group that empties is removed (unless `preserve_empty`) and one that
comes back soon is added at its old row key, as in Deephaven. Once many groups have emptied
(`GroupIds`: 1,024, or an eighth of the live ones) their ids and row keys go to new keys, lowest
first, from the cycle after the one that removed them, so that memory follows the live groups.
With no key columns there is one group, which (as in Deephaven) has a row only while the table
has rows, unless `preserve_empty`.

State (all numpy, indexed by group or by member slot):
- every parent row is a *member* with a slot; the slot holds the row's group and the values of the
  aggregated columns (a private `ColumnStore`), so removed and modified rows' old values are known
  without asking the parent;
- linear kinds (count, sum, abs_sum, avg, var, std, weighted_sum, weighted_avg) keep running sums
  per group: exact int64 sums for integers, for floats the sum of finite values with counts of
  NaN, +inf and -inf (so removing an infinity or a NaN gives the right answer back);
- the other kinds keep the members of each group in order (an `OrderIndex` of (group, row key)):
  first/last (and their row keys) are found with one ordered lookup per touched group; min and max
  merge added values into the group's value and read the group's members again only when a value
  that could be the extreme left it; median, percentile, distinct, count_distinct, unique,
  sorted_first/last and group read the members of the groups the cycle touched, never the table.

Each cycle's output update holds the groups that appeared, emptied or changed; a changed group is a
modification of the columns whose values changed (compared in bulk), with their previous values
kept for the cycle (`prev_gather`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.errors import OperationError, UnknownColumnError
from tickwire.server.engine.graph.aggspec import Agg
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, check_hashable, equal_mask, groups_of
from tickwire.server.engine.graph.group_ids import GroupIds
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import (
    _EMPTY,
    _evaluate,
    _Op,
    _unregistered_on_error,
    expression_columns,
    shifted_rows,
)
from tickwire.server.engine.graph.ops.join_keys import GroupHints, group_edges, group_members, joined
from tickwire.server.engine.graph.order import MEMBERS_BUDGET, OrderIndex
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["Agg", "AggregateTable", "KINDS"]

LINEAR = frozenset({"count", "count_where", "sum", "abs_sum", "avg", "var", "std", "weighted_sum", "weighted_avg"})
#: partition: Deephaven's column of per-group tables, which reach a client as the text "QueryTable"
CONSTANT = frozenset({"partition"})
ORDERED = frozenset({"min", "max", "first", "last", "first_row_key", "last_row_key", "median", "percentile",
                     "count_distinct", "distinct", "unique", "sorted_first", "sorted_last", "group"})
KINDS = LINEAR | ORDERED | CONSTANT
#: kinds whose value needs the group's members read again when any of them changes
_RESCAN = frozenset({"median", "percentile", "count_distinct", "distinct", "unique", "sorted_first",
                     "sorted_last", "group"})


_VECTORS = {pa.int8(): "Byte", pa.int16(): "Short", pa.int32(): "Int", pa.int64(): "Long", pa.float32(): "Float",
            pa.float64(): "Double"}


_PARTITION_TYPE = b"io.deephaven.engine.table.impl.QueryTable"


def _vector_type(t: pa.DataType) -> bytes:
    """The Deephaven vector class of a list of `t` (what distinct and group give in Deephaven)."""
    return f"io.deephaven.vector.{_VECTORS.get(t, 'Object')}Vector".encode()


def _is_int(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t))


def _is_float(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t))


def _is_num(t: pa.DataType) -> bool:
    return _is_int(t) or _is_float(t)


def averages(a: Agg, t: pa.DataType) -> bool:
    """Whether a median/percentile averages the two middle values of an evenly divided group: as
    Deephaven, only with `average_evenly_divided` and for int, long, float and double columns
    (byte and short columns, like other types, take a value of the group). A formula's median
    (`wide`) averages every numeric type."""
    if a.wide:
        return _is_num(t)
    return bool(a.average_evenly_divided) and t in (pa.int32(), pa.int64(), pa.float32(), pa.float64())


def result_type(a: Agg, t: Optional[pa.DataType], other: Optional[pa.DataType]) -> pa.DataType:
    """The output type of `a` on an input of type `t` (weight/sort column of type `other`), or
    OperationError naming what cannot be aggregated so."""
    k = a.kind

    def refuse() -> OperationError:
        return OperationError(f"{k} cannot aggregate column {a.column!r} of type {t}")
    if k in ("count", "count_where", "count_distinct", "first_row_key", "last_row_key"):
        return pa.int64()
    if k == "partition":
        return pa.string()
    assert t is not None
    if k in ("sum", "abs_sum"):
        if _is_int(t) or pa.types.is_boolean(t):
            return pa.int64()
        if _is_float(t):
            return pa.float32() if t == pa.float32() and not a.wide else pa.float64()
        raise refuse()
    if k in ("avg", "var", "std"):
        if _is_num(t):
            return pa.float64()
        raise refuse()
    if k in ("weighted_sum", "weighted_avg"):
        if not (_is_num(t) and other is not None and _is_num(other)):
            raise OperationError(f"{k} needs numeric value and weight columns: {a.column!r} is {t}, "
                                 f"weight {a.other!r} is {other}")
        if k == "weighted_sum" and _is_int(t) and _is_int(other):
            return pa.int64()
        return pa.float64()
    if k in ("min", "max", "median", "percentile"):
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise refuse()
        if k in ("median", "percentile") and averages(a, t):
            return t if _is_float(t) and not a.wide else pa.float64()
        return t
    if k in ("first", "last", "unique", "sorted_first", "sorted_last"):
        return t
    if k in ("distinct", "group"):
        return pa.list_(t)
    raise OperationError(f"unknown aggregation {k!r}")


# -- per-row contributions of the linear kinds ----------------------------------------------------

def _scatter_add(target: np.ndarray, gids: np.ndarray, values: Union[int, np.ndarray]) -> None:
    """target[gids] += values, repeated indices summed (np.add.at for small batches; a bincount, or
    for integers a sort and reduceat, for large ones: np.add.at is slow on millions of rows)."""
    values = np.asarray(values)
    if gids.size < 4096:
        np.add.at(target, gids, values)
        return
    if values.ndim == 0:
        values = np.full(gids.size, values, dtype=np.int64 if values.dtype.kind in "biu" else values.dtype)
    if target.dtype.kind == "f":
        target += np.bincount(gids, weights=values.astype(np.float64), minlength=target.size)[:target.size]
        return
    order = np.argsort(gids, kind="stable")
    g = gids[order]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    target[g[starts]] += np.add.reduceat(values.astype(np.int64)[order], starts)


def _floats(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values as float64 with nulls as 0, validity)."""
    valid = np.ones(len(a), dtype=bool) if a.null_count == 0 else a.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(a.type):
        a = a.cast(pa.int8())
    v = a.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64) if a.null_count else \
        a.to_numpy(zero_copy_only=False).astype(np.float64)
    return v, valid


def _ints(a: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    valid = np.ones(len(a), dtype=bool) if a.null_count == 0 else a.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(a.type):
        a = a.cast(pa.int8())
    v = (a.fill_null(0) if a.null_count else a).to_numpy(zero_copy_only=False).astype(np.int64)
    return v, valid


class _Linear:
    """Running per-group sums for one linear aggregation."""

    def __init__(self, a: Agg, t: pa.DataType, other: Optional[pa.DataType], cap: int):
        self.a = a
        self.rt = result_type(a, t, other)
        # a formula's avg (wide) sums longs as doubles, in row order, as Deephaven's avg(vector) does
        self.exact = a.kind in ("sum", "abs_sum", "avg") and (_is_int(t) or pa.types.is_boolean(t)) \
            and not (a.wide and a.kind == "avg") or \
            (a.kind == "weighted_sum" and _is_int(t) and other is not None and _is_int(other))
        sp = ["nan", "pinf", "ninf", "nz"]
        names = {"count": ["n"], "count_where": ["n"],
                 "sum": ["n", "s", *sp], "abs_sum": ["n", "s", *sp], "avg": ["n", "s", *sp],
                 "var": ["n", "s", "s2", "nan", "inf", "nz"], "std": ["n", "s", "s2", "nan", "inf", "nz"],
                 "weighted_sum": ["n", "s", "w", "nz", "bad"], "weighted_avg": ["n", "s", "w", "nz", "bad"]}[a.kind]
        ints = {"n", "inf", "bad", *sp}
        self.state = {n: np.zeros(cap, dtype=np.int64 if n in ints
                                  or (self.exact and n in ("s",)) else np.float64) for n in names}

    def grow(self, cap: int) -> None:
        for n, arr in self.state.items():
            if arr.size < cap:
                new = np.zeros(cap, dtype=arr.dtype)
                new[:arr.size] = arr
                self.state[n] = new

    def reset(self, groups: np.ndarray) -> None:
        for arr in self.state.values():
            arr[groups] = 0

    def add(self, gids: np.ndarray, rows: pa.Table, sign: int) -> None:
        """Adds (sign 1) or takes away (sign -1) the contributions of `rows` to their groups."""
        if gids.size == 0:
            return
        a, st = self.a, self.state
        if a.kind == "count":
            _scatter_add(st["n"], gids, sign)
            return
        if a.kind == "count_where":
            hit = _evaluate(rows, [a.where], ["_"]).column(0).combine_chunks()
            _scatter_add(st["n"], gids, sign * hit.fill_null(False).to_numpy(zero_copy_only=False).astype(np.int64))
            return
        col = rows.column(a.column).combine_chunks()
        if a.kind in ("weighted_sum", "weighted_avg"):
            wcol = rows.column(a.other).combine_chunks()
            if self.exact:
                x, xv = _ints(col)
                w, wv = _ints(wcol)
                ok = xv & wv
                _scatter_add(st["n"], gids, sign * ok)
                _scatter_add(st["s"], gids, sign * np.where(ok, x * w, 0))
                _scatter_add(st["w"], gids, sign * np.where(ok, w, 0))
                return
            x, xv = _floats(col)
            w, wv = _floats(wcol)
            ok = xv & wv
            # as Deephaven: a NaN or infinite value makes the group's result NaN (even with a null
            # weight), and so does a NaN or infinite weight
            bad = (xv & ~np.isfinite(x)) | (ok & ~np.isfinite(w))
            use = ok & ~bad
            with np.errstate(all="ignore"):
                p = np.where(use, x * w, 0.0)
            _scatter_add(st["bad"], gids, sign * bad)
            _scatter_add(st["nz"], gids, sign * (p != 0))
            _scatter_add(st["s"], gids, sign * p)
            _scatter_add(st["w"], gids, sign * np.where(use, w, 0.0))
            _scatter_add(st["n"], gids, sign * ok)
            return
        if self.exact:
            x, ok = _ints(col)
            if a.kind == "abs_sum":
                x = np.abs(x)
            _scatter_add(st["n"], gids, sign * ok)
            _scatter_add(st["s"], gids, sign * np.where(ok, x, 0))
            return
        x, ok = _floats(col)
        if a.kind == "abs_sum":
            x = np.abs(x)
        _scatter_add(st["n"], gids, sign * ok)
        if a.kind in ("var", "std"):
            fin = np.isfinite(x)
            _scatter_add(st["nan"], gids, sign * (ok & np.isnan(x)))
            _scatter_add(st["inf"], gids, sign * (ok & np.isinf(x)))
            xf = np.where(ok & fin, x, 0.0)
            _scatter_add(st["nz"], gids, sign * (xf != 0))
            _scatter_add(st["s"], gids, sign * xf)
            _scatter_add(st["s2"], gids, sign * xf * xf)
            return
        self._add_special(gids, x, ok, sign, st)

    @staticmethod
    def _add_special(gids: np.ndarray, x: np.ndarray, ok: np.ndarray, sign: int, st: dict[str, np.ndarray]) -> None:
        """Adds finite values to sum `s`, counting NaN, +inf and -inf apart."""
        fin = np.isfinite(x)
        _scatter_add(st["nan"], gids, sign * (ok & np.isnan(x)))
        _scatter_add(st["pinf"], gids, sign * (ok & (x == np.inf)))
        _scatter_add(st["ninf"], gids, sign * (ok & (x == -np.inf)))
        _scatter_add(st["nz"], gids, sign * (ok & fin & (x != 0)))
        _scatter_add(st["s"], gids, sign * np.where(ok & fin, x, 0.0))

    @staticmethod
    def _total(s: np.ndarray, nan: np.ndarray, pinf: np.ndarray, ninf: np.ndarray, nz: np.ndarray) -> np.ndarray:
        """A float sum from its finite part and its counts of NaN and infinities (IEEE rules); a
        sum of only zeros is exactly zero (what earlier values left behind in rounding is dropped)."""
        total = np.where(nz > 0, s, 0.0)
        total = np.where(pinf > 0, np.inf, total)
        total = np.where(ninf > 0, -np.inf, total)
        return np.where((nan > 0) | ((pinf > 0) & (ninf > 0)), np.nan, total)

    def values(self, groups: np.ndarray, rows: np.ndarray) -> pa.Array:
        """The aggregation's value for `groups` (`rows`: each group's row count)."""
        a, st = self.a, self.state
        if a.kind in ("count", "count_where"):
            return pa.array(st["n"][groups], pa.int64())
        n = st["n"][groups]
        none = n == 0
        if self.exact and a.kind == "avg":  # as Deephaven: the exact (wrapping) long sum, divided
            with np.errstate(all="ignore"):
                return pa.array(st["s"][groups] / n, pa.float64(), mask=none)
        if self.exact:  # a long equal to Deephaven's null value (-2^63) reads as null there too
            sums = st["s"][groups]
            return pa.array(sums, pa.int64(), mask=none | (sums == np.iinfo(np.int64).min))
        if a.kind in ("weighted_sum", "weighted_avg"):
            bad = st["bad"][groups] > 0
            with np.errstate(all="ignore"):
                total = np.where(st["nz"][groups] > 0, st["s"][groups], 0.0)
                if a.kind == "weighted_avg":
                    total = total / st["w"][groups]
            return pa.array(np.where(bad, np.nan, total), pa.float64(), mask=none & ~bad)
        s = st["s"][groups]
        if a.kind in ("var", "std"):
            nf = n.astype(np.float64)
            with np.errstate(all="ignore"):
                nz = st["nz"][groups] > 0
                s, s2 = np.where(nz, s, 0.0), np.where(nz, st["s2"][groups], 0.0)
                if a.wide:  # Deephaven's var(vector): no difference within an ulp of the sum of squares,
                    delta = s2 - s * (s / nf)  # NaN once a sum overflows
                    var = np.where(np.abs(delta / np.spacing(np.abs(s2))) > 1.0, delta / (nf - 1), 0.0)
                    var = np.where(np.isfinite(s) & np.isfinite(s2), var, np.nan)
                else:
                    var = (s2 - s * s / nf) / (nf - 1)
                var = np.where(var < 0, 0.0, var)
                var = np.where(n > 1, var, np.nan)
                var = np.where((st["nan"][groups] > 0) | (st["inf"][groups] > 0) | ~np.isfinite(var), np.nan, var)
                out = np.sqrt(var) if a.kind == "std" else var
            return pa.array(out, pa.float64(), mask=none)
        total = self._total(s, st["nan"][groups], st["pinf"][groups], st["ninf"][groups], st["nz"][groups])
        if a.kind == "avg":
            with np.errstate(all="ignore"):
                total = total / n
        out = pa.array(total, pa.float64(), mask=none)
        return out if self.rt == pa.float64() else out.cast(self.rt)


# -- the ordered kinds, computed from a group's members --------------------------------------------

def _sort_words(a: pa.Array) -> np.ndarray:
    """An int64/float64 numpy array whose order is `a`'s order for fixed-width types (nulls not
    meaningful), or the dense rank of each value for other types."""
    t = a.type
    out: np.ndarray
    if pa.types.is_boolean(t):
        out = a.fill_null(False).cast(pa.int8()).to_numpy(zero_copy_only=False).astype(np.int64)
        return out
    if _is_int(t):
        out = a.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return out
    if _is_float(t):
        out = a.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float64)
        return out
    if pa.types.is_temporal(t):
        storage = pa.int32() if t.bit_width == 32 else pa.int64()
        out = a.view(storage).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return out
    # strings and others: rank through Arrow's sort
    order = pc.array_sort_indices(a, null_placement="at_start").to_numpy()
    ranks = np.empty(len(a), dtype=np.int64)
    sorted_vals = a.take(pa.array(order))
    same = np.zeros(len(a), dtype=bool)
    if len(a) > 1:
        same[1:] = equal_mask(sorted_vals.slice(1), sorted_vals.slice(0, len(a) - 1))
    ranks[order] = np.cumsum(~same) - 1
    return ranks


def _segments(gids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For gids sorted: (distinct groups, start of each, count of each)."""
    if gids.size == 0:
        return _EMPTY, _EMPTY, _EMPTY
    start = np.flatnonzero(np.concatenate(([True], gids[1:] != gids[:-1])))
    counts = np.diff(np.append(start, gids.size))
    return gids[start], start, counts


def _ordered_values(a: Agg, t: pa.DataType, groups: np.ndarray, gids: np.ndarray, pkeys: np.ndarray,
                    rows: pa.Table) -> pa.Array:
    """The value of ordered aggregation `a` for each of `groups` (sorted), from the members
    `gids`/`pkeys`/`rows` sorted by (group, row key) (every group of `groups` may or may not
    have members: those without get the empty value)."""
    rt = result_type(a, t, rows.schema.field(a.other).type if a.other else None)
    n = groups.size
    col = rows.column(a.column).combine_chunks() if a.column else None
    pos = np.searchsorted(groups, gids)
    if a.kind in ("group",):
        assert col is not None
        counts = np.bincount(pos, minlength=n)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), col).cast(rt)
    assert col is not None
    if len(col) == 0:  # no group has members
        return pa.nulls(n, rt)
    valid = np.ones(len(col), dtype=bool) if col.null_count == 0 else col.is_valid().to_numpy(zero_copy_only=False)
    if a.kind in ("sorted_first", "sorted_last"):
        scol = rows.column(a.other).combine_chunks()
        sw = _sort_words(scol)
        snull = scol.is_null().to_numpy(zero_copy_only=False)
        # nulls first ascending; ties in row order
        order = np.lexsort((np.arange(len(col)), sw, ~snull, pos))
        g_s = pos[order]
        pick = np.full(n, -1, dtype=np.int64)
        if a.kind == "sorted_first":
            _, first_i = np.unique(g_s, return_index=True)
            pick[np.unique(g_s)] = order[first_i]
        else:
            last_i = np.flatnonzero(np.append(g_s[1:] != g_s[:-1], True))
            pick[g_s[last_i]] = order[last_i]
        return _take_or_null(col, pick)
    # the kinds over values: nulls dropped unless counted
    w = _sort_words(col)
    isnan = np.isnan(w) if w.dtype == np.float64 else np.zeros(w.size, dtype=bool)
    if a.kind in ("min", "max", "median", "percentile"):
        # as Deephaven: a NaN makes the group's value NaN; nulls are skipped
        nan_g = np.bincount(pos[valid & isnan], minlength=n) > 0
        keep = valid & ~isnan
        idx = np.flatnonzero(keep)
        order = idx[np.lexsort((w[idx], pos[idx]))]
        g_s = pos[order]
        ug, st, cnt = _segments(g_s)
        pick = np.full(n, -1, dtype=np.int64)
        if a.kind in ("min", "max"):
            pick[ug] = order[st] if a.kind == "min" else order[st + cnt - 1]
            return _nan_where(_take_or_null(col, pick), nan_g)
        p = 0.5 if a.kind == "median" else float(a.percentile)
        if averages(a, t):
            # Deephaven's rule: the value at floor(p * (n - 1)), averaged with the next one when
            # that splits the group into two equal halves
            lo_i = np.floor((cnt - 1) * p).astype(np.int64)
            pair = (cnt % 2 == 0) & (lo_i == cnt // 2 - 1)
            hi_i = np.where(pair, lo_i + 1, lo_i)
            vals = w.astype(np.float64)
            lo_v, hi_v = vals[order[st + lo_i]], vals[order[st + hi_i]]
            out = np.zeros(n, dtype=np.float64)
            mask = np.ones(n, dtype=bool)
            out[ug] = np.where(pair, (lo_v + hi_v) / 2, lo_v)
            mask[ug] = False
            out[nan_g] = np.nan
            mask[nan_g] = False
            return pa.array(out, pa.float64(), mask=mask).cast(rt)
        k = np.floor((cnt - 1) * p + 0.5).astype(np.int64)  # Deephaven's position without averaging
        pick[ug] = order[st + np.minimum(k, cnt - 1)]
        return _nan_where(_take_or_null(col, pick), nan_g)
    # distinct values per group: as in Deephaven, NaN is a value only when nulls are counted too
    keep = (valid & (~isnan | a.include_nulls)) | (~valid & a.include_nulls)
    idx = np.flatnonzero(keep)
    nullrank = np.where(valid, 1, 0)
    order = idx[np.lexsort((np.arange(len(col))[idx], w[idx], nullrank[idx], pos[idx]))]
    g_s = pos[order]
    wv, nv = w[order], nullrank[order]
    new = np.ones(order.size, dtype=bool)
    if order.size > 1:
        same_v = (wv[1:] == wv[:-1]) | (np.isnan(wv[1:]) & np.isnan(wv[:-1])) if w.dtype == np.float64 else \
            wv[1:] == wv[:-1]
        same_v = same_v & (nv[1:] == nv[:-1])
        same_v |= (nv[1:] == 0) & (nv[:-1] == 0)
        new[1:] = (g_s[1:] != g_s[:-1]) | ~same_v
    first_of = order[new]
    g_f = g_s[new]
    counts = np.bincount(g_f, minlength=n)
    if a.kind == "count_distinct":  # a group without values counts null, as in Deephaven
        return pa.array(counts.astype(np.int64), pa.int64(), mask=counts == 0)
    if a.kind == "distinct":  # likewise null, not an empty list
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
        lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), col.take(pa.array(first_of)),
                                         mask=pa.array(counts == 0))
        return lists.cast(rt)
    # unique: the one distinct value, else null (or non_unique)
    pick = np.full(n, -1, dtype=np.int64)
    one = counts == 1
    gi = np.flatnonzero(one)
    fpos = np.searchsorted(g_f, gi)
    pick[gi] = first_of[fpos]
    out = _take_or_null(col, pick)
    if a.non_unique is not None and (counts > 1).any():
        fill = pa.array([a.non_unique] * n, type=out.type)
        out = pc.if_else(pa.array(counts > 1), fill, out)
    return out


def _nan_where(values: pa.Array, nan: np.ndarray) -> pa.Array:
    """`values` with NaN for the groups flagged in `nan` (floating values only)."""
    if not nan.any():
        return values
    return pc.if_else(pa.array(nan), pa.scalar(float("nan"), values.type), values)


def _take_or_null(col: pa.Array, pick: np.ndarray) -> pa.Array:
    """col[pick] with null where pick < 0."""
    if pick.size == 0:
        return col.slice(0, 0)
    miss = pick < 0
    out = col.take(pa.array(np.where(miss, 0, pick), pa.int64())) if len(col) else \
        pa.nulls(pick.size, col.type)
    if miss.any() and len(col):
        out = pc.if_else(pa.array(miss), pa.nulls(pick.size, col.type), out)
    return out


# -- median and percentile: each group's values kept sorted -------------------------------------

def _slab_storage(t: pa.DataType) -> Optional[np.dtype]:
    """The numpy type a column's values are kept sorted in (None: a type kept another way)."""
    if pa.types.is_floating(t):
        return np.dtype(np.float64)
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_timestamp(t) or pa.types.is_date(t) \
            or pa.types.is_time(t) or pa.types.is_duration(t):
        return np.dtype(np.int64)
    return None


def _slab_values(a: pa.Array, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values in `dtype`, valid, NaN) of an array."""
    valid = a.is_valid().to_numpy(zero_copy_only=False) if a.null_count else np.ones(len(a), dtype=bool)
    t = a.type
    if pa.types.is_boolean(t):
        a = a.cast(pa.int8())
    elif pa.types.is_temporal(t):
        a = a.view(pa.int32() if t.bit_width == 32 else pa.int64())
    v = (a.fill_null(0) if a.null_count else a).to_numpy(zero_copy_only=False).astype(dtype)
    nan = np.isnan(v) & valid if dtype.kind == "f" else np.zeros(v.size, dtype=bool)
    return v, valid, nan


def _ragged(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """The positions starts[i] .. starts[i] + lens[i] - 1 of every i, in order."""
    total = int(lens.sum())
    if total == 0:
        empty: np.ndarray = _EMPTY.copy()
        return empty
    first = np.cumsum(lens) - lens
    idx: np.ndarray = np.repeat(starts - first, lens) + np.arange(total, dtype=np.int64)
    return idx


def _seg_search(vals: np.ndarray, lo: np.ndarray, hi: np.ndarray, v: np.ndarray, right: bool) -> np.ndarray:
    """For each query, the insertion point of v[i] in the sorted segment vals[lo[i]:hi[i]]."""
    lo, hi = lo.copy(), hi.copy()
    last = max(vals.size - 1, 0)
    while True:
        active = lo < hi
        if not active.any():
            return lo
        mid = (lo + hi) // 2
        x = vals[np.minimum(mid, last)]
        step = (x <= v) if right else (x < v)
        lo = np.where(active & step, mid + 1, lo)
        hi = np.where(active & ~step, mid, hi)


class _SortedSlabs:
    """The non-null, non-NaN values of one column for every group, each group's kept sorted in its
    own region of one array (with room to grow; a group that outgrows it moves to the end, and the
    array is compacted when moves have left too much unused). A cycle reads and rewrites only the
    regions of the groups it changes (their values are copied, never sorted again), so a median
    costs the sizes of the changed groups in copies plus O(log) searches per changed row."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.vals = np.zeros(1024, dtype=dtype)
        self.end = 0
        self.off = np.zeros(1024, dtype=np.int64)
        self.cap = np.zeros(1024, dtype=np.int64)
        self.cnt = np.zeros(1024, dtype=np.int64)
        self.nan = np.zeros(1024, dtype=np.int64)

    def grow(self, groups: int) -> None:
        for name in ("off", "cap", "cnt", "nan"):
            old = getattr(self, name)
            if old.size < groups:
                new = np.zeros(max(groups, 2 * old.size), dtype=np.int64)
                new[:old.size] = old
                setattr(self, name, new)

    def apply(self, rem: list[tuple[np.ndarray, pa.Array]], add: list[tuple[np.ndarray, pa.Array]]) -> None:
        """Values leave (`rem`) and join (`add`) groups: lists of (groups, values)."""
        def split(parts: list[tuple[np.ndarray, pa.Array]]) -> tuple[np.ndarray, np.ndarray]:
            gs, vs = [_EMPTY], [np.zeros(0, dtype=self.dtype)]
            for g, a in parts:
                v, valid, nan = _slab_values(a, self.dtype)
                if nan.any():
                    np.add.at(self.nan, g[nan], -1 if parts is rem else 1)
                keep = valid & ~nan
                gs.append(g[keep])
                vs.append(v[keep])
            return np.concatenate(gs), np.concatenate(vs)
        rg, rv = split(rem)
        ag, av = split(add)
        if rg.size == 0 and ag.size == 0:
            return
        T = unique(np.concatenate((rg, ag)))
        lens = self.cnt[T]
        cur = self.vals[_ragged(self.off[T], lens)]
        starts = np.cumsum(lens) - lens
        if rg.size:  # positions of the leaving values (equal values: consecutive ones)
            o = np.lexsort((rv, rg))
            rg, rv = rg[o], rv[o]
            si = np.searchsorted(T, rg)
            pos = _seg_search(cur, starts[si], starts[si] + lens[si], rv, right=False)
            dup = np.zeros(rg.size, dtype=np.int64)
            if rg.size > 1:
                same = np.concatenate(([False], (rg[1:] == rg[:-1]) & (rv[1:] == rv[:-1])))
                run = np.cumsum(~same) - 1
                dup = np.arange(rg.size) - np.flatnonzero(~same)[run]
            pos = pos + dup
            if np.any(pos >= starts[si] + lens[si]) or np.any(cur[np.minimum(pos, max(cur.size - 1, 0))] != rv):
                raise RuntimeError("a value left a group that did not hold it")
            cur = np.delete(cur, pos)
            lens = lens - np.bincount(si, minlength=T.size)
            starts = np.cumsum(lens) - lens
        if ag.size:
            o = np.lexsort((av, ag))
            ag, av = ag[o], av[o]
            si = np.searchsorted(T, ag)
            pos = _seg_search(cur, starts[si], starts[si] + lens[si], av, right=True)
            cur = np.insert(cur, pos, av)
            lens = lens + np.bincount(si, minlength=T.size)
        # write the regions back: in place when they fit, else at the end with room to grow
        fits = lens <= self.cap[T]
        move = T[~fits]
        if move.size:
            newcap = np.maximum(2 * lens[~fits], 4)
            need = self.end + int(newcap.sum())
            if need > self.vals.size:
                if need > 2 * max(int(self.cnt.sum()), 1) + 4096:
                    self._compact(T, lens)
                    return self._write_all(T, lens, cur)
                grown = np.zeros(max(need, 2 * self.vals.size), dtype=self.dtype)
                grown[:self.end] = self.vals[:self.end]
                self.vals = grown
            self.off[move] = self.end + np.cumsum(newcap) - newcap
            self.cap[move] = newcap
            self.end += int(newcap.sum())
        self.cnt[T] = lens
        self.vals[_ragged(self.off[T], lens)] = cur

    def _write_all(self, T: np.ndarray, lens: np.ndarray, cur: np.ndarray) -> None:
        self.cnt[T] = lens
        fits = lens <= self.cap[T]
        move = T[~fits]
        if move.size:
            newcap = np.maximum(2 * lens[~fits], 4)
            need = self.end + int(newcap.sum())
            if need > self.vals.size:
                grown = np.zeros(max(need, 2 * self.vals.size), dtype=self.dtype)
                grown[:self.end] = self.vals[:self.end]
                self.vals = grown
            self.off[move] = self.end + np.cumsum(newcap) - newcap
            self.cap[move] = newcap
            self.end += int(newcap.sum())
        self.vals[_ragged(self.off[T], lens)] = cur

    def _compact(self, T: np.ndarray, lens: np.ndarray) -> None:
        """Every group's region again end to end (groups of `T` sized for `lens`), with room."""
        n = self.cnt.size
        want = self.cnt.copy()
        want[T] = lens
        keep = np.flatnonzero((self.cnt > 0) & ~np.isin(np.arange(n), T))
        data = self.vals[_ragged(self.off[keep], self.cnt[keep])]
        cap = np.where(want > 0, want + want // 2 + 2, 0)
        cap[T] = np.maximum(cap[T], 4)
        off = np.cumsum(cap) - cap
        vals = np.zeros(int(cap.sum()) + 1024, dtype=self.dtype)
        vals[_ragged(off[keep], self.cnt[keep])] = data
        self.vals, self.off, self.cap, self.end = vals, off, cap, int(cap.sum())

    def _java_zeros(self, v: np.ndarray, pos: np.ndarray, off: np.ndarray, cnt: np.ndarray) -> np.ndarray:
        """`v` (the values at positions `pos` of groups at `off` with `cnt` values) with the sign
        of its zeros as a Java sort of the group would have them: every -0.0 before every 0.0."""
        zero = np.flatnonzero((v == 0) & (cnt > 0))
        if zero.size == 0:
            return v
        o, c = off[zero], cnt[zero]
        first = _seg_search(self.vals, o, o + c, np.zeros(zero.size), right=False)
        last = _seg_search(self.vals, o, o + c, np.zeros(zero.size), right=True)
        runs = last - first
        neg = np.signbit(self.vals[_ragged(first, runs)]).astype(np.int64)
        ends = np.cumsum(runs)
        nneg = np.diff(np.concatenate(([0], np.cumsum(neg)[ends - 1] if neg.size else np.zeros(0, np.int64))))
        v = v.astype(np.float64)
        v[zero] = np.where(pos[zero] - first < nneg, -0.0, 0.0)
        return v

    def quantile(self, groups: np.ndarray, p: float, average: bool,
                 java_zeros: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(values, null mask, NaN mask) of the percentile `p` of each group, by Deephaven's
        positions (`average`: its rule for averaging the two middle values). `java_zeros`: as
        Deephaven's median(vector), which sorts -0.0 before 0.0 (else, as its aggregations, equal
        values are one value)."""
        cnt, off = self.cnt[groups], self.off[groups]
        empty = cnt == 0
        c = np.maximum(cnt, 1)
        if average:
            lo = np.floor((c - 1) * p).astype(np.int64)
            pair = (c % 2 == 0) & (lo == c // 2 - 1)
            hi = np.where(pair, lo + 1, lo)
            lo_v = self.vals[off + lo].astype(np.float64)
            hi_v = self.vals[off + hi].astype(np.float64)
            if java_zeros and self.dtype.kind == "f":
                lo_v, hi_v = self._java_zeros(lo_v, off + lo, off, cnt), self._java_zeros(hi_v, off + hi, off, cnt)
            out: np.ndarray = np.where(pair, (lo_v + hi_v) / 2, lo_v)
        else:
            k = np.minimum(np.floor((c - 1) * p + 0.5).astype(np.int64), c - 1)
            out = self.vals[off + k]
            if java_zeros and self.dtype.kind == "f":
                out = self._java_zeros(out, off + k, off, cnt)
        if self.dtype.kind == "f" and groups.size and not java_zeros:
            # equal values are one value in Deephaven, shown as the first one seen: -0.0 or 0.0
            zero = out == 0
            if zero.any():
                first = _seg_search(self.vals, off, off + cnt, np.zeros(groups.size), right=False)
                sign = np.signbit(self.vals[np.minimum(first, max(self.vals.size - 1, 0))])
                out = np.where(zero, np.where(sign, -0.0, 0.0), out)
        nan = self.nan[groups] > 0
        return out, empty & ~nan, nan



class AggregateTable(_Op):
    """One row per group of `keys` with the aggregations `aggs` (see the module docstring)."""

    store: ColumnStore

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, aggs: Sequence[Agg],
                 keys: Sequence[str] = (), preserve_empty: bool = False,
                 initial_groups: Optional[pa.Table] = None, column_order: Optional[Sequence[str]] = None):
        keys = [keys] if isinstance(keys, str) else list(keys)
        ps = parent.schema
        for k in keys:
            if k not in ps.names:
                raise UnknownColumnError(f"table {name!r}: unknown key column {k!r}")
            if not check_hashable(ps.field(k).type):
                raise OperationError(f"table {name!r}: key column {k!r} has type {ps.field(k).type}, "
                                     f"which cannot be a key")
        if len(set(keys)) != len(keys):
            raise OperationError(f"table {name!r}: a key column is named twice in {keys}")
        fields = [ps.field(k) for k in keys]
        inputs: list[str] = []
        self.aggs = list(aggs)
        for a in self.aggs:
            if a.kind not in KINDS:
                raise OperationError(f"table {name!r}: unknown aggregation {a.kind!r}")
            used = [a.column, a.other]
            if a.kind == "count_where":
                if not isinstance(a.where, pc.Expression):
                    raise OperationError(f"table {name!r}: count_where needs a condition (a pyarrow Expression)")
                try:
                    used += expression_columns(a.where, ps)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, KeyError) as exc:
                    raise OperationError(f"table {name!r}: count_where condition {a.where}: {exc}") from None
            for c in used:
                if c is not None:
                    if c not in ps.names:
                        raise UnknownColumnError(f"table {name!r}: {a.kind} of unknown column {c!r}")
                    if c not in inputs:
                        inputs.append(c)
            if a.column is None and a.kind not in ("count", "count_where", "first_row_key", "last_row_key",
                                                   "partition"):
                raise OperationError(f"table {name!r}: {a.kind} needs an input column")
            t = ps.field(a.column).type if a.column else None
            o = ps.field(a.other).type if a.other else None
            try:
                rt = result_type(a, t, o)
            except OperationError as exc:
                raise OperationError(f"table {name!r}: {exc}") from None
            if a.kind in ("distinct", "group"):  # Deephaven's aggregations make vectors, not arrays
                fields.append(pa.field(a.out, rt, metadata={b"deephaven:type": _vector_type(rt.value_type)}))
            elif a.kind == "partition":
                fields.append(pa.field(a.out, rt, metadata={b"deephaven:type": _PARTITION_TYPE}))
            else:
                fields.append(pa.field(a.out, rt))
        names = [f.name for f in fields]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise OperationError(f"table {name!r}: output column {dup[0]!r} is produced twice")
        if column_order is not None:  # the output's columns in this order (default: keys first)
            if sorted(column_order) != sorted(names):
                raise OperationError(f"table {name!r}: column order {list(column_order)} does not name "
                                     f"the output columns {names}")
            fields = [fields[names.index(n)] for n in column_order]
        self.keys = keys
        self.inputs = inputs
        self.preserve_empty = bool(preserve_empty)
        self.in_schema = pa.schema([ps.field(c) for c in inputs])
        cap = 1024
        self._groups = KeyIndex()
        self._count = np.zeros(cap, dtype=np.int64)        # group -> rows
        self._live = np.zeros(cap, dtype=bool)             # group -> has an output row
        self._linear = [_Linear(a, ps.field(a.column).type if a.column else pa.int64(),
                                ps.field(a.other).type if a.other else None, cap)
                        for a in self.aggs if a.kind in LINEAR]
        self._ordered = [a for a in self.aggs if a.kind in ORDERED]
        self._constant = [a for a in self.aggs if a.kind in CONSTANT]
        self._row_keys = any(a.kind in ("first_row_key", "last_row_key") for a in self.aggs)
        # median and percentile of columns kept sorted per group (by column)
        self._slabs: dict[str, _SortedSlabs] = {}
        for a in self._ordered:
            if a.kind in ("median", "percentile") and a.column is not None:
                dt = _slab_storage(ps.field(a.column).type)
                if dt is not None and a.column not in self._slabs:
                    self._slabs[a.column] = _SortedSlabs(dt)
        # as Deephaven: an aggregation of a blink table covers every row the table ever had
        self.blink = bool(parent.attributes.get("BlinkTable"))
        if self.blink:
            bad = [a.kind for a in self._ordered if a.kind not in ("min", "max", "first", "last")]
            if bad:
                raise OperationError(f"table {name!r}: {bad[0]} of blink table {parent.name!r} is not supported "
                                     f"(its rows leave every cycle; sum, avg, count, std, var, weighted, min, max, "
                                     f"first and last are)")
        self._slot_of = KeyMap()                            # parent row key -> member slot
        self._mgid = np.zeros(cap, dtype=np.int64)          # member slot -> group
        self._free = _EMPTY.copy()
        self._nslots = 0
        self._values = ColumnStore(self.in_schema)          # member slot -> input values
        # (group + 1, parent row key)
        self._members = OrderIndex(2, budget=MEMBERS_BUDGET, members=True) if self._ordered else None
        # each group's first and last member, checked before use (as the joins keep them)
        self._hints = GroupHints(self._members, cap) if self._members is not None else None
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, pa.schema(fields))
            self.store = ColumnStore(self.schema)
            # emptied groups' ids (their row keys) go to new keys once many have emptied; not
            # when empty groups keep their rows, nor over a blink table (its groups never empty)
            self._ids = GroupIds(self._groups, self.store, keys, reuse=not (self.preserve_empty or self.blink))
            if not keys:
                self._new_groups(1)
            elif initial_groups is not None:
                init = initial_groups.select(keys).combine_chunks()
                self._group_of(init)
            extra = np.arange(self._ngroups, dtype=np.int64) if self.preserve_empty else _EMPTY
            self._cycle(TableUpdate(added=parent.rowset), extra)
            self._prev = None
            self._rs = None
            self._update = None

    # -- storage --------------------------------------------------------------------------------
    def _grow_groups(self, need: int) -> None:
        size = self._count.size
        if need <= size:
            return
        while size < need:
            size *= 2
        if self._hints is not None:
            self._hints.grow(size)
        for name, dtype in (("_count", np.int64), ("_live", bool)):
            old = getattr(self, name)
            new = np.zeros(size, dtype=dtype)
            new[:old.size] = old
            setattr(self, name, new)
        for lin in self._linear:
            lin.grow(size)
        self.store.ensure(size)

    @property
    def _ngroups(self) -> int:
        return self._ids.made

    def _new_groups(self, m: int) -> np.ndarray:
        new = self._ids.take(m)
        self._grow_groups(self._ngroups)
        return new

    def _alloc(self, m: int) -> np.ndarray:
        take = min(m, self._free.size)
        slots = self._free[self._free.size - take:]
        self._free = self._free[:self._free.size - take]
        fresh = np.arange(self._nslots, self._nslots + (m - take), dtype=np.int64)
        self._nslots += m - take
        if self._nslots > self._mgid.size:
            size = self._mgid.size
            while size < self._nslots:
                size *= 2
            grown = np.zeros(size, dtype=np.int64)
            grown[:self._mgid.size] = self._mgid
            self._mgid = grown
        self._values.ensure(self._nslots)
        return np.concatenate((slots, fresh))

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        return Table.prev_gather(self, columns, keys)

    # -- groups ---------------------------------------------------------------------------------
    def _group_of(self, values: pa.Table) -> np.ndarray:
        """Group of each row of key values, making groups for new keys (in first-row order)."""
        def make(key_vals: pa.Table) -> np.ndarray:
            new = self._new_groups(key_vals.num_rows)
            self.store.write(new, self._key_row_table(key_vals, key_vals.num_rows))
            return new
        gids: np.ndarray = groups_of(self._groups, self.store, self.keys, values, make)
        return gids

    def _key_row_table(self, key_vals: pa.Table, n: int) -> pa.Table:
        """Output rows with the key values and empty aggregation values (written when groups are made)."""
        cols = []
        for f in self.schema:
            if f.name in self.keys:
                cols.append(key_vals.column(f.name).combine_chunks())
            else:
                cols.append(pa.nulls(n, f.type))
        return pa.Table.from_arrays(cols, schema=self.schema)

    # -- the cycle ------------------------------------------------------------------------------
    def _follow(self, step: int, up: TableUpdate) -> Optional[TableUpdate]:
        return self._cycle(up)

    def _cycle(self, up: TableUpdate, extra: np.ndarray = _EMPTY) -> Optional[TableUpdate]:
        parent, slot_of, members = self.parent, self._slot_of, self._members
        self._ids.release(lambda g: (self._count[g] == 0) & ~self._live[g])
        touched: list[np.ndarray] = [extra]  # groups whose values may have changed
        left: list[tuple[np.ndarray, pa.Table]] = []   # (groups, old values) of rows leaving groups
        came: list[tuple[np.ndarray, pa.Table]] = []   # (groups, values) of rows joining groups
        # 1. removed rows (pre-shift keys)
        rem = up.removed.keys()
        if rem.size:
            slots = slot_of.get(rem)
            if np.any(slots < 0):
                raise RuntimeError(f"table {self.name!r}: the parent removed rows this table does not have")
            g = self._mgid[slots]
            if not self.blink:  # a blink table's rows stay in their groups' values
                left.append((g, self._values.gather(slots)))
                _scatter_add(self._count, g, -1)
            slot_of.delete(rem)
            if members is not None:
                members.delete(members.key_of(rem))
            self._free = np.concatenate((self._free, slots))
        # 2. shifted rows: new parent keys
        if not up.shifted.is_empty():
            old_k, new_k = shifted_rows(parent, up)
            if old_k.size:
                slot_of.remap(old_k, new_k)
                if members is not None:
                    members.set_last_word(members.key_of(old_k), new_k)
                if self._row_keys:  # the groups' first/last row keys moved with them
                    touched.append(self._mgid[slot_of.get(new_k)])
        # (members words, groups) of rows that moved to another group or arrived: put into the
        # members index after step 4
        put: list[tuple[list[np.ndarray], np.ndarray]] = []
        # 3. modified rows: old values leave, new values come (possibly to another group)
        mod = up.modified.keys()
        cols = up.modified_columns
        if mod.size and (set(self.keys) & cols or set(self.inputs) & cols):
            slots = slot_of.get(mod)
            g_old = self._mgid[slots]
            if set(self.keys) & cols:
                g_new = self._group_of(parent.gather(self.keys, mod))
            else:
                g_new = g_old
            old = self._values.gather(slots)
            new_vals = parent.gather(self.inputs, mod) if self.inputs else self._values.gather(slots)
            self._values.write(slots, new_vals)
            left.append((g_old, old))
            came.append((g_new, new_vals))
            moved = g_new != g_old
            if moved.any():
                _scatter_add(self._count, g_old[moved], -1)
                _scatter_add(self._count, g_new[moved], 1)
                self._mgid[slots[moved]] = g_new[moved]
                if members is not None:
                    mk = mod[moved]
                    members.delete(members.key_of(mk))
                    put.append(([(g_new[moved] + 1).astype(np.uint64), mk.astype(np.uint64)], g_new[moved]))
        # 4. added rows
        add = up.added.keys()
        if add.size:
            need = list(dict.fromkeys(self.keys + self.inputs))
            vals = parent.gather(need, add) if need else pa.table({"__n": pa.nulls(add.size)})
            g = self._group_of(vals.select(self.keys)) if self.keys else np.zeros(add.size, dtype=np.int64)
            slots = self._alloc(add.size)
            self._mgid[slots] = g
            slot_of.set(add, slots)
            in_vals = vals.select(self.inputs) if self.inputs else pa.table({})
            if self.inputs:
                self._values.write(slots, in_vals)
            _scatter_add(self._count, g, 1)
            if members is not None:
                put.append(([(g + 1).astype(np.uint64), add.astype(np.uint64)], g))
            came.append((g, in_vals))
        if put:   # moved and added rows into the members index in one insert: one search of it
            assert self._hints is not None
            words, groups = joined(put)
            self._hints.insert(words, groups, self._count)
        # 5. the linear kinds follow; groups that lost values are rescanned for ordered kinds
        for g, vals in left:
            touched.append(g)
            for lin in self._linear:
                lin.add(g, vals, -1)
        for g, vals in came:
            touched.append(g)
            for lin in self._linear:
                lin.add(g, vals, 1)
        for col, slab in self._slabs.items():
            slab.grow(self._ngroups)
            slab.apply([(g, v.column(col).combine_chunks()) for g, v in left],
                       [(g, v.column(col).combine_chunks()) for g, v in came])
        G = unique(np.concatenate(touched))
        if G.size == 0:
            return None
        return self._emit(G, left, came)

    def _members_of(self, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group, parent row key) of every member of `groups` (sorted), ordered by both."""
        assert self._members is not None
        return group_members(self._members, groups, self._hints)

    def _edges(self, groups: np.ndarray, front: bool) -> np.ndarray:
        """The first (front) or last parent row key of each group (-1 when empty)."""
        assert self._members is not None
        return group_edges(self._members, groups, front, self._hints)

    def _emit(self, G: np.ndarray, left: list[tuple[np.ndarray, pa.Table]],
              came: list[tuple[np.ndarray, pa.Table]]) -> Optional[TableUpdate]:
        counts = self._count[G]
        empty = G[counts == 0]
        for lin in self._linear:  # running sums start again from exact zeros
            lin.reset(empty)
        was = self._live[G]
        now = (counts > 0) | self.preserve_empty
        born, gone, stay = G[now & ~was], G[was & ~now], G[was & now]
        self._live[born] = True
        self._live[gone] = False
        self._ids.emptied(gone)
        # the new values of every touched group that has a row now
        out_g = G[now]
        new_cols: dict[str, pa.Array] = {}
        for lin in self._linear:
            new_cols[lin.a.out] = lin.values(out_g, self._count[out_g])
        if self._ordered:
            new_cols.update(self._ordered_values(out_g, born, left, came))
        for a in self._constant:
            new_cols[a.out] = pa.array(np.full(out_g.size, "QueryTable", dtype=object), pa.string())
        old = self.store.gather(stay, list(new_cols)) if stay.size else None
        if new_cols and out_g.size:
            st = self.store
            st.ensure(int(out_g[-1]) + 1)
            for n, arr in new_cols.items():
                st.columns[st.index[n]].write(out_g, arr)
        modified = _EMPTY
        changed: set[str] = set()
        if stay.size and old is not None:
            pos = pa.array(np.searchsorted(out_g, stay))
            any_change = np.zeros(stay.size, dtype=bool)
            for n in new_cols:
                diff = ~equal_mask(old.column(n).combine_chunks(), new_cols[n].take(pos))
                if diff.any():
                    changed.add(n)
                    any_change |= diff
            modified = stay[any_change]
            if modified.size:
                self._prev = (modified, old.take(pa.array(np.flatnonzero(any_change))))
        self._commit(gone, born)
        if born.size == 0 and gone.size == 0 and modified.size == 0:
            return None
        return TableUpdate(added=RowSet.from_keys(born), removed=RowSet.from_keys(gone),
                           modified=RowSet.from_keys(modified), modified_columns=ModifiedColumnSet(changed))

    def _sorted_kept(self, a: Agg) -> bool:
        return a.kind in ("median", "percentile") and a.column in self._slabs

    def _quantiles(self, a: Agg, t: pa.DataType, rt: pa.DataType, groups: np.ndarray) -> pa.Array:
        """A median/percentile of `groups` read from the column's sorted values."""
        assert a.column is not None
        avg = averages(a, t)
        p = 0.5 if a.kind == "median" else float(a.percentile)
        out, null, nan = self._slabs[a.column].quantile(groups, p, avg, java_zeros=a.wide)
        if avg or pa.types.is_floating(t):
            arr = pa.array(np.where(nan, np.nan, out.astype(np.float64)), pa.float64(), mask=null)
            return arr.cast(rt)
        if pa.types.is_boolean(t):
            return pa.array(out != 0, pa.bool_(), mask=null)
        if pa.types.is_temporal(t):
            storage = pa.int32() if t.bit_width == 32 else pa.int64()
            return pa.array(out.astype(storage.to_pandas_dtype()), storage, mask=null).view(t)
        return pa.array(out, pa.int64(), mask=null).cast(t)

    def _rescan_min_max(self, a: Agg, out_g: np.ndarray, left: list[tuple[np.ndarray, pa.Table]]) -> np.ndarray:
        """Groups of `out_g` from which a value left that could have been their min (max)."""
        found = []
        for g, vals in left:
            sel = np.isin(g, out_g)
            if not sel.any():
                continue
            gs = g[sel]
            v = vals.column(a.column).combine_chunks().filter(pa.array(sel))
            cur = self.store.gather_column(a.out, gs)
            if pa.types.is_boolean(v.type) or not (pa.types.is_primitive(v.type) or pa.types.is_string(v.type)
                                                  or pa.types.is_large_string(v.type)):
                found.append(gs)
                continue
            cmp = pc.less_equal(v, cur) if a.kind == "min" else pc.greater_equal(v, cur)
            hit = cmp.fill_null(True).to_numpy(zero_copy_only=False) & v.is_valid().to_numpy(zero_copy_only=False)
            if pa.types.is_floating(v.type):
                hit |= pc.is_nan(v).fill_null(False).to_numpy(zero_copy_only=False)
            found.append(gs[hit])
        return unique(np.concatenate(found)) if found else _EMPTY

    def _ordered_values(self, out_g: np.ndarray, born: np.ndarray, left: list[tuple[np.ndarray, pa.Table]],
                        came: list[tuple[np.ndarray, pa.Table]]) -> dict[str, pa.Array]:
        """The ordered kinds' values for groups `out_g`: read from the members of the groups that
        need it (every touched group for the kinds of _RESCAN; for min and max, new groups and
        those from which a value left that could have been the extreme), else (min/max) the
        current value merged with the values that came."""
        res: dict[str, pa.Array] = {}
        scans: dict[str, np.ndarray] = {}
        for a in self._ordered:
            if a.kind in _RESCAN and not self._sorted_kept(a):
                scans[a.out] = out_g
            elif a.kind in ("min", "max"):
                scans[a.out] = np.union1d(np.intersect1d(born, out_g), self._rescan_min_max(a, out_g, left))
        every = unique(np.concatenate(list(scans.values()))) if scans else _EMPTY
        m_g = m_k = _EMPTY
        m_rows: Optional[pa.Table] = None
        if every.size:
            m_g, m_k = self._members_of(every)
            m_rows = self._values.gather(self._slot_of.get(m_k)) if self.inputs else None
        for a in self._ordered:
            scan = scans.get(a.out, _EMPTY)
            rest = np.setdiff1d(out_g, scan, assume_unique=True) if a.kind in ("min", "max") else _EMPTY
            t = self.parent.schema.field(a.column).type if a.column else pa.int64()
            rt = self.schema.field(a.out).type
            parts: list[tuple[np.ndarray, pa.Array]] = []
            if self._sorted_kept(a):
                assert a.column is not None
                res[a.out] = self._quantiles(a, t, rt, out_g)
                continue
            if a.kind in ("first", "last", "first_row_key", "last_row_key"):
                front = a.kind in ("first", "first_row_key")
                pk = self._edges(out_g, front)
                if self.blink and front and a.column is not None:  # the first row came with the group
                    old = ~np.isin(out_g, born)
                    if old.any():
                        res[a.out] = pc.if_else(pa.array(old), self.store.gather_column(a.out, out_g),
                                                self._values.gather_column(a.column, np.where(
                                                    pk >= 0, self._slot_of.get(np.where(pk >= 0, pk, 0)), 0)))
                        continue
                if a.kind.endswith("row_key"):
                    res[a.out] = pa.array(pk, pa.int64(), mask=pk < 0)
                else:
                    slots = self._slot_of.get(np.where(pk >= 0, pk, 0))
                    assert a.column is not None
                    col = self._values.gather_column(a.column, np.where(pk >= 0, slots, 0))
                    res[a.out] = pc.if_else(pa.array(pk < 0), pa.nulls(pk.size, rt), col) if (pk < 0).any() else col
                continue
            if scan.size:
                assert m_rows is not None
                if scan.size == every.size:
                    parts.append((scan, _ordered_values(a, t, scan, m_g, m_k, m_rows)))
                else:
                    sel = np.isin(m_g, scan)
                    parts.append((scan, _ordered_values(a, t, scan, m_g[sel], m_k[sel],
                                                        m_rows.filter(pa.array(sel)))))
            if rest.size:
                # min/max of groups that only gained values: the current value merged with them
                cur = self.store.gather_column(a.out, rest)
                gs = [np.full(rest.size, 0, dtype=np.int64)]
                vals = [cur]
                for g, v in came:
                    sel = np.isin(g, rest)
                    if sel.any():
                        gs.append(np.searchsorted(rest, g[sel]))
                        vals.append(v.column(a.column).combine_chunks().filter(pa.array(sel)).cast(rt))
                pos = np.concatenate([np.arange(rest.size, dtype=np.int64)] + gs[1:])
                allv = pa.concat_arrays(vals)
                o = np.argsort(pos, kind="stable")
                tbl = pa.table({a.column: allv.take(pa.array(o))})
                parts.append((rest, _ordered_values(a, t, np.arange(rest.size, dtype=np.int64), pos[o],
                                                    np.zeros(pos.size, dtype=np.int64), tbl)))
            if a.kind == "distinct" and parts and self.preserve_empty:
                # a group without rows lists nothing (one whose rows are all null lists null)
                g0 = np.concatenate([p[0] for p in parts])
                none = self._count[g0] == 0
                if none.any():
                    vals = pa.concat_arrays([p[1] for p in parts])
                    empty = pa.array([[]] * len(vals), type=rt)
                    parts = [(g0, pc.if_else(pa.array(none), empty, vals))]
            if not parts:
                res[a.out] = pa.nulls(0, rt)
            elif len(parts) == 1:
                res[a.out] = parts[0][1]
            else:
                allg = np.concatenate([p[0] for p in parts])
                allv = pa.concat_arrays([p[1] for p in parts])
                res[a.out] = allv.take(pa.array(np.argsort(allg, kind="stable")))
        return res


register_operation("agg_by", AggregateTable)
