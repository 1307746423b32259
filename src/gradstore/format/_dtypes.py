"""The dtypes a gradstore/1 document may hold, and normalisation of input arrays to them."""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ..errors import InvalidDocumentError

#: NumPy little-endian type strings allowed in ``dtype`` (DESIGN section 1), in this order.
DTYPES: Final[tuple[str, ...]] = (
    "<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1",
)  # fmt: skip

_NUMPY: Final = {s: np.dtype(s) for s in DTYPES}


def numpy_dtype(dtype: str) -> np.dtype[Any] | None:
    """The NumPy dtype for an allowed type string, or None if the string is not allowed."""
    return _NUMPY.get(dtype)


def canonical_dtype(dt: np.dtype[Any]) -> str | None:
    """The document type string for ``dt`` (either byte order), or None if it is not storable."""
    if dt.fields is not None or dt.subdtype is not None or dt.kind not in "fiub":
        return None
    little = dt.newbyteorder("<").str
    return little if little in _NUMPY else None


def normalize_array(value: object, path: str) -> np.ndarray[Any, Any]:
    """``value`` as a C-contiguous little-endian array of an allowed dtype (no copy if it is).

    Only NumPy arrays and NumPy scalars are accepted: lists, Python numbers and
    masked arrays are refused, so nothing is guessed.
    """
    if isinstance(value, np.ma.MaskedArray):
        raise InvalidDocumentError("masked arrays are not storable; fill them first", path)
    if not isinstance(value, np.ndarray | np.generic):
        raise InvalidDocumentError(
            f"tensor must be a numpy array or numpy scalar, got {type(value).__name__}", path
        )
    code = canonical_dtype(value.dtype)
    if code is None:
        raise InvalidDocumentError(
            f"dtype {value.dtype} is not storable; allowed: {' '.join(DTYPES)}", path
        )
    arr = np.asarray(value, dtype=_NUMPY[code], order="C")
    if code == "|b1" and arr.size and np.max(arr.view(np.uint8)) > 1:
        # A bool array built by a view can hold bytes other than 0/1: write 0/1 only.
        arr = arr.view(np.uint8) != 0
    return arr
