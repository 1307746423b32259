"""A compressed tensor's values rounded to its declared dtype, window by window, and the check
that ``get`` and every verifier of inputs share: no finite value may come back beyond it.

``compress`` never writes such a value (``compress._tensor.overflow_problem``), but a
hostile document may (an int8 scale near float32's largest, float16 values on a float8
tensor): ``get`` would write an infinity that was never stored, and an aggregate would
overflow, costing the whole round.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ..format import CompressedTensor
from ._rounding import round_into

Array = np.ndarray[Any, Any]

WINDOW: Final = 1 << 18
"""Elements read at a time (2 MiB of float64): a whole tensor's float64 values are never
held beside its document (nor by ``compressed_norm``, which reads the same windows)."""

SCRATCH_BYTES: Final = 64 * WINDOW
"""The most reading one tensor window by window holds at once (16 MiB): the float64 window,
a ``topk`` window's unpacked positions and values, the rounding's buffers and masks
(12.5 MiB measured, for a ``topk`` that keeps every value)."""


def first_beyond_dtype(tensor: CompressedTensor, out: Array | None = None) -> int | None:
    """Round ``tensor``'s values once (to nearest, ties to even) to its declared dtype, into
    ``out`` (a flat array of that dtype and size) if given; return the index of the first
    finite value that comes back beyond the dtype's range, or None.

    Without ``out`` it only checks, in a window's memory (a ``topk`` tensor's kept values
    alone: +0.0 is in every range).
    """
    size = tensor.size
    if out is None and tensor.codec.sparse:
        for start in range(0, size, WINDOW):
            positions, values = tensor.sparse(start, min(start + WINDOW, size))
            bad = _first_beyond(np.empty(values.size, tensor.dtype), values)
            if bad is not None:
                return start + int(positions[bad])
        return None
    work = np.empty(min(WINDOW, size), np.float64)
    scratch = np.empty(work.size if out is None else 0, tensor.dtype)
    for start in range(0, size, WINDOW):
        stop = min(start + WINDOW, size)
        values = tensor.read(start, stop, work[: stop - start])
        bad = _first_beyond(scratch[: stop - start] if out is None else out[start:stop], values)
        if bad is not None:
            return start + bad
    return None


def _first_beyond(dst: Array, values: Array) -> int | None:
    """``dst[...] = values`` rounded once; the first finite value that became inf or NaN.

    Element by element: a NaN stored beside an overflow must not hide it. Finiteness is
    taken before rounding, which may overwrite ``values`` (bfloat16 and float8 do).
    """
    finite = np.isfinite(values)
    with np.errstate(over="ignore", invalid="ignore"):
        round_into(dst, values)
    bad = finite & ~np.isfinite(dst)
    return int(np.argmax(bad)) if bad.any() else None
