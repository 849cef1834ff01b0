"""Deephaven's join-family TableService operations (also inside Batch) as incremental tables of the
engine with several parents (tickwire.server.engine.graph.ops.natural_join, where_in, merge,
as_of_join, cross_join, multi_join, snapshot_when):

- NaturalJoinTables (with its join_type: error on a duplicate right key, first or last match,
  exactly one match), ExactJoinTables, WhereIn (inverted: where_not_in);
- columns_to_match: "Key" or "LeftKey=RightKey"; columns_to_add: "Name" or "NewName=RightName",
  none meaning every right column that is not a match column.

The rules a real Deephaven 42.7 keeps are compared in tests/test_join_conformance.py.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from tickwire.server.engine import OperationError, Table, TableSpec, column_pairs
from tickwire.server.engine.graph.ops.join_keys import check_keys
from tickwire.server.engine.graph.ops.range_join import range_join_values
from tickwire.server.services.rpc import CallError
from tickwire.server.services.table_ops import TableOps, register

__all__: list[str] = []

# NaturalJoinTablesRequest.join_type -> the engine's match rule
_MATCH = {0: "error", 1: "error", 2: "first", 3: "last", 4: "exactly_one"}


def _pairs(specs, what: str) -> list[tuple[str, str]]:
    try:
        return column_pairs([str(s) for s in specs])
    except ValueError as exc:
        raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None


def _right(req, right_id: Optional[Table], what: str) -> Table:
    if right_id is None:
        raise CallError(f"{what}: right_id not supplied", "INVALID_ARGUMENT")
    return right_id


def _joins(req) -> Optional[list[tuple[str, str]]]:
    """columns_to_add as (output, right column) pairs; None (every right non-key column) when empty."""
    return _pairs(req.columns_to_add, "columns_to_add") if len(req.columns_to_add) else None


def _natural(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
    right = _right(req, right_id, "NaturalJoinTables")
    match = _MATCH.get(int(req.join_type))
    if match is None:
        raise CallError(f"NaturalJoinTables: unknown join_type {int(req.join_type)}", "INVALID_ARGUMENT")
    on = _pairs(req.columns_to_match, "columns_to_match")
    joins = _joins(req)
    return lambda: left.natural_join(right, on, joins, name=ops.name_for(left, "natural_join"), match=match)


def _exact(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
    right = _right(req, right_id, "ExactJoinTables")
    on = _pairs(req.columns_to_match, "columns_to_match")
    joins = _joins(req)
    return lambda: left.exact_join(right, on, joins, name=ops.name_for(left, "exact_join"))


def _where_in(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
    right = _right(req, right_id, "WhereIn")
    on = _pairs(req.columns_to_match, "columns_to_match")
    inverted = bool(req.inverted)
    return lambda: left.where_in(right, on, name=ops.name_for(left, "where_not_in" if inverted else "where_in"),
                                 inverted=inverted)


def _merge(ops: TableOps, req, first: Table, sources: Optional[list] = None) -> Callable[[], Table]:
    tables = list(sources or [first])
    key = str(req.key_column)
    if key and key not in first.schema.names:
        raise CallError(f"MergeTables: unknown key column {key!r}", "INVALID_ARGUMENT")

    def make() -> Table:
        merged = first.merge(tables[1:], name=ops.name_for(first, "merge"))
        if not key:
            return merged
        # as Deephaven: merged, then sorted by the key column (a static merge sorts too)
        ops.adopt(merged)
        return merged.sort([key], name=ops.name_for(merged, "sort"))
    return make


_AS_OF = re.compile(r"\A\s*([a-zA-Z_$][a-zA-Z0-9_$]*)\s*(>=?|<=?)\s*([a-zA-Z_$][a-zA-Z0-9_$]*)\s*\Z")
_NAME = re.compile(r"\A\s*([a-zA-Z_$][a-zA-Z0-9_$]*)\s*\Z")
_RULE_NAMES = {">=": "GREATER_THAN_EQUAL", ">": "GREATER_THAN", "<=": "LESS_THAN_EQUAL", "<": "LESS_THAN"}


def _as_of_column(spec: str, kind: str) -> tuple[tuple[str, str], str]:
    """AjRajTablesRequest.as_of_column as Deephaven reads it: "Ts" (aj: Ts>=Ts, raj: Ts<=Ts) or
    "LeftTs OP RightTs" (aj: >= or >, raj: <= or <)."""
    bare = _NAME.match(spec)
    if bare:
        name = bare.group(1)
        return (name, name), (">=" if kind == "aj" else "<=")
    m = _AS_OF.match(spec)
    if m is None:
        raise CallError(f"Input expression {spec} does not match expected pattern {_AS_OF.pattern}", "INVALID_ARGUMENT")
    left, rule, right = m.group(1), m.group(2), m.group(3)
    if rule not in ((">=", ">") if kind == "aj" else ("<=", "<")):
        raise CallError(f"Unsupported operation for {kind}: {_RULE_NAMES[rule]}", "INVALID_ARGUMENT")
    return (left, right), rule


def _as_of(kind: str) -> Callable[..., Callable[[], Table]]:
    method = "AjTables" if kind == "aj" else "RajTables"

    def build(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
        right = _right(req, right_id, method)
        on = _pairs(req.exact_match_columns, "exact_match_columns")
        stamp, rule = _as_of_column(str(req.as_of_column), kind)
        joins = _joins(req)
        return lambda: left._derive("as_of_join", ops.name_for(left, kind), right, on, stamp, rule,  # noqa: SLF001
                                    joins)
    return build


register("AjTables", "aj", _as_of("aj"), extra_sources=("right_id",), source_field="left_id")
register("RajTables", "raj", _as_of("raj"), extra_sources=("right_id",), source_field="left_id")
def _cross(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
    right = _right(req, right_id, "CrossJoinTables")
    on = _pairs(req.columns_to_match, "columns_to_match")
    joins = _joins(req)
    bits = int(req.reserve_bits) or 10  # Deephaven's default when the request leaves it 0
    return lambda: left.join(right, on, joins, name=ops.name_for(left, "join"), reserve_bits=bits)


def _multi(ops: TableOps, req, first: Table, sources: Optional[list] = None) -> Callable[[], Table]:
    tables = list(sources or [first])
    specs = []
    for inp, t in zip(req.multi_join_inputs, tables):
        on = _pairs(inp.columns_to_match, "columns_to_match")
        joins = _pairs(inp.columns_to_add, "columns_to_add") if len(inp.columns_to_add) else None
        specs.append((t, on, joins))
    return lambda: first._derive("multi_join", ops.name_for(first, "multi_join"), specs)  # noqa: SLF001


def _snapshot_when(ops: TableOps, req, base: Table, trigger_id: Optional[Table] = None) -> Callable[[], Table]:
    if trigger_id is None:
        raise CallError("SnapshotWhen: trigger_id not supplied", "INVALID_ARGUMENT")
    trigger = trigger_id
    if req.history and (req.initial or req.incremental):
        raise CallError("snapshotWhen with history does not currently support incremental nor initial. "
                        "See https://github.com/deephaven/deephaven-core/issues/3260.", "UNIMPLEMENTED")
    stamps = _pairs(req.stamp_columns, "stamp_columns") if len(req.stamp_columns) else None
    return lambda: base.snapshot_when(trigger, stamps, bool(req.initial), bool(req.incremental), bool(req.history),
                                      name=ops.name_for(base, "snapshot_when"))


# AsOfJoinTablesRequest.as_of_match_rule -> the rule as AjTables/RajTables write it
_LEGACY_RULES = {0: ">=", 1: ">", 2: "<=", 3: "<"}


def _legacy_as_of(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
    """Deephaven's older AsOfJoinTables: the stamp is the last match column ("Ts" or "Ts=RTs")."""
    right = _right(req, right_id, "AsOfJoinTables")
    match = [str(c) for c in req.columns_to_match]
    if not match:
        raise CallError("AsOfJoinTables: no columns to match (the last one is the stamp)", "INVALID_ARGUMENT")
    for c in match:
        if any(r in c for r in ("<", ">")):
            raise CallError(f'Unable to parse expression: "{c}": {c}', "INVALID_ARGUMENT")
    rule = _LEGACY_RULES.get(int(req.as_of_match_rule))
    if rule is None:
        raise CallError(f"AsOfJoinTables: unknown as_of_match_rule {int(req.as_of_match_rule)}", "INVALID_ARGUMENT")
    pairs = _pairs(match, "columns_to_match")
    joins = _joins(req)
    kind = "aj" if rule in (">=", ">") else "raj"
    return lambda: left._derive("as_of_join", ops.name_for(left, kind), right, pairs[:-1], pairs[-1],  # noqa: SLF001
                                rule, joins)


_RANGE = re.compile(r"\A\s*(<-)?\s*([a-zA-Z_$][a-zA-Z0-9_$]*)\s*(<=?)\s*([a-zA-Z_$][a-zA-Z0-9_$]*)\s*(<=?)\s*"
                    r"([a-zA-Z_$][a-zA-Z0-9_$]*)\s*(->)?\s*\Z")
# RangeJoinTablesRequest's rules -> range_join's
_START = {1: "<", 2: "<=", 3: "<-<="}
_END = {1: "<", 2: "<=", 3: "<=->"}


def _range_rules(req) -> tuple[str, str, str, str, str]:
    """(left start column, start rule, right range column, end rule, left end column)."""
    text = str(req.range_match)
    if text:
        m = _RANGE.match(text)
        if m is None:
            raise CallError(f"Input expression {text} does not match expected pattern {_RANGE.pattern}",
                            "INVALID_ARGUMENT")
        pre, ls, r1, rp, r2, le, post = m.groups()
        if pre and r1 != "<=":
            raise CallError(f'Error parsing expression {text}: <- operator for "allow preceding" may only be '
                            f'combined with <= start match expression', "INVALID_ARGUMENT")
        if post and r2 != "<=":
            raise CallError(f'Error parsing expression {text}: -> operator for "allow following" may only be '
                            f'combined with <= end match expression', "INVALID_ARGUMENT")
        return ls, ("<-<=" if pre else r1), rp, ("<=->" if post else r2), le
    start, end = _START.get(int(req.range_start_rule)), _END.get(int(req.range_end_rule))
    if start is None or end is None:
        raise CallError("RangeJoinTables: range_start_rule and range_end_rule are required", "INVALID_ARGUMENT")
    return str(req.left_start_column), start, str(req.right_range_column), end, str(req.left_end_column)


def _range_join(ops: TableOps, req, left: Table, right_id: Optional[Table] = None) -> Callable[[], Table]:
    """Deephaven 42.7's range_join: static inputs, group aggregations only."""
    right = _right(req, right_id, "RangeJoinTables")
    on = _pairs(req.exact_match_columns, "exact_match_columns")
    ls, start_rule, rp, end_rule, le = _range_rules(req)
    if not len(req.aggregations):
        raise CallError("io.deephaven.proto.backplane.grpc.RangeJoinTablesRequest must have at least one "
                        "aggregations (10)", "INVALID_ARGUMENT")
    groups: list[tuple[str, str]] = []
    other: list[str] = []
    for agg in req.aggregations:
        which = agg.WhichOneof("type")
        if which == "columns" and agg.columns.spec.WhichOneof("type") == "group":
            groups += _pairs(agg.columns.match_pairs, "aggregations")
        else:
            other.append(str(which if which != "columns" else agg.columns.spec.WhichOneof("type")))
    what = (f"rangeJoin[exactMatches=[{', '.join(a for a, _b in on)}], "
            f"rangeMatch={ls} {start_rule} {rp} {end_rule} {le}]")
    if other:
        raise CallError(f'{what}: rangeJoin only supports the "group" aggregation at this time - unsupported '
                        f"aggregations were requested: [{', '.join(other)}]", "INVALID_ARGUMENT")
    if left.is_refreshing or right.is_refreshing:
        state = (f"left table is {'refreshing' if left.is_refreshing else 'static'}, right table is "
                 f"{'refreshing' if right.is_refreshing else 'static'}")
        raise CallError(f"{what}: rangeJoin only supports static (not refreshing) inputs at this time: {state}",
                        "INVALID_ARGUMENT")
    missing_l = [c for c in [a for a, _b in on] + [ls, le] if c not in left.schema.names]
    missing_r = [c for c in [b for _a, b in on] + [rp] + [c for _n, c in groups] if c not in right.schema.names]
    for t, missing in ((left, missing_l), (right, missing_r)):
        if missing:
            raise CallError(f"Unknown column names [{', '.join(missing)}], available column names are "
                            f"[{', '.join(t.schema.names)}]", "INVALID_ARGUMENT")
    try:
        check_keys("range_join", left, right, on)
    except OperationError as exc:
        raise CallError(str(exc), "INVALID_ARGUMENT") from None
    for c in (ls, le):
        if left.schema.field(c).type != right.schema.field(rp).type:
            raise CallError(f"range_join: {c} ({left.schema.field(c).type}) and {rp} "
                            f"({right.schema.field(rp).type}) have different types", "INVALID_ARGUMENT")

    def make() -> Table:
        data = range_join_values(left.gather(), right.gather(), on, ls, start_rule, rp, end_rule, le, groups)
        table, _ = ops.engine.get_or_create(TableSpec(ops.name_for(left, "range_join"), "static", data=data,
                                                      hidden=True))
        return table
    return make


register("RangeJoinTables", "range_join", _range_join, extra_sources=("right_id",), source_field="left_id")
register("SnapshotWhen", "snapshot_when", _snapshot_when, extra_sources=("trigger_id",), source_field="base_id")
register("AsOfJoinTables", "as_of_join", _legacy_as_of, extra_sources=("right_id",), source_field="left_id")
register("MultiJoinTables", "multi_join", _multi,
         source_list=lambda req: [i.source_id for i in req.multi_join_inputs])
register("CrossJoinTables", "cross_join", _cross, extra_sources=("right_id",), source_field="left_id")
register("MergeTables", "merge", _merge, source_list=lambda req: list(req.source_ids))
register("NaturalJoinTables", "natural_join", _natural, extra_sources=("right_id",), source_field="left_id")
register("ExactJoinTables", "exact_join", _exact, extra_sources=("right_id",), source_field="left_id")
register("WhereIn", "where_in", _where_in, extra_sources=("right_id",), source_field="left_id")
