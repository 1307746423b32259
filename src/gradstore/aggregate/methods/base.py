"""What every aggregation method is: a name, its parameters, and the checks it makes.

A method is one small frozen class (one per file, as Flower keeps one strategy per file)
holding its own parameters (its fields: a job file's ``[aggregation]`` keys and a round
record's ``params`` by the same names) and refusing what it cannot honestly do, before any
array is touched. A new parameter is a field of its method (and a key of the job parser). The engines (``aggregate`` in memory, ``aggregate_streamed`` from a node) never
branch on a method's name; they ask what kind of method it is:

- ``Linear``: each output element is ``sum_i c_i * x_i / divisor`` (sum, mean, fedavg,
  weighted), summed in input order or exactly (``accumulate``);
- ``OrderStatistic``: the mean of the sorted values at rows ``first .. stop - 1`` of every
  coordinate (median, trimmed_mean);
- ``Selection``: Krum's scores choose inputs, which are then averaged (krum, multikrum);
  at most ``MAX_KRUM_INPUTS`` of them.
"""

from __future__ import annotations

import math
import numbers
import typing
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from dataclasses import field as dataclass_field
from typing import Any, ClassVar, Final, Literal, Self

from ...errors import AggregationError, TooManyInputsError

MethodName = Literal[
    "sum", "mean", "fedavg", "weighted", "median", "trimmed_mean", "krum", "multikrum"
]


#: The most inputs krum and multikrum take. Besides its inputs' windows, Krum as the
#: coordinator and the auditor run it (streamed) holds three (n, n) float64 matrices at its
#: peak (the Gram sum, a chunk's sum and a block's product; then the Gram sum, the distances
#: and row blocks of them) and, per input, a float64 row of a 32 Ki-element block (256 KiB)
#: and a window read of at most as much again (float64 when decompressed):
#: 3 x 8 x n^2 + n x 512 KiB, 536 MiB at 1024 inputs (24 MiB of it for tiny tensors),
#: within a 1 GiB budget that 2048 would break (1.1 GiB). The in-memory kernel holds two
#: more matrices per worker thread. An auditor refuses a record listing more before it
#: fetches an input: anyone can sign one.
MAX_KRUM_INPUTS: Final = 1024


@dataclass(frozen=True)
class Method(ABC):
    """An aggregation method with its parameters (none, for most)."""

    name: ClassVar[MethodName]

    @classmethod
    def parameters(cls) -> tuple[str, ...]:
        """The names of the method's own parameters, in the order a round record lists them."""
        return tuple(field.name for field in fields(cls))

    @classmethod
    def parameter_types(cls) -> dict[str, Any]:
        """Each parameter's declared type (``int | None``, ...): how a job file's value is read."""
        hints = typing.get_type_hints(cls)
        return {name: hints[name] for name in cls.parameters()}

    @classmethod
    def configured(cls, params: Mapping[str, Any]) -> Self:
        """The method with ``params`` (None values left out); AggregationError naming a
        parameter it does not take."""
        accepted = cls.parameters()
        for key, value in params.items():
            if value is not None and key not in accepted:
                raise AggregationError(f"{key} does not apply to method {cls.name!r}")
        return cls(**{k: v for k, v in params.items() if k in accepted})

    @classmethod
    def for_round(
        cls, params: Mapping[str, Any], weights: Mapping[str, float], peers: Sequence[str]
    ) -> Self:
        """The method as a job sets it (``params``: its own parameters, by name), for a
        round whose inputs come from ``peers`` in this order. ``weights`` are the job's,
        per peer: only a method that weighs peers by them reads them."""
        return cls.configured(params)

    def validate(self, n: int) -> None:
        """Refuse (AggregationError) unless the method can honestly combine ``n`` inputs."""
        if n < 1:
            raise AggregationError(f"{self.name}: no inputs to aggregate")

    def params(self) -> dict[str, Any]:
        """The parameters a round record stores (field order, tuples as lists)."""
        out: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out[field.name] = list(value) if isinstance(value, tuple) else value
        return out


#: How a linear method adds its terms: in input order in binary64 (the default, which a
#: record leaves out), or exactly, rounded once (order- and grouping-independent).
ACCUMULATIONS: Final = ("ordered", "exact")


@dataclass(frozen=True)
class Linear(Method):
    """``(sum_i coefs[i] * x_i) / divisor``, accumulated in float64 in input order, or
    exactly (``accumulate = "exact"``: docs/spec.md, section 6.4)."""

    accumulate: str | None = dataclass_field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.accumulate is not None:
            if self.accumulate not in ACCUMULATIONS:
                raise AggregationError(
                    f"accumulate must be one of {', '.join(map(repr, ACCUMULATIONS))}, "
                    f"got {self.accumulate!r}"
                )
            if self.accumulate == "ordered":  # the default: records leave it out
                object.__setattr__(self, "accumulate", None)

    @property
    def exact(self) -> bool:
        """Whether the terms are summed exactly and rounded once."""
        return self.accumulate == "exact"

    @abstractmethod
    def terms(
        self, n: int, num_samples: Sequence[int] | None
    ) -> tuple[list[float] | None, float | None]:
        """Coefficients (None: all ones) and divisor (None: none) for ``n`` inputs."""


@dataclass(frozen=True)
class OrderStatistic(Method):
    """Per coordinate, the float64 mean of the sorted values at rows ``first .. stop - 1``."""

    @abstractmethod
    def rows(self, n: int) -> tuple[int, int]:
        """``(first, stop)`` for ``n`` inputs."""


@dataclass(frozen=True)
class Selection(Method):
    """Krum's scores select ``chosen(n)`` inputs, which are then averaged in input order."""

    byzantine: int | None = None

    def __post_init__(self) -> None:
        if self.byzantine is not None:
            f = integer("byzantine", self.byzantine)
            if f < 0:
                raise AggregationError(f"byzantine must be >= 0, got {f}")
            object.__setattr__(self, "byzantine", f)

    @property
    def f(self) -> int:
        if self.byzantine is None:
            raise AggregationError(f"{self.name}: byzantine (f) is required")
        return self.byzantine

    def validate(self, n: int) -> None:
        super().validate(n)
        if n > MAX_KRUM_INPUTS:
            raise TooManyInputsError(self.name, n, MAX_KRUM_INPUTS)
        f = self.f
        if n < 2 * f + 3:
            raise AggregationError(
                f"{self.name}: {n} inputs tolerate no {f} Byzantine ones; "
                f"Krum needs n >= 2f + 3 = {2 * f + 3}"
            )

    @abstractmethod
    def chosen(self, n: int) -> int:
        """How many inputs are selected out of ``n``."""


def number(name: str, value: object) -> float:
    """``value`` as a finite float, or AggregationError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AggregationError(f"{name} must be a number, got {type(value).__name__}")
    out = float(value)
    if not math.isfinite(out):
        raise AggregationError(f"{name} must be finite, got {out}")
    return out


def integer(name: str, value: object) -> int:
    """``value`` as an int (bools refused), or AggregationError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise AggregationError(f"{name} must be an integer, got {type(value).__name__}")
    return int(value)
