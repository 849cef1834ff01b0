"""TableService UpdateBy (also inside Batch): Deephaven's UpdateByRequest as an incremental
update_by table of the engine (tickwire.server.engine.graph.ops.update_by).

Each UpdateByOperation is a column operation (its spec and "Out=In" match pairs, none meaning every
column that is not a `group_by_columns` column); windows and decays come as ticks or as a time
column with nanoseconds or an ISO-8601 duration. rolling_formula is served for arithmetic over
aggregations of the parameter (the engine's updateby.formula_op), others are refused (UNIMPLEMENTED)
naming the part not read. count_where filters are Deephaven filter strings (dh_expr).
"""
from __future__ import annotations

from typing import Callable, Optional

import pyarrow as pa

from tickwire.server.engine import OperationError, Table, column_pairs
from tickwire.server.engine.graph.ops import expression_columns
from tickwire.server.engine.updateby import UpdateByOp, formula_op, nanos
from tickwire.server.services.dh_expr import ExpressionError, parse_filters
from tickwire.server.services.rpc import CallError
from tickwire.server.services.table_ops import TableOps, register

__all__: list[str] = []

_BEHAVIOUR = {1: "throw", 2: "reset", 3: "skip", 4: "poison"}
_DELTA = {0: "null_dominates", 1: "null_dominates", 2: "value_dominates", 3: "zero_dominates"}
_EM = {"ema": "ema", "ems": "ems", "em_min": "em_min", "em_max": "em_max", "em_std": "em_std"}
_ROLLING = {"rolling_sum": "rolling_sum", "rolling_avg": "rolling_avg", "rolling_min": "rolling_min",
            "rolling_max": "rolling_max", "rolling_product": "rolling_prod", "rolling_count": "rolling_count",
            "rolling_std": "rolling_std", "rolling_wavg": "rolling_wavg", "rolling_group": "rolling_group",
            "rolling_count_where": "rolling_count_where"}
_CUMULATIVE = {"sum": "cum_sum", "min": "cum_min", "max": "cum_max", "product": "cum_prod", "fill": "fill"}

#: the kinds that take a column of any type; the others take numbers (as Deephaven's applicableTo)
_ANY_TYPE = ("fill", "rolling_group", "rolling_count")


def _pairs(specs, by: list[str], source: Table, what: str, kind: str = "") -> tuple[tuple[str, str], ...]:
    """The (output, input) pairs of "Out=In" specs; none: every column the operation applies to
    that is not a `by` column (as Deephaven, other columns are passed over, not refused)."""
    if not len(specs):
        return tuple((f.name, f.name) for f in source.schema if f.name not in by and
                     (kind in _ANY_TYPE or pa.types.is_integer(f.type) or pa.types.is_floating(f.type)))
    try:
        return tuple(column_pairs([str(s) for s in specs]))
    except ValueError as exc:
        raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None


def _scale(scale, what: str) -> tuple[Optional[str], float]:
    """(time column or None, ticks or nanoseconds) of an UpdateByWindowScale."""
    which = scale.WhichOneof("type")
    if which == "ticks":
        return None, float(scale.ticks.ticks)
    if which == "time":
        tm = scale.time
        try:
            amount = tm.nanos if tm.WhichOneof("window") == "nanos" else nanos(tm.duration_string)
        except OperationError as exc:
            raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None
        return str(tm.column), float(amount)
    return None, 0.0


def _control(options) -> tuple[tuple[str, str], ...]:
    out = []
    for key, fld in (("on_null", "on_null_value"), ("on_nan", "on_nan_value"), ("on_null_time", "on_null_time"),
                     ("on_negative_time", "on_negative_delta_time"), ("on_zero_time", "on_zero_delta_time")):
        v = _BEHAVIOUR.get(int(getattr(options, fld)))
        if v is not None:
            out.append((key, v))
    return tuple(out)


def _filters(texts, source: Table, what: str):
    try:
        expr = parse_filters([str(t) for t in texts], source.schema)
    except ExpressionError as exc:
        raise CallError(f"{what}: {exc}", "INVALID_ARGUMENT") from None
    return expr, tuple(expression_columns(expr, source.schema))


def _operation(op, by: list[str], source: Table) -> UpdateByOp:
    if op.WhichOneof("type") != "column":
        raise CallError("UpdateBy: an operation without a column specification", "INVALID_ARGUMENT")
    spec = op.column.spec
    which = spec.WhichOneof("type")
    what = f"UpdateBy {which}"
    if which is None:
        raise CallError("UpdateBy: an operation without a spec", "INVALID_ARGUMENT")
    body = getattr(spec, which)
    if which in _CUMULATIVE:
        return UpdateByOp(_CUMULATIVE[which], _pairs(op.column.match_pairs, by, source, what, _CUMULATIVE[which]))
    if which == "delta":
        return UpdateByOp("delta", _pairs(op.column.match_pairs, by, source, what, "delta"),
                          delta=_DELTA.get(int(body.options.null_behavior), "null_dominates"))
    if which == "count_where":
        expr, cols = _filters(body.filters, source, what)
        return UpdateByOp("cum_count_where", ((str(body.result_column), ""),), filters=expr, filter_columns=cols)
    if which in _EM:
        col, amount = _scale(body.window_scale, what)
        control = _control(body.options)
        pairs = _pairs(op.column.match_pairs, by, source, what, _EM[which])
        if col is None:
            return UpdateByOp(_EM[which], pairs, decay_ticks=amount, control=control)
        return UpdateByOp(_EM[which], pairs, time_col=col, decay_time=int(amount), control=control)
    if which in _ROLLING or which == "rolling_formula":
        rcol, rev = _scale(body.reverse_window_scale, what)
        fcol, fwd = _scale(body.forward_window_scale, what)
        col = rcol or fcol
        kind = _ROLLING.get(which, "")
        _check_window(rev, fwd, timed=col is not None, empty_ok=kind == "rolling_group", what=what)
        extra: dict = {}
        if which == "rolling_wavg":
            extra["weight"] = str(body.weight_column)
        if which == "rolling_formula":
            kind, formula = _formula(str(body.formula), str(body.param_token))
            extra.update(formula)
        if which == "rolling_count_where":
            expr, cols = _filters(body.filters, source, what)
            return UpdateByOp(kind, ((str(body.result_column), ""),), time_col=col, rev=int(rev), fwd=int(fwd),
                              filters=expr, filter_columns=cols)
        return UpdateByOp(kind, _pairs(op.column.match_pairs, by, source, what, kind), time_col=col, rev=int(rev),
                          fwd=int(fwd), **extra)
    raise CallError(f"UpdateBy: operation {which!r} is not supported", "UNIMPLEMENTED")


#: what Deephaven's UpdateBy service puts for a rolling formula's parameter
_PARAM = "__PARAM_COLUMN__"


def _formula(formula: str, token: str) -> tuple[str, dict]:
    """formula_op of a rolling_formula request. As Deephaven 42.7's UpdateBy service, the parameter
    is replaced as plain text, every occurrence, inside other names too: with the parameter `x`,
    `max(x)` becomes `ma__PARAM_COLUMN__(__PARAM_COLUMN__)` and is refused (its scripts do not do
    this; Table.update_by does not either)."""
    try:
        if token and token in formula:
            replaced = formula.replace(token, _PARAM)
            try:
                return formula_op(replaced, _PARAM)
            except OperationError:
                formula_op(formula, token)  # served but for the replacement: say so
                raise CallError(f"UpdateBy: rolling_formula {formula!r}: its parameter {token!r} also occurs inside "
                                f"another name, and every occurrence is replaced, as Deephaven replaces it "
                                f"(giving {replaced!r}); name the parameter so that it occurs only as itself",
                                "INVALID_ARGUMENT") from None
        return formula_op(formula, token)
    except OperationError as exc:
        raise CallError(f"UpdateBy {exc}", "UNIMPLEMENTED") from None


def _check_window(rev: float, fwd: float, timed: bool, empty_ok: bool, what: str) -> None:
    """As Deephaven: a window of negative size (reverse + forward) is refused, and so is a tick
    window of no rows, but for rolling_group (whose windows are then empty lists)."""
    size = rev + fwd
    if size < 0 or (size == 0 and not timed and not empty_ok):
        unit = "nanoseconds" if timed else "ticks"
        raise CallError(f"{what}: a window of {size:g} {unit} (reverse {rev:g} plus forward {fwd:g}) holds no "
                        f"rows", "INVALID_ARGUMENT")


def _update_by(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    by = [str(c) for c in req.group_by_columns]
    specs = [_operation(op, by, source) for op in req.operations]
    if not specs:
        raise CallError("UpdateBy: no operations given", "INVALID_ARGUMENT")
    return lambda: source.update_by(specs, by, name=ops.name_for(source, "update_by"))


register("UpdateBy", "update_by", _update_by)
