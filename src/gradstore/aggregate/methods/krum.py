"""krum: the one input closest to its n - f - 2 nearest others (Blanchard et al., 2017)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .base import MethodName, Selection


@dataclass(frozen=True)
class Krum(Selection):
    name: ClassVar[MethodName] = "krum"

    def chosen(self, n: int) -> int:
        return 1
