"""What an aggregation is asked for (`Agg`), apart from the table that computes it
(tickwire.server.engine.graph.ops.aggregate), so that tables can offer `sum_by` and friends."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Agg"]


@dataclass(frozen=True)
class Agg:
    """One aggregation: `kind` (tickwire.server.engine.graph.ops.aggregate.KINDS) of input `column`
    into output column `name`.

    `other` is the weight column of weighted_sum/weighted_avg and the sort column of
    sorted_first/sorted_last; `percentile` and `average_evenly_divided` shape percentile and
    median; `include_nulls` makes count_distinct, distinct and unique count null as a value;
    `non_unique` is unique's value for a group of several distinct values (default null); `where`
    is count_where's condition (a pyarrow boolean Expression over the table's columns). `wide`
    gives the types of Deephaven's vector functions in formulas (sum(x), median(x)): float sums as
    double, and medians/percentiles averaged and double for every numeric type."""

    kind: str
    column: Optional[str] = None
    name: Optional[str] = None
    other: Optional[str] = None
    percentile: float = 0.5
    average_evenly_divided: bool = False
    include_nulls: bool = False
    non_unique: Any = field(default=None, compare=False)
    #: count_where: the rows counted (a pyarrow boolean Expression; null counts as false)
    where: Any = field(default=None, compare=False)
    wide: bool = False

    @property
    def out(self) -> str:
        return self.name or self.column or self.kind
