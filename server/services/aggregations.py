"""Deephaven's aggregation requests (TableService Aggregate, AggregateAll, ComboAggregate and
SelectDistinct, also inside Batch) as `agg_by` tables of the engine.

Each request is translated into `Agg`s (tickwire.server.engine.graph.ops.aggregate), checked against
the source's schema, and made into one incremental derived table. What Deephaven serves and tickwire
does not is refused UNIMPLEMENTED naming the case: approximate percentiles and t-digests, freeze,
and sorted_first/last on more than one column. Formula aggregations are hidden aggregations read
by a view over the agg_by (tickwire.server.services.agg_formula).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import pyarrow as pa

from tickwire.server.engine import Table
from tickwire.server.engine.graph.ops import Agg
from tickwire.server.services.agg_formula import each, formula_aggs, parse_selectable
from tickwire.server.services.dh_expr import ExpressionError, parse_filters
from tickwire.server.services.rpc import CallError
from tickwire.server.services.table_ops import TableOps, register

__all__ = ["aggs_of_request", "aggs_of_spec"]

_PAIR = re.compile(r"^\s*([A-Za-z_$][A-Za-z_0-9$]*)\s*(?:=\s*([A-Za-z_$][A-Za-z_0-9$]*)\s*)?$")

# ComboAggregateRequest.AggType -> AggSpec field
_COMBO = {0: "sum", 1: "abs_sum", 2: "group", 3: "avg", 4: "count", 5: "first", 6: "last", 7: "min", 8: "max",
          9: "median", 10: "percentile", 11: "std", 12: "var", 13: "weighted_avg"}


@dataclass(frozen=True)
class Formula:
    """A formula aggregation: output column `out` computed by `text` over the group's vectors."""

    out: str
    text: str


Aggregation = Union[Agg, Formula]


def _pairs(match_pairs, what: str) -> list[tuple[str, str]]:
    """"Out=In" / "Col" pairs -> (output, input)."""
    out = []
    for p in match_pairs:
        m = _PAIR.match(p)
        if not m:
            raise CallError(f"{what}: cannot parse column pair {p!r} (expected NAME or NAME=COLUMN)",
                            "INVALID_ARGUMENT")
        out.append((m.group(1), m.group(2) or m.group(1)))
    return out


def _sentinel(u) -> Any:
    if not u.HasField("non_unique_sentinel"):
        return None
    s = u.non_unique_sentinel
    which = s.WhichOneof("type")
    if which is None or which == "null_value":
        return None
    return getattr(s, which)


def aggs_of_spec(spec, pairs: list[tuple[str, str]], what: str) -> list[Aggregation]:
    """The Aggs of one AggSpec applied to (output, input) column pairs."""
    which = spec.WhichOneof("type")
    if which is None:
        raise CallError(f"{what}: an aggregation spec is required", "INVALID_ARGUMENT")
    simple = {"abs_sum", "avg", "first", "last", "max", "min", "std", "sum", "var", "group"}
    if which in simple:
        return [Agg(which, c, o) for o, c in pairs]
    if which == "count_distinct":
        return [Agg("count_distinct", c, o, include_nulls=spec.count_distinct.count_nulls) for o, c in pairs]
    if which == "distinct":
        return [Agg("distinct", c, o, include_nulls=spec.distinct.include_nulls) for o, c in pairs]
    if which == "unique":
        u = spec.unique
        if not u.HasField("non_unique_sentinel"):
            raise CallError(f"{what}: AggSpecUnique must have field non_unique_sentinel", "INVALID_ARGUMENT")
        return [Agg("unique", c, o, include_nulls=u.include_nulls, non_unique=_sentinel(u)) for o, c in pairs]
    if which == "median":
        return [Agg("median", c, o, average_evenly_divided=spec.median.average_evenly_divided) for o, c in pairs]
    if which == "percentile":
        p = spec.percentile
        if not 0.0 <= p.percentile <= 1.0:
            raise CallError(f"{what}: percentile must be between 0 and 1, got {p.percentile}", "INVALID_ARGUMENT")
        return [Agg("percentile", c, o, percentile=p.percentile, average_evenly_divided=p.average_evenly_divided)
                for o, c in pairs]
    if which in ("weighted_avg", "weighted_sum"):
        w = getattr(spec, which).weight_column
        return [Agg(which, c, o, other=w) for o, c in pairs]
    if which in ("sorted_first", "sorted_last"):
        cols = [c.column_name for c in getattr(spec, which).columns]
        if len(cols) != 1:
            raise CallError(f"{what}: {which} on {len(cols)} sort columns is not supported (one is)", "UNIMPLEMENTED")
        return [Agg(which, c, o, other=cols[0]) for o, c in pairs]
    if which == "formula":
        f = spec.formula
        try:
            return [Formula(o, text) for o, text in each(f.formula, f.param_token or "each", pairs)]
        except ExpressionError as exc:
            raise CallError(f"{what}: formula: {exc}", "INVALID_ARGUMENT") from None
    raise CallError(f"{what}: aggregation {which!r} is not supported", "UNIMPLEMENTED")


def aggs_of_request(req, schema: Optional[pa.Schema] = None, clock=None) -> list[Aggregation]:
    """The Aggs (and Formulas) of an AggregateRequest's aggregations (`schema`: the source's, for
    count_where's filters; `clock`: what their now() reads)."""
    out: list[Aggregation] = []
    for i, a in enumerate(req.aggregations):
        which = a.WhichOneof("type")
        what = f"Aggregate: aggregation {i}"
        if which == "columns":
            out.extend(aggs_of_spec(a.columns.spec, _pairs(a.columns.match_pairs, what), what))
        elif which == "count":
            out.append(Agg("count", name=_name(a.count.column_name, what)))
        elif which in ("first_row_key", "last_row_key"):
            out.append(Agg(which, name=_name(getattr(a, which).column_name, what)))
        elif which == "partition":
            out.append(Agg("partition", name=_name(a.partition.column_name, what)))
        elif which == "formula":
            try:
                o, text = parse_selectable(a.formula.selectable.raw)
            except ExpressionError as exc:
                raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None
            out.append(Formula(o, text))
        elif which == "count_where" and schema is not None:
            cw = a.count_where
            try:
                where = parse_filters(list(cw.filters), schema, clock=clock)
            except ExpressionError as exc:
                raise CallError(f"{what}: count_where: {exc}", "INVALID_ARGUMENT") from None
            out.append(Agg("count_where", name=_name(cw.column_name, what), where=where))
        elif which is None:
            raise CallError(f"{what}: no aggregation given", "INVALID_ARGUMENT")
        else:
            raise CallError(f"{what}: aggregation {which!r} is not supported", "UNIMPLEMENTED")
    return out


def _name(name: str, what: str) -> str:
    if not _PAIR.match(name) or "=" in name:
        raise CallError(f"{what}: {name!r} is not a column name", "INVALID_ARGUMENT")
    return name


def _keys(names, schema: pa.Schema, what: str) -> list[str]:
    keys = list(dict.fromkeys(n.strip() for n in names))  # a column named twice is one key, as in Deephaven
    for k in keys:
        if k not in schema.names:
            raise CallError(f"{what}: unknown group-by column {k!r}", "INVALID_ARGUMENT")
    return keys


def _combo(req, schema: pa.Schema, keys: list[str]) -> list[Agg]:
    out: list[Agg] = []
    for i, a in enumerate(req.aggregates):
        what = f"ComboAggregate: aggregate {i}"
        kind = _COMBO.get(a.type)
        if kind is None:
            raise CallError(f"{what}: unknown aggregation type {a.type}", "INVALID_ARGUMENT")
        if kind == "count":
            out.append(Agg("count", name=_name(a.column_name, what)))
            continue
        # as Deephaven: no column pairs means every column that is not a key (nor the weight)
        pairs = _pairs(a.match_pairs, what) or [(n, n) for n in schema.names
                                                if n not in keys and n != a.column_name]
        if kind == "weighted_avg":
            out.extend(Agg("weighted_avg", c, o, other=a.column_name) for o, c in pairs)
        elif kind == "percentile":
            out.extend(Agg("percentile", c, o, percentile=a.percentile, average_evenly_divided=a.avg_median)
                       for o, c in pairs)
        elif kind == "median":  # as Deephaven: averaged, and avg_median is refused for MEDIAN
            if a.avg_median:
                raise CallError(f"{what}: avg_median is specified for type MEDIAN", "INVALID_ARGUMENT")
            out.extend(Agg("median", c, o, average_evenly_divided=True) for o, c in pairs)
        else:
            out.extend(Agg(kind, c, o) for o, c in pairs)
    return out


def _builder(kind: str) -> Callable[[TableOps, Any, Table], Callable[[], Table]]:
    def build(ops: TableOps, req, source: Table, initial_groups_id: Optional[Table] = None) -> Callable[[], Table]:
        schema = source.schema
        initial: Optional[Table] = None
        preserve = False
        order: Optional[list[str]] = None  # the output's column order, when not keys first
        aggs: list[Aggregation]
        if kind == "aggregate":
            keys = _keys(req.group_by_columns, schema, "Aggregate")
            if not req.aggregations:
                raise CallError("Aggregate: AggregateRequest must have at least one aggregation", "INVALID_ARGUMENT")
            aggs = aggs_of_request(req, schema, ops.engine.clock)
            preserve = bool(req.preserve_empty)
            if initial_groups_id is not None:
                if not keys:
                    raise CallError("Aggregate: initial_groups needs group-by columns", "INVALID_ARGUMENT")
                initial = initial_groups_id
                missing = [k for k in keys if k not in initial.schema.names]
                if missing:
                    raise CallError(f"Aggregate: initial_groups has no column {missing[0]!r}", "INVALID_ARGUMENT")
        elif kind == "aggregate_all":
            keys = _keys(req.group_by_columns, schema, "AggregateAll")
            spec = req.spec
            which = spec.WhichOneof("type")
            skip = set(keys)
            if which in ("weighted_avg", "weighted_sum"):
                skip.add(getattr(spec, which).weight_column)
            pairs = [(n, n) for n in schema.names if n not in skip]
            aggs = aggs_of_spec(spec, pairs, "AggregateAll")
            if which in ("first", "last"):  # as Deephaven: first_by and last_by keep the source's order
                order = [n for n in schema.names if n in set(keys) or n not in skip]
        elif kind == "combo_aggregate":
            keys = _keys(req.group_by_columns, schema, "ComboAggregate")
            aggs = list(_combo(req, schema, keys))
            if req.aggregates and all(a.type in (5, 6) and not a.match_pairs for a in req.aggregates):
                order = list(schema.names)  # FIRST/LAST of every column keep the source's order
        else:  # select_distinct
            keys = _keys(req.column_names, schema, "SelectDistinct")
            aggs = []
        formulas = [(a.out, a.text) for a in aggs if isinstance(a, Formula)]
        plain = [a for a in aggs if isinstance(a, Agg)]
        for a in plain:
            for c in (a.column, a.other):
                if c is not None and c not in schema.names:
                    raise CallError(f"{kind}: unknown column {c!r}", "INVALID_ARGUMENT")
        view: Optional[list] = None  # formula aggregations: the view over the agg_by that computes them
        if formulas:
            try:
                plan = formula_aggs(formulas, schema, keys, ops.engine.clock)
            except ExpressionError as exc:
                raise CallError(f"{kind}: formula aggregation: {exc}", "INVALID_ARGUMENT") from None
            outs = keys + [a.out for a in aggs]
            dup = sorted({n for n in outs if outs.count(n) > 1})
            if dup:
                raise CallError(f"{kind}: output column {dup[0]!r} is produced twice", "INVALID_ARGUMENT")
            computed = dict(plan.columns)
            view = [(n, computed[n]) if n in computed else n for n in (order or outs)]
            plain = plain + plan.hidden
            order = None

        for a in plain:
            if a.kind == "unique" and a.non_unique is not None and a.column in schema.names:
                try:
                    pa.scalar(a.non_unique, schema.field(a.column).type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                    raise CallError(f"{kind}: non-unique sentinel {a.non_unique!r} is not a value of column "
                                    f"{a.column!r} ({schema.field(a.column).type})", "INVALID_ARGUMENT") from None

        def make() -> Table:
            groups = None
            if initial is not None:  # the groups it names, read at one cycle boundary, come first
                groups = initial.to_arrow().select(keys)
                groups = groups.cast(pa.schema([schema.field(k) for k in keys]))
            made = source.agg_by(plain, keys, name=ops.name_for(source, kind), preserve_empty=preserve,
                                 initial_groups=groups, column_order=order)
            if view is None:
                return made
            ops.adopt(made)  # removed with the view that reads it
            try:
                return made.view(view, name=ops.name_for(source, kind))
            except BaseException:
                ops.drop(made)
                raise
        return make
    return build


register("Aggregate", "aggregate", _builder("aggregate"), extra_sources=("initial_groups_id",))
for _method, _field in (("AggregateAll", "aggregate_all"), ("ComboAggregate", "combo_aggregate"),
                        ("SelectDistinct", "select_distinct")):
    register(_method, _field, _builder(_field))
