"""mean: the elementwise mean of the inputs (sum, then one division by n)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from .base import Linear, MethodName


@dataclass(frozen=True)
class Mean(Linear):
    name: ClassVar[MethodName] = "mean"

    def terms(
        self, n: int, num_samples: Sequence[int] | None
    ) -> tuple[list[float] | None, float | None]:
        return None, float(n)
