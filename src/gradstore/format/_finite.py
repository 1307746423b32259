"""Whether a tensor holds only finite values: the check every peer's tensor goes through.

Quietly: a hostile document may hold a signalling NaN (bfloat16 ``0x7F81``, float32
``0x7F800001``), and a NumPy or ml_dtypes build that classifies by a floating-point
comparison raises the "invalid" flag on one, which NumPy prints as a RuntimeWarning.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ._dtypes import is_float

#: Elements looked at per step: the bool temporary stays small, and the first NaN stops it.
_BLOCK: Final = 1 << 16


def all_finite(array: np.ndarray[Any, Any]) -> bool:
    """Whether ``array`` holds no NaN and no infinity (always True for a non-float dtype)."""
    if not is_float(array.dtype):
        return True
    flat = np.ravel(array)  # a view of a contiguous array, as every decoded tensor is
    found = np.empty(min(flat.size, _BLOCK), np.bool_)
    with np.errstate(invalid="ignore"):
        for lo in range(0, flat.size, _BLOCK):
            part = flat[lo : lo + _BLOCK]
            if not np.isfinite(part, out=found[: part.size]).all():
                return False
    return True
