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

from ..errors import CompressionError
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

        for x in (np.ones(8, np.float32), np.ones(8, np.float64)):
            kernels.int8_records(x, 4, np.empty(16, np.uint8))
            kernels.topk_select(x, 4, 1, np.empty((2, 1), np.int64))
        kernels.topk_select32(np.ones(8, np.float32), 4, 1, np.empty((2, 1), np.int64))
    except Exception as exc:  # ImportError, numba refusing this NumPy, no compiler
        log.info("numba unavailable (%s): compression uses the NumPy path", exc)
        return None
    return kernels


def kernels_for(size: int) -> Any:
    """The compiled module if it is on, worth it for ``size`` elements, and importable."""
    if size < MIN_ELEMENTS or not _enabled():
        return None
    return _kernels()


def int8_full_records(x: Array, block: int, records: Array, what: str) -> None:
    """Fill ``records`` (n, block + 4) with the records of the ``n`` full blocks of ``x``
    (float32 or float64, 1-D)."""
    n = records.shape[0]
    kernels = kernels_for(x.size)
    if kernels is None:
        scales, q = int8_quantize(x[: n * block].reshape(n, block).astype(np.float64), what)
        records[:, :4] = scales.astype("<f4").view(np.uint8).reshape(n, 4)
        records[:, 4:] = q.view(np.uint8)
        return
    worst = kernels.int8_records(x, block, records.reshape(-1))
    if worst > float(np.finfo(np.float32).max):
        raise CompressionError(f"{what}: a value is too large for an int8 scale (float32)")


def topk_full_chunks(x: Array, chunk: int, kept: int) -> Array:
    """Positions (n, kept) kept in each of the ``n`` full chunks of ``x``."""
    n = x.size // chunk
    kernels = kernels_for(x.size)
    if kernels is None:
        return select(x[: n * chunk].reshape(n, chunk).astype(np.float64), kept)
    out = np.empty((n, kept), np.int64)
    if x.dtype == np.float32:
        kernels.topk_select32(x, chunk, kept, out)
    else:
        kernels.topk_select(x, chunk, kept, out)
    return out
