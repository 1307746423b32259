"""The dtypes a gradstore/1 document may hold, and normalisation of input arrays to them.

NumPy's own types are written as NumPy's little-endian type strings (``"<f4"``). bfloat16
and the two float8 formats have no NumPy type string of their own (NumPy calls bfloat16
``"<V2"``, a raw void), so they are written by name, the names PyTorch, JAX and
``ml_dtypes`` share; in memory they are ``ml_dtypes`` arrays (docs/design/documents.md, "Tensor
dtypes").
"""

from __future__ import annotations

import sys
from functools import cache
from typing import Any, Final

import numpy as np

from ..errors import InvalidDocumentError, MissingExtraError
from ._dtype_codes import DTYPES, EXTENDED, ML_DTYPES_EXTRA, NUMPY_CODES

_NUMPY: Final = {s: np.dtype(s) for s in NUMPY_CODES}


@cache
def _extended() -> dict[str, np.dtype[Any]]:
    """Document name -> little-endian ml_dtypes dtype; MissingExtraError without ml_dtypes."""
    try:
        import ml_dtypes
    except ImportError:
        raise MissingExtraError(
            ML_DTYPES_EXTRA, f"the dtypes {', '.join(EXTENDED)} (NumPy arrays of ml_dtypes)"
        ) from None
    return {name: np.dtype(getattr(ml_dtypes, name)).newbyteorder("<") for name in EXTENDED}


def numpy_dtype(dtype: str) -> np.dtype[Any] | None:
    """The NumPy dtype for an allowed type string, or None if the string is not allowed.

    Raises MissingExtraError for an extended float when ``ml_dtypes`` is not installed.
    """
    found = _NUMPY.get(dtype)
    if found is None and dtype in EXTENDED:
        return _extended()[dtype]
    return found


def canonical_dtype(dt: np.dtype[Any]) -> str | None:
    """The document type string for ``dt`` (either byte order), or None if it is not storable."""
    if dt.fields is not None or dt.subdtype is not None:
        return None
    name = str(getattr(dt.type, "__name__", ""))
    if name in EXTENDED and getattr(dt.type, "__module__", None) == "ml_dtypes":
        return name  # only ml_dtypes' own classes: a look-alike name from elsewhere is refused
    if dt.kind not in "fiub":
        return None
    little = dt.newbyteorder("<").str
    return little if little in _NUMPY else None


def is_float(dt: np.dtype[Any]) -> bool:
    """Whether ``dt`` is one of the document's floating-point types (NumPy's or extended)."""
    code = canonical_dtype(dt)
    return code is not None and (code in EXTENDED or _NUMPY[code].kind == "f")


def _is_masked(value: object) -> bool:
    """Whether ``value`` is a NumPy masked array, without importing ``numpy.ma`` to ask.

    ``np.ma`` loads on first use (about 10 ms, on every put and cid); a masked array can
    only exist once something imported it, so until then nothing is one.
    """
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(value, ma.MaskedArray)


def normalize_array(value: object, path: str) -> np.ndarray[Any, Any]:
    """``value`` as a C-contiguous little-endian array of an allowed dtype (no copy if it is).

    Only NumPy arrays and NumPy scalars are accepted: lists, Python numbers and
    masked arrays are refused, so nothing is guessed.
    """
    if _is_masked(value):
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
    target = numpy_dtype(code)
    assert target is not None
    arr = np.asarray(value, dtype=target, order="C")
    if code == "|b1" and arr.size and np.max(arr.view(np.uint8)) > 1:
        # A bool array built by a view can hold bytes other than 0/1: write 0/1 only.
        arr = arr.view(np.uint8) != 0
    return arr
