"""The hyperparameter space a population explores, and the knobs of its decisions.

Each mutated hyperparameter is a ``Choice`` (a list of values: perturbing shifts to a
neighbour, resampling picks any) or a ``Range`` (``low..high``: perturbing multiplies by a
perturbation factor, resampling draws uniformly). The knobs and their defaults are Ray Tune's
``PopulationBasedTraining``: ``quantile_fraction`` 0.25, ``resample_probability`` 0.25,
``perturbation_factors`` (1.2, 0.8).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

#: A hyperparameter's value: a number or a string (a list may hold either).
HValue: TypeAlias = int | float | str
HParams: TypeAlias = Mapping[str, HValue]
Mode: TypeAlias = Literal["max", "min"]

DEFAULT_QUANTILE_FRACTION: Final = 0.25
DEFAULT_RESAMPLE_PROBABILITY: Final = 0.25
DEFAULT_PERTURBATION_FACTORS: Final = (1.2, 0.8)


def same_value(a: object, b: object) -> bool:
    """Equal and of the same type (so ``1`` is not ``1.0`` and ``True`` is not ``1``)."""
    return type(a) is type(b) and a == b


def check_value(name: str, value: object) -> HValue:
    """``value`` if it is an int, a finite float or a string, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"hyperparameter {name!r} must be a number or a string, got {value!r:.60}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"hyperparameter {name!r} must be finite, got {value!r}")
    return value


@dataclass(frozen=True)
class Choice:
    """A list of allowed values: perturb shifts one place left or right (clamped at the
    ends), resample picks one uniformly; a value not in the list is always resampled."""

    values: tuple[HValue, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError("a list of hyperparameter values must not be empty")
        for v in self.values:
            check_value("list", v)
        for i, v in enumerate(self.values):
            if any(same_value(v, w) for w in self.values[:i]):
                raise ValueError(f"the list {list(self.values)} holds {v!r} twice")

    def index(self, value: object) -> int | None:
        """Where ``value`` is in the list (same type and value), or None."""
        for i, v in enumerate(self.values):
            if same_value(v, value):
                return i
        return None


@dataclass(frozen=True)
class Range:
    """A continuous float hyperparameter: perturb multiplies the value by a perturbation
    factor (unclipped, as Ray does), resample draws ``low + u * (high - low)``."""

    low: float
    high: float

    def __post_init__(self) -> None:
        for v in (self.low, self.high):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"a range's bounds must be finite numbers, got {v!r:.60}")
        object.__setattr__(self, "low", float(self.low))
        object.__setattr__(self, "high", float(self.high))
        if not self.low < self.high:
            raise ValueError(f"a range needs low < high, got {self.low} .. {self.high}")


Mutation: TypeAlias = Choice | Range


@dataclass(frozen=True)
class PopulationParams:
    """How every interval decides: which fraction exploits which, how the copied
    hyperparameters are explored, and whether a higher score is better (``mode``)."""

    mutations: Mapping[str, Mutation]
    quantile_fraction: float = DEFAULT_QUANTILE_FRACTION
    resample_probability: float = DEFAULT_RESAMPLE_PROBABILITY
    perturbation_factors: tuple[float, ...] = DEFAULT_PERTURBATION_FACTORS
    mode: Mode = "max"
    names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not self.mutations:
            raise ValueError("hyperparam_mutations names no hyperparameter")
        for name, m in self.mutations.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"a hyperparameter name must be a non-empty string: {name!r}")
            if not isinstance(m, Choice | Range):
                raise ValueError(f"hyperparameter {name!r}: a list or a range, got {m!r:.60}")
        object.__setattr__(self, "mutations", dict(sorted(self.mutations.items())))
        object.__setattr__(self, "names", tuple(self.mutations))
        if not 0.0 <= self.quantile_fraction <= 0.5:
            raise ValueError(f"quantile_fraction must be in [0, 0.5], got {self.quantile_fraction}")
        if not 0.0 <= self.resample_probability <= 1.0:
            raise ValueError(
                f"resample_probability must be in [0, 1], got {self.resample_probability}"
            )
        factors = tuple(float(f) for f in self.perturbation_factors)
        if not factors or not all(math.isfinite(f) and f > 0 for f in factors):
            raise ValueError(f"perturbation_factors must be positive numbers, got {factors}")
        object.__setattr__(self, "perturbation_factors", factors)
        if self.mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {self.mode!r}")

    def check_hparams(self, hparams: Mapping[str, object]) -> dict[str, HValue]:
        """``hparams`` (sorted by name) if it names exactly the space's hyperparameters with
        values of the right kind (a float for a range), else ValueError."""
        if sorted(hparams) != list(self.names):
            raise ValueError(
                f"hyperparameters {sorted(hparams)} are not the space's {list(self.names)}"
            )
        out: dict[str, HValue] = {}
        for name in self.names:
            value = check_value(name, hparams[name])
            if isinstance(self.mutations[name], Range) and not isinstance(value, float):
                raise ValueError(f"hyperparameter {name!r} is a range: its value must be a float")
            out[name] = value
        return out
