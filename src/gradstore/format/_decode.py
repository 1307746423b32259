"""gradstore/1 bytes -> Gradient whose tensors are zero-copy views into the buffer."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import LimitExceededError
from ._dtypes import numpy_dtype
from ._gradient import Gradient
from ._header import BufferLike, byte_view, walk
from ._limits import DEFAULT_LIMITS, Limits


def decode(buf: BufferLike, limits: Limits = DEFAULT_LIMITS) -> Gradient:
    """Validate ``buf`` strictly (see read_header) and return its gradient without copying data.

    bfloat16 and float8 tensors are ``ml_dtypes`` arrays; without that package their
    documents still pass read_header, and decode raises MissingExtraError.

    Tensors are ``np.frombuffer`` views into ``buf`` (read-only when ``buf`` is),
    64-byte aligned relative to the document start; keep ``buf`` alive and
    unmodified while they are in use, or copy them.
    """
    mv = byte_view(buf)
    header = walk(mv, limits)
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for t in header.tensors:
        dt = numpy_dtype(t.dtype)
        assert dt is not None
        flat = np.frombuffer(mv, dtype=dt, count=t.nbytes // dt.itemsize, offset=t.offset)
        try:
            tensors[t.name] = flat.reshape(t.shape)
        except ValueError as e:  # only reachable with limits raised past what NumPy can index
            raise LimitExceededError(f"tensor {t.name!r} shape {t.shape}: {e}") from None
    return Gradient(tensors, header.meta)
