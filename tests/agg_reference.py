"""agg_by recomputed from scratch in plain Python, for the tests that check the incremental
aggregation against it (tests/test_graph_aggregate.py in process, tests/convergence.py over gRPC).

`reference(rows, keys, aggs, schema)` aggregates row dicts (each with its parent row key in
"__key") by the values of `keys`, with Deephaven's rules as tickwire keeps them (NaN poisons
min/max/median and is no distinct value, float sums follow IEEE rules, a group without values
counts and lists null, Deephaven's percentile positions, ...). `check_rows` compares an
aggregation's output rows with it: groups by key, not by position; floats within a relative
tolerance scaled by the inputs' magnitude (running sums and variances drift from a fresh sum).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from tests.test_graph_ops import _sort_key
from tickwire.server.engine.graph.aggspec import Agg

__all__ = ["KEY", "reference", "ref_value", "passing", "empty_value", "key_norm", "close", "same_value", "check_rows",
           "check_agg", "check_agg_preserving", "rows_with_keys", "is_nan", "sort_key"]

KEY = "__key"  # the parent row key of each row dict (first_row_key, last_row_key)
sort_key = _sort_key


def _num(v):
    return None if v is None else (int(v) if isinstance(v, bool) else v)


def _nonnull(vals):
    return [v for v in vals if v is not None]


def is_nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _fsum(vals):
    """Sum with IEEE rules for NaN and infinities (Python's own float addition)."""
    total = 0.0
    for v in vals:
        total += v
    return total


def passing(a: Agg, rows: list[dict], schema: pa.Schema) -> set[int]:
    """The ids of the row dicts for which count_where's condition holds (null: it does not)."""
    if not rows:
        return set()
    t = pa.Table.from_pylist([{n: r[n] for n in schema.names} for r in rows], schema=schema)
    hit = t.append_column("__i", pa.array(range(len(rows)), pa.int64())).filter(a.where)["__i"].to_pylist()
    return {id(rows[i]) for i in hit}


def ref_value(a: Agg, rows: list[dict], schema: pa.Schema, hits: Optional[set[int]] = None):
    """The value of aggregation `a` of the (non-empty) group `rows`, in parent row order (`hits`:
    for count_where, `passing` of the parent's rows, else found here)."""
    ftype = schema.field(a.column).type if a.column else pa.int64()
    vals = [r[a.column] for r in rows] if a.column else None
    k = a.kind
    if k == "count":
        return len(rows)
    if k == "count_where":
        hits = passing(a, rows, schema) if hits is None else hits
        return sum(1 for r in rows if id(r) in hits)
    if k in ("first_row_key", "last_row_key"):
        return rows[0][KEY] if k == "first_row_key" else rows[-1][KEY]
    if k == "partition":  # what Deephaven's clients receive of a group's table
        return "QueryTable"
    assert vals is not None, f"{k} needs a column"
    if k == "first":
        return vals[0]
    if k == "last":
        return vals[-1]
    if k == "group":
        return list(vals)
    nn = _nonnull(vals)
    is_float = pa.types.is_floating(ftype)
    if k in ("sum", "abs_sum"):
        if not nn:
            return None
        xs = [abs(_num(v)) if k == "abs_sum" else _num(v) for v in nn]
        return _fsum([float(x) for x in xs]) if is_float else int(sum(xs))
    if k == "avg":
        return _fsum([float(_num(v)) for v in nn]) / len(nn) if nn else None
    if k in ("var", "std"):
        if not nn:
            return None
        xs = [float(_num(v)) for v in nn]
        if any(not math.isfinite(x) for x in xs) or len(xs) < 2:
            return math.nan
        m = sum(xs) / len(xs)
        var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1)
        return math.sqrt(var) if k == "std" else var
    if k in ("weighted_sum", "weighted_avg"):
        xs = [r[a.column] for r in rows]
        ws = [r[a.other] for r in rows]
        pairs = [(x, w) for x, w in zip(xs, ws) if x is not None and w is not None]
        is_int = not is_float and not pa.types.is_floating(schema.field(a.other).type)
        if k == "weighted_sum" and is_int:
            return int(sum(_num(x) * _num(w) for x, w in pairs)) if pairs else None
        # a NaN or infinite value (whatever its weight) or weight makes the result NaN
        if any(x is not None and not math.isfinite(float(_num(x))) for x in xs) or \
                any(not math.isfinite(float(_num(w))) for _x, w in pairs):
            return math.nan
        if not pairs:
            return None
        sxw = _fsum([float(_num(x)) * float(_num(w)) for x, w in pairs])
        if k == "weighted_sum":
            return sxw
        with np.errstate(all="ignore"):
            return float(np.float64(sxw) / np.float64(_fsum([float(_num(w)) for _x, w in pairs])))
    if k in ("min", "max", "median", "percentile"):
        if any(is_nan(v) for v in nn):
            return math.nan  # a NaN makes the group's value NaN
        xs = sorted(nn, key=_sort_key)
        if not xs:
            return None
        if k == "min":
            return xs[0]
        if k == "max":
            return xs[-1]
        p = 0.5 if k == "median" else a.percentile
        n = len(xs)
        # a formula's median(vector) (wide) averages every numeric type
        if (a.average_evenly_divided and ftype in (pa.int32(), pa.int64(), pa.float32(), pa.float64())) or \
                (a.wide and (pa.types.is_integer(ftype) or is_float)):
            lo = int(math.floor((n - 1) * p))
            if n % 2 == 0 and lo == n // 2 - 1:
                return (float(xs[lo]) + float(xs[lo + 1])) / 2
            return float(xs[lo])
        return xs[min(int(math.floor((n - 1) * p + 0.5)), n - 1)]
    if k in ("count_distinct", "distinct", "unique"):
        firsts: dict = {}  # equal values (0.0 and -0.0 too) are one distinct value, the first seen
        for v in vals:  # NaN is a value only when nulls are counted too, as in Deephaven
            if v is None or is_nan(v):
                if a.include_nulls:
                    firsts.setdefault("NaN" if v is not None else None, v)
            else:
                firsts.setdefault(v, v)
        seen = sorted(firsts.values(), key=_sort_key)
        if k == "count_distinct":
            return len(seen) or None
        if k == "distinct":
            return seen or None
        return seen[0] if len(seen) == 1 else None
    if k in ("sorted_first", "sorted_last"):
        order = sorted(range(len(rows)), key=lambda i: _sort_key(rows[i][a.other]))
        if k == "sorted_first":
            return rows[order[0]][a.column]
        best = _sort_key(rows[order[-1]][a.other])
        last = max(i for i in range(len(rows)) if _sort_key(rows[i][a.other]) == best)
        return rows[last][a.column]
    raise AssertionError(k)


def same_value(x, y) -> bool:
    """Equal, with null equal to null and NaN equal to NaN."""
    if x is None or y is None:
        return x is None and y is None
    if is_nan(x) or is_nan(y):
        return is_nan(x) and is_nan(y)
    return x == y


def close(x, y, scale: float) -> bool:
    """Equal, floats within a relative tolerance of 1e-9 (of the larger of the values and `scale`)."""
    if isinstance(x, list) or isinstance(y, list):
        return isinstance(x, list) and isinstance(y, list) and len(x) == len(y) and \
            all(close(a, b, scale) for a, b in zip(x, y))
    if x is None or y is None:
        return x is None and y is None
    if isinstance(x, float) or isinstance(y, float):
        x, y = float(x), float(y)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        if math.isinf(x) or math.isinf(y):
            return x == y
        return abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y), scale)
    return x == y


def key_norm(v):
    """A group key value as a dict key (NaN is one group; -0.0 and 0.0 are one group)."""
    if is_nan(v):
        return "NaN"
    if isinstance(v, float) and v == 0:
        return 0.0
    return v


def empty_value(a: Agg):
    """The value of `a` for a group without rows (kept by preserve_empty): as in Deephaven, counts
    are 0, group and distinct list nothing, the others are null."""
    if a.kind in ("count", "count_where"):
        return 0
    if a.kind in ("group", "distinct"):
        return []
    if a.kind == "partition":
        return "QueryTable"
    return None


def reference(parent_rows: list[dict], keys: Sequence[str], aggs: Sequence[Agg], schema: pa.Schema) -> dict:
    """{group key tuple: {output column: value}} of the groups that have rows."""
    groups: dict = {}
    for r in parent_rows:
        groups.setdefault(tuple(key_norm(r[k]) for k in keys), []).append(r)
    hits = {a.out: passing(a, parent_rows, schema) for a in aggs if a.kind == "count_where"}  # in one pass
    return {g: {a.out: ref_value(a, rows, schema, hits.get(a.out)) for a in aggs} for g, rows in groups.items()}


def _scale(parent_rows: list[dict], columns: Sequence[str]) -> float:
    """The tolerance's scale: 64 times the square of the largest finite input (variances are sums
    of squares)."""
    return max([abs(r[c]) for r in parent_rows for c in columns if isinstance(r[c], (int, float))
                and math.isfinite(r[c])] or [1.0]) ** 2 * 64


def check_rows(got_rows: list[dict], parent_rows: list[dict], keys: Sequence[str], aggs: Sequence[Agg],
               schema: pa.Schema, *, preserve_empty: bool = False,
               scale_columns: Optional[Sequence[str]] = None) -> Optional[str]:
    """None when the aggregation's output rows `got_rows` are `reference(parent_rows, ...)`, else
    what differs. With `preserve_empty`, groups without rows must hold `empty_value`s (and a table
    without keys keeps its one row). `scale_columns`: the inputs whose magnitude scales the float
    tolerance (default: the numeric columns the aggregations read)."""
    want = reference(parent_rows, keys, aggs, schema)
    got: dict = {}
    for r in got_rows:
        g = tuple(key_norm(r[k]) for k in keys)
        if g in got:
            return f"two output rows for group {g}"
        got[g] = r
    empty = {g: r for g, r in got.items() if g not in want} if preserve_empty else {}
    for g, r in empty.items():
        for a in aggs:
            if not close(r[a.out], empty_value(a), 1.0):
                return f"empty group {g}: {a.out} is {r[a.out]!r}, want {empty_value(a)!r}"
    if preserve_empty and not keys and not got:
        return "no row for the table without keys (preserve_empty keeps it)"
    if set(got) - set(empty) != set(want):
        extra, missing = set(got) - set(want) - set(empty), set(want) - set(got)
        return f"groups differ: extra {sorted(extra, key=repr)[:10]}, missing {sorted(missing, key=repr)[:10]}"
    if scale_columns is None:
        scale_columns = [c for a in aggs for c in (a.column, a.other) if c is not None and
                         (pa.types.is_integer(schema.field(c).type) or pa.types.is_floating(schema.field(c).type))]
    scale = _scale(parent_rows, scale_columns)
    for g, vals in want.items():
        for name, v in vals.items():
            if not close(got[g][name], v, scale):
                return f"group {g} column {name}: got {got[g][name]!r}, want {v!r}"
    return None


def rows_with_keys(table) -> list[dict]:
    """An engine table's rows as dicts, with their row keys in KEY."""
    return table.gather_with_keys(key_column=KEY).to_pylist()


def check_agg(node, keys: Sequence[str], aggs: Sequence[Agg], *,
              scale_columns: Optional[Sequence[str]] = None) -> Optional[str]:
    """check_rows of an agg_by table of the engine against its parent's rows now."""
    parent = node.parents[0]
    return check_rows(node.gather().to_pylist(), rows_with_keys(parent), keys, aggs, parent.schema,
                      scale_columns=scale_columns)


def check_agg_preserving(node, keys: Sequence[str], aggs: Sequence[Agg], *,
                         scale_columns: Optional[Sequence[str]] = None) -> Optional[str]:
    """Like check_agg, for a table that keeps groups that emptied (with their empty values)."""
    parent = node.parents[0]
    return check_rows(node.gather().to_pylist(), rows_with_keys(parent), keys, aggs, parent.schema,
                      preserve_empty=True, scale_columns=scale_columns)
