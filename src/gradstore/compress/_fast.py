"""The compiled encoders' kernels, when numba is there and the input is worth it.

As in ``aggregate/_fused.py``: numba is imported only for inputs of at least
``MIN_ELEMENTS``, never when ``GRADSTORE_NUMBA=0``, and a failed import falls back to
the encoders' NumPy path (their ``reference``), which writes the same bytes.
"""

from __future__ import annotations

import logging
import os
from functools import cache
from typing import Any, Final

import numpy as np

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
