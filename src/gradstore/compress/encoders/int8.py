"""The ``int8`` encoder: per block, ``scale = float32(max|x| / 127)`` and ``q = rint(x / scale)``.

The NumPy definition (``int8_quantize``, also what ``topk`` uses for int8 values) and the
compiled kernel for full blocks (``_kernels.int8_records``) write the same bytes.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ...errors import CompressionError
from ...format.codecs import Int8
from .._fast import kernels_for
from .base import Encoder, records, scaled_past_float32

Array = np.ndarray[Any, Any]

#: The smallest normal float32: a smaller scale is written as 0 (its block becomes zeros).
MIN_NORMAL32: Final = float(np.finfo(np.float32).tiny)

_F32_MAX: Final = float(np.finfo(np.float32).max)


class Int8Encoder(Encoder[Int8]):
    """Blockwise int8, full blocks compiled when numba is there and the input is worth it."""

    codec = Int8

    def reference(self, codec: Int8, x: Array, what: str) -> Array:
        return _payload(codec, x, what, None)

    def encode(self, codec: Int8, x: Array, what: str) -> Array:
        return _payload(codec, x, what, kernels_for(x.size))

    def overflow_problem(self, codec: Int8, code: str, peak: float) -> str | None:
        return scaled_past_float32(code, peak)


def _payload(codec: Int8, x: Array, what: str, kernels: Any) -> Array:
    out, full, tail = records(codec, x)
    _full_records(x, codec.block, full, what, kernels)
    if tail.size:
        at = full.size
        s, qt = int8_quantize(tail, what)
        out[at : at + 4] = s.astype("<f4").view(np.uint8)
        out[at + 4 :] = qt.view(np.uint8).reshape(-1)
    return out


def _full_records(x: Array, block: int, full: Array, what: str, kernels: Any) -> None:
    """Fill ``full`` (n, block + 4) with the records of the ``n`` full blocks of ``x``
    (float32 or float64, 1-D), by the compiled ``kernels`` if given."""
    n = full.shape[0]
    if kernels is None:
        scales, q = int8_quantize(x[: n * block].reshape(n, block).astype(np.float64), what)
        full[:, :4] = scales.astype("<f4").view(np.uint8).reshape(n, 4)
        full[:, 4:] = q.view(np.uint8)
        return
    worst = kernels.int8_records(x, block, full.reshape(-1))
    if worst > _F32_MAX:
        raise CompressionError(f"{what}: a value is too large for an int8 scale (float32)")


def int8_quantize(rows: Array, what: str) -> tuple[Array, Array]:
    """Per row (a block, or a chunk's kept values): float32 scales (n,) and int8 values.

    ``scale = float32(max|x| / 127)``, written 0 below float32's smallest normal number;
    ``q = rint(x / scale)`` in float64, ties to even.
    """
    peak = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0])
    quotient = peak / 127.0
    if quotient.size and quotient.max() > _F32_MAX:
        raise CompressionError(f"{what}: a value is too large for an int8 scale (float32)")
    scales = quotient.astype(np.float32)
    scales[scales < MIN_NORMAL32] = 0
    wide = scales.astype(np.float64)
    safe = np.where(wide == 0, 1.0, wide)
    q = np.rint(rows / safe[:, None])
    np.clip(q, -127, 127, out=q)
    q[wide == 0] = 0
    return scales, q.astype(np.int8)
