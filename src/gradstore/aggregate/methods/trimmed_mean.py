"""trimmed_mean: per coordinate, the mean after dropping floor(n * r) values on each side."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Final

from ...errors import AggregationError
from .base import MethodName, OrderStatistic, number

#: Added to ``n * trim_ratio`` before flooring, so that 0.3 of 10 inputs trims 3 (10 * 0.3 is
#: 3.0000000000000004 but 100 * 0.57 is 56.99999999999999 in binary floating point).
_TRIM_SLACK: Final = 1e-9


def trimmed_per_side(n_inputs: int, trim_ratio: float) -> int:
    """How many inputs trimmed_mean drops on each side of every coordinate: floor(n * r)."""
    return math.floor(n_inputs * trim_ratio + _TRIM_SLACK)


@dataclass(frozen=True)
class TrimmedMean(OrderStatistic):
    name: ClassVar[MethodName] = "trimmed_mean"
    trim_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.trim_ratio is not None:
            ratio = number("trim_ratio", self.trim_ratio)
            if not 0.0 <= ratio < 0.5:
                raise AggregationError(f"trim_ratio must be in [0, 0.5), got {ratio}")
            object.__setattr__(self, "trim_ratio", ratio)

    def validate(self, n: int) -> None:
        super().validate(n)
        if self.trim_ratio is None:
            raise AggregationError("trimmed_mean: trim_ratio is required")
        k = trimmed_per_side(n, self.trim_ratio)
        if self.trim_ratio > 0 and k == 0:
            raise AggregationError(
                f"trimmed_mean: trim_ratio {self.trim_ratio} of {n} inputs trims nothing; "
                f"need at least {math.ceil(1 / self.trim_ratio)} inputs"
            )
        if n - 2 * k < 1:
            raise AggregationError(f"trimmed_mean: trimming {k} per side leaves no input")

    def rows(self, n: int) -> tuple[int, int]:
        assert self.trim_ratio is not None
        k = trimmed_per_side(n, self.trim_ratio)
        return k, n - k
