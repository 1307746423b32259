"""Decoder limits: every bound a caller can set on an untrusted document, with its default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds checked against a document's *declared* sizes before anything is allocated.

    max_bytes       whole document length (1 GiB)
    max_tensors     number of tensors (65 536)
    max_rank        dimensions of one tensor (32, NumPy's own maximum is 64)
    max_elements    elements across all tensors (2^31); also bounds the product of
                    any tensor's non-zero dimensions, so an empty tensor cannot
                    declare an absurd shape
    max_meta_bytes  encoded length of ``meta`` (64 KiB)
    max_name_bytes  UTF-8 length of one tensor name (1024)
    max_meta_depth  nesting of arrays/maps inside ``meta`` (32)
    """

    max_bytes: int = 1 << 30
    max_tensors: int = 65_536
    max_rank: int = 32
    max_elements: int = 1 << 31
    max_meta_bytes: int = 1 << 16
    max_name_bytes: int = 1024
    max_meta_depth: int = 32

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Limits.{name} must be a non-negative int, got {value!r}")


DEFAULT_LIMITS: Final = Limits()
