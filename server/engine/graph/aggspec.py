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
    `non_unique` is unique's value for a group of several distinct values (default null)."""

    kind: str
    column: Optional[str] = None
    name: Optional[str] = None
    other: Optional[str] = None
    percentile: float = 0.5
    average_evenly_divided: bool = False
    include_nulls: bool = False
    non_unique: Any = field(default=None, compare=False)

    @property
    def out(self) -> str:
        return self.name or self.column or self.kind
