"""Deephaven's HeadBy, TailBy and Ungroup (TableService, also inside Batch) as incremental tables
of the engine (tickwire.server.engine.graph.ops.head_tail_by and .ungroup), with the rules a real
Deephaven 42.7 keeps (tests/test_group_ops.py compares them with one):

- HeadBy / TailBy: the first / last num_rows rows of each group of the group-by columns; the key
  columns first, then the others; groups in the order first seen, each group's rows in the source's
  order. num_rows must be > 0 (a negative one is refused as Deephaven words it, 0 too); each
  group-by spec must be a column name of the source, named once (a rename "A=B" or a formula is
  refused), and at least one column must be left that is not a key; a blink source is refused.
- Ungroup: the named list columns (none named: every list column) expanded to one row per element;
  a null list counts as empty; lists of one row must have the same length unless null_fill (then
  the shorter ones are padded with nulls). An unknown column, a column that is not a list and lists
  of different lengths are refused naming them. With no list column to ungroup the answer is the
  source's rows as they are.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from tickwire.server.engine import Table
from tickwire.server.engine.graph.ops.ungroup import is_list_type
from tickwire.server.services.rpc import CallError
from tickwire.server.services.table_ops import TableOps, register

__all__: list[str] = []

_NAME = re.compile(r"^[A-Za-z_$][A-Za-z_0-9$]*$")


def _head_tail_by(kind: str) -> Callable[[TableOps, Any, Table], Callable[[], Table]]:
    method = "HeadBy" if kind == "head_by" else "TailBy"

    def build(ops: TableOps, req, source: Table) -> Callable[[], Table]:
        n = int(req.num_rows)
        if n < 0:
            raise CallError(f"numRows must be >= 0 (found: {n})", "INVALID_ARGUMENT")
        if n == 0:
            raise CallError(f"{method}: numRows must be > 0 (found: 0)", "INVALID_ARGUMENT")
        names = source.schema.names
        keys = list(req.group_by_column_specs)
        for k in keys:
            if not _NAME.match(k):
                raise CallError(f"{method}: group-by column {k!r} is not a column name (renames and formulas "
                                f"are not group-by columns here)", "INVALID_ARGUMENT")
            if k not in names:
                raise CallError(f"{method}: unknown group-by column {k!r}; the table has "
                                f"{', '.join(names) or 'no columns'}", "INVALID_ARGUMENT")
        if len(set(keys)) != len(keys):
            raise CallError(f"{method}: a group-by column is named twice in {keys}", "INVALID_ARGUMENT")
        if keys and len(set(keys)) == len(names):
            raise CallError(f"{method}: every column is a group-by column; nothing is left to show",
                            "INVALID_ARGUMENT")
        if source.attributes.get("BlinkTable"):
            raise CallError(f"{method}: blink tables do not support {kind} (their rows leave every cycle)",
                            "INVALID_ARGUMENT")
        return lambda: source._derive(kind, ops.name_for(source, kind), n, keys)  # noqa: SLF001
    return build


def _ungroup(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    schema = source.schema
    cols = list(dict.fromkeys(req.columns_to_ungroup))
    bad = [c for c in cols if not _NAME.match(c)]
    if bad:
        raise CallError(f"Ungroup: invalid column name {bad[0]!r}", "INVALID_ARGUMENT")
    unknown = [c for c in cols if c not in schema.names]
    if unknown:
        raise CallError(f"Ungroup: unknown column names {unknown}, available column names are {schema.names}",
                        "INVALID_ARGUMENT")
    for c in cols:
        if not is_list_type(schema.field(c).type):
            raise CallError(f"Ungroup: column {c} is not an array or Vector (its type is {schema.field(c).type})",
                            "INVALID_ARGUMENT")
    if not cols and not any(is_list_type(f.type) for f in schema):
        # nothing to ungroup: Deephaven answers the source itself; its rows as they are here
        return lambda: source.view(schema.names, name=ops.name_for(source, "ungroup"))
    null_fill = bool(req.null_fill)
    return lambda: source._derive("ungroup", ops.name_for(source, "ungroup"), cols, null_fill)  # noqa: SLF001


register("HeadBy", "head_by", _head_tail_by("head_by"))
register("TailBy", "tail_by", _head_tail_by("tail_by"))
register("Ungroup", "ungroup", _ungroup)
