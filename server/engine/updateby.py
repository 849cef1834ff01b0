"""update_by operations for `Table.update_by`, named as Deephaven's Python API names them.

``t.update_by([cum_sum("Total=Qty"), ema_tick(10, "Ema=Px"), rolling_avg_tick("Avg=Px", rev_ticks=10)],
by="Sym")``. Columns are "Out=In" pairs or names (output named like its input replaces it). Times
are nanoseconds or ISO-8601 durations ("PT1m"); `op_control` is a dict of CONTROLS keys to
"throw", "reset", "skip" or "poison".
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence, Union

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.ops.update_by import BEHAVIOURS, CONTROLS, DELTAS, UpdateByOp
from tickwire.server.engine.graph.ops.update_by_formula import AGGREGATIONS
from tickwire.server.engine.graph.ops.update_by_formula import parse as formula_parse
from tickwire.server.engine.graph.ops.update_by_formula import single as formula_single
from tickwire.server.engine.graph.tables import column_pairs

__all__ = ["UpdateByOp", "cum_sum", "cum_prod", "cum_min", "cum_max", "forward_fill", "delta", "cum_count_where",
           "ema_tick", "ema_time", "ems_tick", "ems_time", "emmin_tick", "emmin_time", "emmax_tick", "emmax_time",
           "emstd_tick", "emstd_time", "rolling_sum_tick", "rolling_sum_time", "rolling_avg_tick", "rolling_avg_time",
           "rolling_min_tick", "rolling_min_time", "rolling_max_tick", "rolling_max_time", "rolling_prod_tick",
           "rolling_prod_time", "rolling_count_tick", "rolling_count_time", "rolling_std_tick", "rolling_std_time",
           "rolling_wavg_tick", "rolling_wavg_time", "rolling_group_tick", "rolling_group_time",
           "rolling_count_where_tick", "rolling_count_where_time", "rolling_formula_tick", "rolling_formula_time",
           "formula_op", "nanos"]

Cols = Union[str, Sequence[str]]
Time = Union[int, str]

_DURATION = re.compile(r"^(-)?PT(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(-?\d+(?:\.\d+)?)S)?$", re.IGNORECASE)
_CLOCK = re.compile(r"^(-)?PT(\d+):(\d{1,2}):(\d{1,2}(?:\.\d{1,9})?)$", re.IGNORECASE)


def nanos(t: Time) -> int:
    """Nanoseconds of an int, an ISO-8601 duration ("PT1m", "PT0.5S", "-PT20s") or Deephaven's
    clock form ("PT00:00:10", "-PT00:00:20")."""
    if isinstance(t, bool):
        raise OperationError(f"not a duration: {t!r}")
    if isinstance(t, int):
        return t
    text = str(t).strip()
    m = _CLOCK.match(text)
    if m:
        sign, h, mi, sec = m.groups()
        total = int(h) * 3600 + int(mi) * 60
        value = total * 1_000_000_000 + round(float(sec) * 1e9)
        return -value if sign else value
    m = _DURATION.match(text)
    if m and any(m.groups()[1:]):
        sign, h, mi, sec = m.groups()
        value = round(float(h or 0) * 3600e9) + round(float(mi or 0) * 60e9) + round(float(sec or 0) * 1e9)
        return -value if sign else value
    raise OperationError(f"not a duration: {t!r} (nanoseconds or an ISO-8601 duration such as PT1m)")


def _pairs(cols: Cols) -> tuple[tuple[str, str], ...]:
    return tuple(column_pairs([cols] if isinstance(cols, str) else list(cols)))


def _control(op_control: Optional[dict[str, str]]) -> tuple[tuple[str, str], ...]:
    if not op_control:
        return ()
    out = []
    for k, v in op_control.items():
        v = str(v).lower()
        if k not in CONTROLS or v not in BEHAVIOURS:
            raise OperationError(f"operation control {k}={v!r}: keys {', '.join(CONTROLS)}, values "
                                 f"{', '.join(BEHAVIOURS)}")
        out.append((k, v))
    return tuple(out)


def cum_sum(cols: Cols) -> UpdateByOp:
    return UpdateByOp("cum_sum", _pairs(cols))


def cum_prod(cols: Cols) -> UpdateByOp:
    return UpdateByOp("cum_prod", _pairs(cols))


def cum_min(cols: Cols) -> UpdateByOp:
    return UpdateByOp("cum_min", _pairs(cols))


def cum_max(cols: Cols) -> UpdateByOp:
    return UpdateByOp("cum_max", _pairs(cols))


def forward_fill(cols: Cols) -> UpdateByOp:
    return UpdateByOp("fill", _pairs(cols))


def delta(cols: Cols, delta_control: str = "null_dominates") -> UpdateByOp:
    if delta_control not in DELTAS:
        raise OperationError(f"delta control {delta_control!r}: one of {', '.join(DELTAS)}")
    return UpdateByOp("delta", _pairs(cols), delta=delta_control)


def cum_count_where(col: str, filters: Any, filter_columns: Sequence[str] = ()) -> UpdateByOp:
    """`filters`: a pyarrow Expression over `filter_columns`."""
    return UpdateByOp("cum_count_where", ((col, ""),), filters=filters, filter_columns=tuple(filter_columns))


def _em(kind: str, cols: Cols, ticks: Optional[float] = None, ts_col: Optional[str] = None,
        decay_time: Optional[Time] = None, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    if ts_col is None:
        if ticks is None or not ticks >= 0:  # as Deephaven, 0 is taken (alpha 0)
            raise OperationError(f"{kind}: decay ticks must not be negative (got {ticks!r})")
        return UpdateByOp(kind, _pairs(cols), decay_ticks=float(ticks), control=_control(op_control))
    assert decay_time is not None
    d = nanos(decay_time)
    if d < 0:
        raise OperationError(f"{kind}: decay time must not be negative (got {decay_time!r})")
    return UpdateByOp(kind, _pairs(cols), time_col=ts_col, decay_time=d, control=_control(op_control))


def ema_tick(decay_ticks: float, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("ema", cols, decay_ticks, op_control=op_control)


def ema_time(ts_col: str, decay_time: Time, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("ema", cols, ts_col=ts_col, decay_time=decay_time, op_control=op_control)


def ems_tick(decay_ticks: float, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("ems", cols, decay_ticks, op_control=op_control)


def ems_time(ts_col: str, decay_time: Time, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("ems", cols, ts_col=ts_col, decay_time=decay_time, op_control=op_control)


def emmin_tick(decay_ticks: float, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("em_min", cols, decay_ticks, op_control=op_control)


def emmin_time(ts_col: str, decay_time: Time, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("em_min", cols, ts_col=ts_col, decay_time=decay_time, op_control=op_control)


def emmax_tick(decay_ticks: float, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("em_max", cols, decay_ticks, op_control=op_control)


def emmax_time(ts_col: str, decay_time: Time, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("em_max", cols, ts_col=ts_col, decay_time=decay_time, op_control=op_control)


def emstd_tick(decay_ticks: float, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("em_std", cols, decay_ticks, op_control=op_control)


def emstd_time(ts_col: str, decay_time: Time, cols: Cols, op_control: Optional[dict[str, str]] = None) -> UpdateByOp:
    return _em("em_std", cols, ts_col=ts_col, decay_time=decay_time, op_control=op_control)


def _tick(kind: str, cols: Cols, rev_ticks: int, fwd_ticks: int, **extra: Any) -> UpdateByOp:
    return UpdateByOp(kind, _pairs(cols) if cols else (), rev=int(rev_ticks), fwd=int(fwd_ticks), **extra)


def _time(kind: str, ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time, **extra: Any) -> UpdateByOp:
    return UpdateByOp(kind, _pairs(cols) if cols else (), time_col=ts_col, rev=nanos(rev_time), fwd=nanos(fwd_time),
                      **extra)


def formula_op(formula: str, formula_param: str) -> tuple[str, dict[str, Any]]:
    """(kind, extra UpdateByOp fields) of a rolling formula: one aggregation alone is that rolling
    operation; arithmetic over them is rolling_formula with its tree. min and max stay formulas:
    Deephaven's Numeric min/max over the window, whose NaN rules are not its rolling_min/rolling_max
    operator's. OperationError names what is not served."""
    tree = formula_parse(formula, formula_param)
    agg = formula_single(tree)
    if agg is not None and agg not in ("median", "min", "max"):
        return AGGREGATIONS[agg], {}
    return "rolling_formula", {"formula": tree}


def rolling_formula_tick(formula: str, formula_param: str, cols: Cols, rev_ticks: int,
                         fwd_ticks: int = 0) -> UpdateByOp:
    """`formula` over each window, `formula_param` standing for the window's values: +, -, *, / of
    numbers and of sum, avg, min, max, count, std, prod and median of the parameter."""
    kind, extra = formula_op(formula, formula_param)
    return _tick(kind, cols, rev_ticks, fwd_ticks, **extra)


def rolling_formula_time(ts_col: str, formula: str, formula_param: str, cols: Cols, rev_time: Time,
                         fwd_time: Time = 0) -> UpdateByOp:
    kind, extra = formula_op(formula, formula_param)
    return _time(kind, ts_col, cols, rev_time, fwd_time, **extra)


def rolling_sum_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_sum", cols, rev_ticks, fwd_ticks)


def rolling_sum_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_sum", ts_col, cols, rev_time, fwd_time)


def rolling_avg_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_avg", cols, rev_ticks, fwd_ticks)


def rolling_avg_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_avg", ts_col, cols, rev_time, fwd_time)


def rolling_min_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_min", cols, rev_ticks, fwd_ticks)


def rolling_min_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_min", ts_col, cols, rev_time, fwd_time)


def rolling_max_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_max", cols, rev_ticks, fwd_ticks)


def rolling_max_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_max", ts_col, cols, rev_time, fwd_time)


def rolling_prod_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_prod", cols, rev_ticks, fwd_ticks)


def rolling_prod_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_prod", ts_col, cols, rev_time, fwd_time)


def rolling_count_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_count", cols, rev_ticks, fwd_ticks)


def rolling_count_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_count", ts_col, cols, rev_time, fwd_time)


def rolling_std_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_std", cols, rev_ticks, fwd_ticks)


def rolling_std_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_std", ts_col, cols, rev_time, fwd_time)


def rolling_wavg_tick(wcol: str, cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_wavg", cols, rev_ticks, fwd_ticks, weight=wcol)


def rolling_wavg_time(ts_col: str, wcol: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_wavg", ts_col, cols, rev_time, fwd_time, weight=wcol)


def rolling_group_tick(cols: Cols, rev_ticks: int, fwd_ticks: int = 0) -> UpdateByOp:
    return _tick("rolling_group", cols, rev_ticks, fwd_ticks)


def rolling_group_time(ts_col: str, cols: Cols, rev_time: Time, fwd_time: Time = 0) -> UpdateByOp:
    return _time("rolling_group", ts_col, cols, rev_time, fwd_time)


def rolling_count_where_tick(col: str, filters: Any, rev_ticks: int, fwd_ticks: int = 0,
                             filter_columns: Sequence[str] = ()) -> UpdateByOp:
    return UpdateByOp("rolling_count_where", ((col, ""),), rev=int(rev_ticks), fwd=int(fwd_ticks),
                      filters=filters, filter_columns=tuple(filter_columns))


def rolling_count_where_time(ts_col: str, col: str, filters: Any, rev_time: Time, fwd_time: Time = 0,
                             filter_columns: Sequence[str] = ()) -> UpdateByOp:
    return UpdateByOp("rolling_count_where", ((col, ""),), time_col=ts_col, rev=nanos(rev_time),
                      fwd=nanos(fwd_time), filters=filters, filter_columns=tuple(filter_columns))
