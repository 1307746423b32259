"""fedavg: the mean weighted by each input's number of training samples (McMahan et al.)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ...errors import AggregationError
from .base import Linear, MethodName


@dataclass(frozen=True)
class FedAvg(Linear):
    name: ClassVar[MethodName] = "fedavg"

    def terms(
        self, n: int, num_samples: Sequence[int] | None
    ) -> tuple[list[float] | None, float | None]:
        counts = check_num_samples(num_samples, n)
        return [float(c) for c in counts], float(sum(counts))


def check_num_samples(num_samples: Sequence[int] | None, n_inputs: int) -> tuple[int, ...]:
    """FedAvg's sample counts: one positive integer per input."""
    if num_samples is None:
        raise AggregationError("fedavg: num_samples are required (one per input)")
    counts = tuple(num_samples)
    if len(counts) != n_inputs:
        raise AggregationError(f"fedavg: {len(counts)} num_samples for {n_inputs} inputs")
    for index, count in enumerate(counts):
        if isinstance(count, bool) or not isinstance(count, numbers.Integral):
            raise AggregationError(
                f"fedavg: num_samples[{index}] must be an integer, got {type(count).__name__}"
            )
        if count <= 0:
            raise AggregationError(f"fedavg: num_samples[{index}] must be > 0, got {count}")
    return tuple(int(count) for count in counts)
