"""The ``bf16`` and ``fp16`` encoders: each value rounded once, to nearest, ties to even."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...format.codecs import Bf16, Fp16
from .._round import bf16_bits, fp16_values
from .base import Encoder, bf16_past_float16

Array = np.ndarray[Any, Any]


class Bf16Encoder(Encoder[Bf16]):
    """bfloat16 bits, from float64 directly (never through float32)."""

    codec = Bf16

    def reference(self, codec: Bf16, x: Array, what: str) -> Array:
        out: Array = bf16_bits(x, what).astype("<u2").view(np.uint8)
        return out

    def overflow_problem(self, codec: Bf16, code: str, peak: float) -> str | None:
        return bf16_past_float16(code, peak)


class Fp16Encoder(Encoder[Fp16]):
    """IEEE binary16, NumPy's own single rounding."""

    codec = Fp16

    def reference(self, codec: Fp16, x: Array, what: str) -> Array:
        out: Array = fp16_values(x, what).astype("<f2").view(np.uint8)
        return out
