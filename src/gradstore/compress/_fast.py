"""The compiled encoders when numba is there and the input is worth it, else NumPy's.

As in ``aggregate/_fused.py``: numba is imported only for inputs of at least
``MIN_ELEMENTS``, never when ``GRADSTORE_NUMBA=0``, and a failed import falls back to
the NumPy path, which writes the same bytes.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from typing import Any, Final

import numpy as np

from ._reference import int8_quantize, select

log = logging.getLogger(__name__)

Array = np.ndarray[Any, Any]

#: Elements below which the NumPy path is used (numba's import would not pay off).
MIN_ELEMENTS: Final = 1 << 16

#: The environment variable that turns compiled code off (shared with the aggregators).
ENV: Final = "GRADSTORE_NUMBA"


def _enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in {"0", "false", "no", "off"}


@cache
def _kernels() -> Any:
    try:
        from . import _kernels as kernels

        x = np.ones(8, np.float32)
        kernels.int8_blocks(x, 4, np.empty(2, np.float32), np.empty(8, np.int8))
        kernels.topk_select(x, 4, 1, np.empty((2, 1), np.int64))
        kernels.int8_blocks(x.astype(np.float64), 4, np.empty(2, np.float32), np.empty(8, np.int8))
        kernels.topk_select(x.astype(np.float64), 4, 1, np.empty((2, 1), np.int64))
    except Exception as exc:  # ImportError, numba refusing this NumPy, no compiler
        log.info("numba unavailable (%s): compression uses the NumPy path", exc)
        return None
    return kernels


def kernels_for(size: int) -> Any:
    """The compiled module if it is on, worth it for ``size`` elements, and importable."""
    if size < MIN_ELEMENTS or not _enabled():
        return None
    return _kernels()


def int8_full_blocks(x: Array, block: int, what: str) -> tuple[Array, Array]:
    """Scales (n,) float32 and int8 values (n, block) of the ``n`` full blocks of ``x``
    (float32 or float64, 1-D)."""
    n = x.size // block
    kernels = kernels_for(x.size)
    if kernels is None:
        return int8_quantize(x[: n * block].reshape(n, block).astype(np.float64), what)
    scales = np.empty(n, np.float32)
    q = np.empty(n * block, np.int8)
    worst = kernels.int8_blocks(x, block, scales, q)
    if worst > float(np.finfo(np.float32).max):
        from ..errors import CompressionError

        raise CompressionError(f"{what}: a value is too large for an int8 scale (float32)")
    return scales, q.reshape(n, block)


def topk_full_chunks(x: Array, chunk: int, kept: int) -> Array:
    """Positions (n, kept) kept in each of the ``n`` full chunks of ``x``."""
    n = x.size // chunk
    kernels = kernels_for(x.size)
    if kernels is None:
        return select(x[: n * chunk].reshape(n, chunk).astype(np.float64), kept)
    out = np.empty((n, kept), np.int64)
    kernels.topk_select(x, chunk, kept, out)
    return out
