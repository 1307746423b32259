"""multikrum: the mean of the ``select`` (default n - f) best-scored inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...errors import AggregationError
from .base import MethodName, Selection, integer


@dataclass(frozen=True)
class MultiKrum(Selection):
    name: ClassVar[MethodName] = "multikrum"
    select: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.select is not None:
            m = integer("select", self.select)
            if m < 1:
                raise AggregationError(f"select must be >= 1, got {m}")
            object.__setattr__(self, "select", m)

    def validate(self, n: int) -> None:
        super().validate(n)
        if self.select is not None and self.select > n - self.f:
            raise AggregationError(
                f"multikrum: select {self.select} is more than n - f = {n - self.f} inputs"
            )

    def chosen(self, n: int) -> int:
        return self.select or n - self.f
