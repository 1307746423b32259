"""median: the coordinate-wise median (for an even count, the mean of the two middle values)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from ...errors import AggregationError
from .base import MethodName, OrderStatistic

#: A median needs at least this many inputs to outvote one of them.
MEDIAN_MIN_INPUTS: Final = 3


@dataclass(frozen=True)
class Median(OrderStatistic):
    name: ClassVar[MethodName] = "median"

    def validate(self, n: int) -> None:
        super().validate(n)
        if n < MEDIAN_MIN_INPUTS:
            raise AggregationError(
                f"median: {n} input(s) cannot outvote anyone; need at least {MEDIAN_MIN_INPUTS}"
            )

    def rows(self, n: int) -> tuple[int, int]:
        return (n - 1) // 2, n // 2 + 1
