"""``bf16`` and ``fp16``: every element cast to a 16-bit float, a record of 2 bytes each.

Every 16-bit pattern is a value, so a payload has no rule beyond its length (NaN and
infinity are the coordinator's to refuse: ``finite`` finds them by their exponent bits).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ...errors import CompressionError
from ._records import CHECK_WINDOW
from .base import Codec

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Cast(Codec):
    """A cast to a 16-bit float: no parameters, one element per record."""

    #: The exponent bits; all of them set is an infinity or a NaN.
    exponent: ClassVar[int]

    @classmethod
    def from_spec(cls, spec: str, argument: str | None, options: Mapping[str, str]) -> Codec:
        if argument is not None:
            raise CompressionError(f"{spec!r}: {cls.name} takes no argument")
        return cls()

    @property
    def group(self) -> int:
        return 1

    def record_nbytes(self, length: int) -> int:
        return 2 * length

    def validate(self, payload: Array, count: int, path: str) -> None:
        return  # every 16-bit pattern is a value

    def finite(self, payload: Array, count: int) -> bool:
        """No value has every exponent bit set, looked at a window at a time."""

        bits = payload.view("<u2")
        step = CHECK_WINDOW // 2
        return not any(
            ((bits[lo : lo + step] & self.exponent) == self.exponent).any()
            for lo in range(0, bits.size, step)
        )

    def read(self, buf: Array, count: int, first: int, start: int, stop: int, out: Array) -> Array:
        import numpy as np

        raw = buf[2 * (start - first) : 2 * (stop - first)]
        with np.errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one
            self._widen(raw, out)
        return out

    @abstractmethod
    def _widen(self, raw: Array, out: Array) -> None:
        """Write the little-endian 16-bit values ``raw`` (bytes) into ``out``, exactly."""


@dataclass(frozen=True)
class Bf16(Cast):
    """bfloat16: float32's range, 8 significant bits."""

    name = "bf16"
    exponent = 0x7F80
    spec_help = "bf16"
    spec_example = "bf16"

    def _widen(self, raw: Array, out: Array) -> None:
        import numpy as np

        bits = raw.view("<u2").astype(np.uint32) << 16
        np.copyto(out, bits.view(np.float32), casting="safe")


@dataclass(frozen=True)
class Fp16(Cast):
    """IEEE binary16: 11 significant bits, values up to 65504."""

    name = "fp16"
    exponent = 0x7C00
    spec_help = "fp16"
    spec_example = "fp16"

    def _widen(self, raw: Array, out: Array) -> None:
        import numpy as np

        np.copyto(out, raw.view("<f2"), casting="safe")
