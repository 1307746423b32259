"""One function per method, for callers that do not build AggregationParams themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._checks import Tensors
from ._dispatch import aggregate
from ._params import AggregationParams

Result = dict[str, np.ndarray[Any, Any]]


def sum_(inputs: Sequence[Tensors]) -> Result:
    """Elementwise sum of the inputs."""
    return aggregate(inputs, AggregationParams("sum"))


def mean(inputs: Sequence[Tensors]) -> Result:
    """Elementwise mean of the inputs."""
    return aggregate(inputs, AggregationParams("mean"))


def fedavg(inputs: Sequence[Tensors], num_samples: Sequence[int]) -> Result:
    """FedAvg: the mean weighted by each input's number of training samples."""
    return aggregate(inputs, AggregationParams("fedavg"), num_samples)


def weighted(inputs: Sequence[Tensors], weights: Sequence[float]) -> Result:
    """The mean weighted by ``weights`` (one per input, non-negative, normalised to sum 1)."""
    return aggregate(inputs, AggregationParams("weighted", weights=tuple(weights)))


def median(inputs: Sequence[Tensors]) -> Result:
    """Coordinate-wise median (for an even count, the mean of the two middle values)."""
    return aggregate(inputs, AggregationParams("median"))


def trimmed_mean(inputs: Sequence[Tensors], trim_ratio: float) -> Result:
    """Coordinate-wise mean after dropping floor(n * trim_ratio) values on each side."""
    return aggregate(inputs, AggregationParams("trimmed_mean", trim_ratio=trim_ratio))


def krum(inputs: Sequence[Tensors], byzantine: int) -> Result:
    """Krum: the input closest to its n - f - 2 nearest others (tolerates f Byzantine inputs)."""
    return aggregate(inputs, AggregationParams("krum", byzantine=byzantine))


def multikrum(inputs: Sequence[Tensors], byzantine: int, select: int | None = None) -> Result:
    """Multi-Krum: the mean of the ``select`` (default n - f) best-scored inputs."""
    return aggregate(inputs, AggregationParams("multikrum", byzantine=byzantine, select=select))
