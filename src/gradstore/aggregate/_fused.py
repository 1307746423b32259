"""The linear kernel compiled by numba: every input added into an L1-sized float64 block.

NumPy needs one call per input and operation, and its per-call cost forces blocks that
live in L2; one compiled pass keeps the accumulator in L1 and runs about 2.5x faster.
It performs the same IEEE operations in the same order as the NumPy path of ``_linear``
(widen exactly, multiply, add, divide, round once; no fused multiply-add, no fast-math),
so the bits are the same, and an auditor without numba re-derives the same CID.

numba is imported only when a layout is large enough to pay for it, and never when
``GRADSTORE_NUMBA=0``; if it cannot be imported, the NumPy path is used.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Final

import numpy as np

log = logging.getLogger(__name__)

#: Input elements (per input, all tensors) below which the NumPy path is used: numba's
#: import and first compilation (about a second, then cached on disk) would not pay off.
MIN_ELEMENTS: Final = 1 << 20

#: Environment variable that turns the compiled kernel off when set to 0, false or no.
ENV: Final = "GRADSTORE_NUMBA"

#: ``kernel(out, addresses, coefs, divisor, start, stop) -> non-finite outputs`` over the
#: elements ``start:stop`` of one tensor; ``addresses`` are the inputs' data pointers.
Kernel = Callable[
    [np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any], float, int, int], int
]

_DTYPES: Final = (np.dtype(np.float32), np.dtype(np.float64))


def enabled() -> bool:
    """Whether the user left the compiled kernel on (``GRADSTORE_NUMBA``)."""
    return os.environ.get(ENV, "1").strip().lower() not in {"0", "false", "no", "off"}


def usable(arrays: list[np.ndarray[Any, Any]]) -> bool:
    """Whether the kernel can read these 1-D views: float32/float64, native order, aligned, contiguous."""
    return all(
        a.dtype in _DTYPES and a.dtype.isnative and a.flags.c_contiguous and a.flags.aligned
        for a in arrays
    )


def kernel(elements: int) -> Kernel | None:
    """The compiled kernel if it is on, worth it for ``elements`` per input, and importable."""
    if elements < MIN_ELEMENTS or not enabled():
        return None
    return _compiled()


def prepare(tensors: Mapping[str, np.ndarray[Any, Any]]) -> bool:
    """Load (or compile) the kernel now; whether inputs like ``tensors`` will use it.

    The first use in a process imports numba and loads the compiled code from disk (or
    compiles it, about a second): a coordinator calls this when the first input arrives, so
    the aggregate stage itself does not pay for it.
    """
    return kernel(sum(int(np.size(array)) for array in tensors.values())) is not None


@cache
def _compiled() -> Kernel | None:
    """Import and compile the numba kernel once per process (compiled code is cached on disk)."""
    try:
        from ._numba_kernel import combine_range

        for dtype in _DTYPES:  # compile (or load) both now: a failure here, not mid-aggregate
            one = np.ones(1, dtype)
            combine_range(one, np.array([one.ctypes.data], np.intp), np.ones(1), 1.0, 0, 1)
    except Exception as exc:  # ImportError, numba refusing this NumPy version, no compiler
        log.info("numba unavailable (%s): linear aggregation uses the NumPy path", exc)
        return None
    return combine_range
