"""The aggregation methods, one small class per method (see ``base``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...errors import AggregationError
from .base import (
    ACCUMULATIONS,
    MAX_KRUM_INPUTS,
    Linear,
    Method,
    MethodName,
    OrderStatistic,
    Selection,
)
from .fedavg import FedAvg, check_num_samples
from .krum import Krum
from .mean import Mean
from .median import MEDIAN_MIN_INPUTS, Median
from .multikrum import MultiKrum
from .sum import Sum
from .trimmed_mean import TrimmedMean, trimmed_per_side
from .weighted import Weighted

#: Every method, by the name job files and round records use.
REGISTRY: Final[dict[str, type[Method]]] = {
    cls.name: cls for cls in (Sum, Mean, FedAvg, Weighted, Median, TrimmedMean, Krum, MultiKrum)
}


def method_class(name: str) -> type[Method]:
    """The method called ``name``; AggregationError naming the known ones otherwise."""
    cls = REGISTRY.get(name)
    if cls is None:
        raise AggregationError(
            f"unknown aggregation method {name!r}; expected one of {', '.join(REGISTRY)}"
        )
    return cls


def method_of(name: str, params: Mapping[str, Any]) -> Method:
    """The method called ``name`` with ``params``; AggregationError for an unknown name or a
    parameter the method does not take."""
    return method_class(name).configured(params)


__all__ = [
    "ACCUMULATIONS",
    "MAX_KRUM_INPUTS",
    "MEDIAN_MIN_INPUTS",
    "REGISTRY",
    "FedAvg",
    "Krum",
    "Linear",
    "Mean",
    "Median",
    "Method",
    "MethodName",
    "MultiKrum",
    "OrderStatistic",
    "Selection",
    "Sum",
    "TrimmedMean",
    "Weighted",
    "check_num_samples",
    "method_class",
    "method_of",
    "trimmed_per_side",
]
