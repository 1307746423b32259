"""Flower's ArrayRecord <-> gradstore tensors, refusing what a hostile client could send.

Flower serializes each array as a ``.npy`` byte string; it is read here with
``allow_pickle=False`` only after its size is checked against the caller's limit, and
the array must be what its own ``dtype`` and ``shape`` fields say. Key order matters to
Flower users (``to_numpy_ndarrays`` returns a list), so the way back keeps an order given
by the caller (the global model's) instead of gradstore's name order.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from ..format import Limits, dtype_code

NUMPY_STYPE = "numpy.ndarray"


class ArraysRefused(ValueError):
    """The arrays cannot become a gradient; ``reason`` starts with a code (``too-large: ...``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def record_nbytes(record: ArrayRecord) -> int:
    """Bytes of serialized array data the record carries (what crossed Flower's transport)."""
    return sum(len(a.data) for a in record.values())


def arrays_to_tensors(record: ArrayRecord, limits: Limits) -> dict[str, np.ndarray[Any, Any]]:
    """The record's arrays by name, every one checked; ``ArraysRefused`` otherwise."""
    if len(record) > limits.max_tensors:
        raise ArraysRefused(f"too-large: {len(record)} arrays, the limit is {limits.max_tensors}")
    total = record_nbytes(record)
    if total > limits.max_bytes:
        raise ArraysRefused(f"too-large: {total} bytes of arrays, the limit is {limits.max_bytes}")
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, array in record.items():
        out[name] = _one(name, array, limits)
    return out


def _one(name: str, array: Array, limits: Limits) -> np.ndarray[Any, Any]:
    if not name or len(name.encode("utf-8", "surrogatepass")) > limits.max_name_bytes:
        raise ArraysRefused(f"malformed: array name {name!r:.60} is empty or too long")
    if array.stype != NUMPY_STYPE:
        raise ArraysRefused(
            f"malformed: array {name!r} is serialized as {array.stype!r:.40}, not {NUMPY_STYPE}"
        )
    try:
        value = np.load(io.BytesIO(array.data), allow_pickle=False)
    except Exception as exc:  # ValueError, EOFError, OSError: whatever np.load makes of bad bytes
        raise ArraysRefused(f"malformed: array {name!r} is not a .npy array: {exc}") from None
    if not isinstance(value, np.ndarray):
        raise ArraysRefused(f"malformed: array {name!r} is not a .npy array")
    if tuple(value.shape) != tuple(array.shape) or str(value.dtype) != array.dtype:
        raise ArraysRefused(
            f"malformed: array {name!r} holds {value.dtype}{list(value.shape)} but says "
            f"{array.dtype!r:.40}{list(array.shape)}"
        )
    if dtype_code(value.dtype) is None:
        raise ArraysRefused(
            f"malformed: array {name!r} has dtype {value.dtype}, which gradstore/1 cannot hold"
        )
    return np.ascontiguousarray(value)


def tensors_to_arrays(
    tensors: Mapping[str, np.ndarray[Any, Any]], order: Iterable[str] = ()
) -> ArrayRecord:
    """An ArrayRecord of ``tensors``: the names in ``order`` first (as given), then the rest."""
    names = [n for n in order if n in tensors]
    seen = set(names)
    names += [n for n in tensors if n not in seen]
    return ArrayRecord({n: Array(np.asarray(tensors[n])) for n in names})
