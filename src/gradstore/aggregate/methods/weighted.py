"""weighted: the mean weighted by the job's weights (one per input, normalised to sum 1)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from ...errors import AggregationError
from .base import Linear, MethodName, number


@dataclass(frozen=True)
class Weighted(Linear):
    name: ClassVar[MethodName] = "weighted"
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.weights is not None:
            if isinstance(self.weights, str | bytes) or not hasattr(self.weights, "__iter__"):
                raise AggregationError("weights must be a sequence of numbers")
            weights = tuple(number("weights", w) for w in self.weights)
            if any(w < 0 for w in weights):
                raise AggregationError("weights must not be negative")
            object.__setattr__(self, "weights", weights)

    @classmethod
    def for_round(
        cls, params: Mapping[str, Any], weights: Mapping[str, float], peers: Sequence[str]
    ) -> Self:
        """The job's weights, per peer, become one per input, in the round's peer order."""
        return cls.configured({**params, "weights": tuple(float(weights[p]) for p in peers)})

    def validate(self, n: int) -> None:
        super().validate(n)
        if self.weights is None:
            raise AggregationError("weighted: weights are required (one per input)")
        if len(self.weights) != n:
            raise AggregationError(f"weighted: {len(self.weights)} weights for {n} inputs")
        if not math.fsum(self.weights) > 0:
            raise AggregationError("weighted: all weights are zero")

    def terms(
        self, n: int, num_samples: Sequence[int] | None
    ) -> tuple[list[float] | None, float | None]:
        assert self.weights is not None
        return list(self.weights), math.fsum(self.weights)
