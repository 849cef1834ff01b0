"""range_join of static tables: for each left row, the right rows of its key whose range column lies
between the row's start and end, as lists (Deephaven's `group` aggregation), as Deephaven 42.7
answers it (static inputs only, `group` only):

- the range rules: start `<` or `<=` (with "allow preceding": also the last right row before the
  start when none is at it), end `<` or `<=` (with "allow following": also the first after the end
  when none is at it);
- a null start is no lower bound (and a null end no upper one); a start after the end gives a null
  list, an empty range an empty list; right rows whose range value is null are never in a range;
- each list holds its right rows in range order (ties in the right table's order); keys match as in
  the other joins (null matches null, NaN NaN, -0.0 0.0).

Computed once, in bulk: both sides' keys are grouped in one `KeySpace`, the range values ranked
together, and each left row's range found by two binary searches among its group's right rows.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.graph.ops.aggregate import _vector_type
from tickwire.server.engine.graph.ops.as_of_join import _ranks
from tickwire.server.engine.graph.ops.join_keys import KeySpace

__all__ = ["range_join_values", "START_RULES", "END_RULES"]

START_RULES = ("<", "<=", "<-<=")   # strict, inclusive, inclusive allowing the preceding row
END_RULES = ("<", "<=", "<=->")     # strict, inclusive, inclusive allowing the following row


def _valid(a: pa.Array) -> np.ndarray:
    return np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def range_join_values(left: pa.Table, right: pa.Table, on: Sequence[tuple[str, str]], start: str, start_rule: str,
                      range_col: str, end_rule: str, end: str, groups: Sequence[tuple[str, str]]) -> pa.Table:
    """The left rows with one list column per `groups` pair (output name, right column): Deephaven
    vectors of the right column's type."""
    group_fields = [pa.field(out, pa.list_(right.schema.field(col).type),
                             metadata={b"deephaven:type": _vector_type(right.schema.field(col).type)})
                    for out, col in groups]
    space = KeySpace([left.schema.field(a).type for a, _b in on])
    n, m = left.num_rows, right.num_rows
    lg = space.groups(left.select([a for a, _b in on])) if on else np.zeros(n, dtype=np.int64)
    rg = space.groups(right.select([b for _a, b in on])) if on else np.zeros(m, dtype=np.int64)
    rp = right.column(range_col).combine_chunks()
    ls, le = left.column(start).combine_chunks(), left.column(end).combine_chunks()
    typ = rp.type
    ranks = _ranks(pa.concat_arrays([rp, ls.cast(typ), le.cast(typ)]))
    r_rank, ls_rank, le_rank = ranks[:m], ranks[m:m + n], ranks[m + n:]
    width = int(ranks.max()) + 2 if ranks.size else 2
    keep = np.flatnonzero(_valid(rp))  # a null range value is in no range
    order = keep[np.lexsort((keep, r_rank[keep], rg[keep]))]
    comp = rg[order] * width + r_rank[order]
    gstart = np.searchsorted(comp, lg * width, side="left")
    gend = np.searchsorted(comp, (lg + 1) * width, side="left")  # one past the group's last right row
    ls_ok, le_ok = _valid(ls), _valid(le)
    lo = np.searchsorted(comp, lg * width + ls_rank, side="right" if start_rule == "<" else "left")
    lo = np.where(ls_ok, lo, gstart)
    hi = np.searchsorted(comp, lg * width + le_rank, side="left" if end_rule == "<" else "right")
    hi = np.where(le_ok, hi, gend)  # one past the last row in range
    if start_rule == "<-<=":
        at = (lo < gend) & (comp[np.minimum(lo, comp.size - 1)] == lg * width + ls_rank) if comp.size else lo < 0
        lo = np.where(ls_ok & ~at & (lo > gstart), lo - 1, lo)
    if end_rule == "<=->":
        last = hi - 1
        at = (last >= gstart) & (comp[np.clip(last, 0, max(comp.size - 1, 0))] == lg * width + le_rank) \
            if comp.size else hi < 0
        hi = np.where(le_ok & ~at & (hi < gend), hi + 1, hi)
    inverted = ls_ok & le_ok & (ls_rank > le_rank)
    size = np.where(inverted, 0, np.maximum(hi - lo, 0))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(size, out=offsets[1:])
    owner = np.repeat(np.arange(n, dtype=np.int64), size)
    idx = order[lo[owner] + (np.arange(offsets[-1], dtype=np.int64) - offsets[:-1][owner])] if owner.size \
        else np.zeros(0, dtype=np.int64)
    cols = dict(zip(left.column_names, left.columns))
    off = pa.array(offsets.astype(np.int32))
    for (out, col), f in zip(groups, group_fields):
        values = right.column(col).combine_chunks().take(pa.array(idx, type=pa.int64()))
        lists = pa.ListArray.from_arrays(off, values, mask=pa.array(inverted))
        cols[out] = lists.cast(f.type)
    schema = pa.schema(list(left.schema) + list(group_fields))
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)
