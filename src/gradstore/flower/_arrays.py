"""Flower's ArrayRecord <-> gradstore tensors, refusing what a hostile client could send.

Flower serializes each array as a ``.npy`` byte string. It is read here without
``np.load``: the header is parsed (NumPy's own parser), its dtype must be one gradstore/1
holds and its shape must account for exactly the bytes that follow, within the caller's
limits, and the array must be what its own ``dtype`` and ``shape`` fields say; then the
data is a view of the received bytes. Nothing is allocated from a declared size. Key order matters to
Flower users (``to_numpy_ndarrays`` returns a list), so the way back keeps an order given
by the caller (the global model's) instead of gradstore's name order.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord
from numpy.lib import format as npy_format

from ..errors import Reason, RefusedError
from ..format import Limits, dtype_code

NUMPY_STYPE = "numpy.ndarray"


class ArraysRefused(RefusedError, ValueError):
    """The arrays cannot become a gradient: a ``RefusedError`` (``code``, ``detail``; ``reason``
    reads ``too-large: ...``), and a ``ValueError`` as it always was."""


def record_nbytes(record: ArrayRecord) -> int:
    """Bytes of serialized array data the record carries (what crossed Flower's transport)."""
    return sum(len(a.data) for a in record.values())


def arrays_to_tensors(record: ArrayRecord, limits: Limits) -> dict[str, np.ndarray[Any, Any]]:
    """The record's arrays by name, every one checked; ``ArraysRefused`` otherwise."""
    if len(record) > limits.max_tensors:
        raise ArraysRefused(
            Reason.TOO_LARGE, f"{len(record)} arrays, the limit is {limits.max_tensors}"
        )
    total = record_nbytes(record)
    if total > limits.max_bytes:
        raise ArraysRefused(
            Reason.TOO_LARGE, f"{total} bytes of arrays, the limit is {limits.max_bytes}"
        )
    out: dict[str, np.ndarray[Any, Any]] = {}
    for name, array in record.items():
        out[name] = _one(name, array, limits)
    return out


def _one(name: str, array: Array, limits: Limits) -> np.ndarray[Any, Any]:
    if not name or len(name.encode("utf-8", "surrogatepass")) > limits.max_name_bytes:
        raise ArraysRefused(Reason.MALFORMED, f"array name {name!r:.60} is empty or too long")
    if array.stype != NUMPY_STYPE:
        raise ArraysRefused(
            Reason.MALFORMED,
            f"array {name!r} is serialized as {array.stype!r:.40}, not {NUMPY_STYPE}",
        )
    dtype, shape, fortran, offset = _npy_header(name, array.data)
    if dtype_code(dtype) is None:
        raise ArraysRefused(
            Reason.MALFORMED, f"array {name!r} has dtype {dtype}, which gradstore/1 cannot hold"
        )
    count = math.prod(shape)
    if len(shape) > limits.max_rank or count > limits.max_elements:
        raise ArraysRefused(Reason.TOO_LARGE, f"array {name!r} declares shape {list(shape)}")
    if len(array.data) - offset != count * dtype.itemsize:
        raise ArraysRefused(
            Reason.MALFORMED,
            f"array {name!r} declares {dtype}{list(shape)} "
            f"({count * dtype.itemsize} bytes) but carries {len(array.data) - offset}",
        )
    if shape != tuple(array.shape) or str(dtype) != array.dtype:
        raise ArraysRefused(
            Reason.MALFORMED,
            f"array {name!r} holds {dtype}{list(shape)} but says "
            f"{array.dtype!r:.40}{list(array.shape)}",
        )
    # a view of the bytes Flower received (no np.load: nothing is allocated from the header)
    value = np.frombuffer(array.data, dtype, count, offset).reshape(
        shape, order="F" if fortran else "C"
    )
    return np.ascontiguousarray(value)


def _npy_header(name: str, data: bytes) -> tuple[np.dtype[Any], tuple[int, ...], bool, int]:
    """(dtype, shape, Fortran order, data offset) of a ``.npy`` byte string, or ArraysRefused."""
    stream = io.BytesIO(data)
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except Exception as exc:  # ValueError, EOFError, SyntaxError: whatever a bad header makes
        raise ArraysRefused(
            Reason.MALFORMED, f"array {name!r} is not a .npy array: {exc}"
        ) from None
    if dtype.hasobject:
        raise ArraysRefused(Reason.MALFORMED, f"array {name!r} holds Python objects")
    return dtype, tuple(int(d) for d in shape), bool(fortran), stream.tell()


def tensors_to_arrays(
    tensors: Mapping[str, np.ndarray[Any, Any]], order: Iterable[str] = ()
) -> ArrayRecord:
    """An ArrayRecord of ``tensors``: the names in ``order`` first (as given), then the rest."""
    names = [n for n in order if n in tensors]
    seen = set(names)
    names += [n for n in tensors if n not in seen]
    return ArrayRecord({n: Array(np.asarray(tensors[n])) for n in names})
