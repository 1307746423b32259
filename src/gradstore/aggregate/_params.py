"""Aggregation method names and their parameters, checked before any array is touched."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from ..errors import AggregationError

#: Every method :func:`aggregate` knows (DESIGN section 6).
METHODS: Final[tuple[str, ...]] = (
    "sum", "mean", "fedavg", "weighted", "median", "trimmed_mean", "krum", "multikrum",
)  # fmt: skip

#: Which optional parameter each method accepts (clipping applies to every method).
_ACCEPTS: Final[dict[str, frozenset[str]]] = {
    "weights": frozenset({"weighted"}),
    "trim_ratio": frozenset({"trimmed_mean"}),
    "byzantine": frozenset({"krum", "multikrum"}),
    "select": frozenset({"multikrum"}),
}

#: Added to ``n * trim_ratio`` before flooring, so that 0.3 of 10 inputs trims 3 (10 * 0.3 is
#: 3.0000000000000004 but 100 * 0.57 is 56.99999999999999 in binary floating point).
_TRIM_SLACK: Final = 1e-9

#: A median needs at least this many inputs to outvote one of them.
MEDIAN_MIN_INPUTS: Final = 3


def trimmed_per_side(n_inputs: int, trim_ratio: float) -> int:
    """How many inputs trimmed_mean drops on each side of every coordinate: floor(n * r)."""
    return math.floor(n_inputs * trim_ratio + _TRIM_SLACK)


@dataclass(frozen=True)
class AggregationParams:
    """A method and its parameters; the same values a round record stores.

    ``weights`` are per input, in input order. ``trim_ratio`` is the fraction trimmed on each
    side (0 <= r < 0.5). ``byzantine`` is Krum's f; ``select`` is multi-Krum's m (default
    n - f). ``clip_input_norm`` bounds each input's global L2 norm (over all its tensors)
    before aggregating; ``clip_output_norm`` bounds the aggregate's.
    """

    method: str
    weights: tuple[float, ...] | None = None
    trim_ratio: float | None = None
    byzantine: int | None = None
    select: int | None = None
    clip_input_norm: float | None = None
    clip_output_norm: float | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise AggregationError(
                f"unknown aggregation method {self.method!r}; expected one of {', '.join(METHODS)}"
            )
        for name, methods in _ACCEPTS.items():
            if getattr(self, name) is not None and self.method not in methods:
                raise AggregationError(f"{name} does not apply to method {self.method!r}")
        if self.weights is not None:
            if isinstance(self.weights, str | bytes) or not hasattr(self.weights, "__iter__"):
                raise AggregationError("weights must be a sequence of numbers")
            weights = tuple(_number("weights", w) for w in self.weights)
            if any(w < 0 for w in weights):
                raise AggregationError("weights must not be negative")
            object.__setattr__(self, "weights", weights)
        if self.trim_ratio is not None:
            ratio = _number("trim_ratio", self.trim_ratio)
            if not 0.0 <= ratio < 0.5:
                raise AggregationError(f"trim_ratio must be in [0, 0.5), got {ratio}")
            object.__setattr__(self, "trim_ratio", ratio)
        if self.byzantine is not None:
            f = _integer("byzantine", self.byzantine)
            if f < 0:
                raise AggregationError(f"byzantine must be >= 0, got {f}")
            object.__setattr__(self, "byzantine", f)
        if self.select is not None:
            m = _integer("select", self.select)
            if m < 1:
                raise AggregationError(f"select must be >= 1, got {m}")
            object.__setattr__(self, "select", m)
        for name in ("clip_input_norm", "clip_output_norm"):
            value = getattr(self, name)
            if value is not None:
                bound = _number(name, value)
                if not bound > 0:
                    raise AggregationError(f"{name} must be > 0, got {bound}")
                object.__setattr__(self, name, bound)

    def validate(self, n_inputs: int) -> None:
        """Refuse (AggregationError) unless this method can honestly combine ``n_inputs`` inputs."""
        n, method = n_inputs, self.method
        if n < 1:
            raise AggregationError(f"{method}: no inputs to aggregate")
        if method == "weighted":
            if self.weights is None:
                raise AggregationError("weighted: weights are required (one per input)")
            if len(self.weights) != n:
                raise AggregationError(f"weighted: {len(self.weights)} weights for {n} inputs")
            if not math.fsum(self.weights) > 0:
                raise AggregationError("weighted: all weights are zero")
        elif method == "median" and n < MEDIAN_MIN_INPUTS:
            raise AggregationError(
                f"median: {n} input(s) cannot outvote anyone; need at least {MEDIAN_MIN_INPUTS}"
            )
        elif method == "trimmed_mean":
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
        elif method in ("krum", "multikrum"):
            if self.byzantine is None:
                raise AggregationError(f"{method}: byzantine (f) is required")
            f = self.byzantine
            if n < 2 * f + 3:
                raise AggregationError(
                    f"{method}: {n} inputs tolerate no {f} Byzantine ones; "
                    f"Krum needs n >= 2f + 3 = {2 * f + 3}"
                )
            if self.select is not None and self.select > n - f:
                raise AggregationError(
                    f"multikrum: select {self.select} is more than n - f = {n - f} inputs"
                )

    def to_record(self) -> dict[str, Any]:
        """The non-None parameters (method excluded), in field order, as plain JSON/CBOR values."""
        record: dict[str, Any] = {}
        for field in fields(self)[1:]:
            value = getattr(self, field.name)
            if value is not None:
                record[field.name] = list(value) if isinstance(value, tuple) else value
        return record

    @classmethod
    def from_record(cls, method: str, params: Mapping[str, Any]) -> AggregationParams:
        """Rebuild parameters from :meth:`to_record`'s output; unknown keys are refused."""
        known = {field.name for field in fields(cls)[1:]}
        unknown = sorted(set(params) - known)
        if unknown:
            raise AggregationError(f"unknown aggregation parameter(s): {', '.join(unknown)}")
        values = dict(params)
        if isinstance(values.get("weights"), list):
            values["weights"] = tuple(values["weights"])
        return cls(method, **values)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AggregationError(f"{name} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise AggregationError(f"{name} must be finite, got {number}")
    return number


def _integer(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise AggregationError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)
