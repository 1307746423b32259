"""Document bytes -> Gradient (gradstore/1) or CompressedGradient (gradstore/2), zero-copy."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidDocumentError, LimitExceededError
from ._compressed import CompressedGradient, CompressedTensor
from ._dtypes import numpy_dtype
from ._gradient import Gradient
from ._header import BufferLike, DocumentHeader, byte_view, walk
from ._limits import DEFAULT_LIMITS, Limits


def decode(buf: BufferLike, limits: Limits = DEFAULT_LIMITS) -> Gradient:
    """Validate a gradstore/1 ``buf`` strictly (see read_header); its gradient without copying.

    bfloat16 and float8 tensors are ``ml_dtypes`` arrays; without that package their
    documents still pass read_header, and decode raises MissingExtraError. A compressed
    document (gradstore/2) is refused with InvalidDocumentError at ``$.format``: use
    :func:`decode_any`.

    Tensors are ``np.frombuffer`` views into ``buf`` (read-only when ``buf`` is),
    64-byte aligned relative to the document start; keep ``buf`` alive and
    unmodified while they are in use, or copy them.
    """
    mv = byte_view(buf)
    header = walk(mv, limits)
    if header.codec is not None:
        raise InvalidDocumentError(
            f"a compressed document (gradstore/2, codec {header.codec}): decode it with "
            "decode_any(), which returns a CompressedGradient",
            "$.format",
        )
    return _dense(mv, header)


def decode_any(buf: BufferLike, limits: Limits = DEFAULT_LIMITS) -> Gradient | CompressedGradient:
    """:func:`decode` for either format: a ``Gradient``, or a ``CompressedGradient`` whose
    tensors hold views of their payloads (nothing is decompressed until read)."""
    return decode_with_header(buf, limits)[0]


def decode_with_header(
    buf: BufferLike, limits: Limits = DEFAULT_LIMITS
) -> tuple[Gradient | CompressedGradient, DocumentHeader]:
    """:func:`decode_any` and the header it validated (tensor offsets, codec), from one walk."""
    mv = byte_view(buf)
    header = walk(mv, limits)
    return from_header(mv, header), header


def from_header(buf: BufferLike, header: DocumentHeader) -> Gradient | CompressedGradient:
    """The document ``read_header(buf)`` validated as ``header``, without walking it again."""
    mv = byte_view(buf)
    if header.size != mv.nbytes:
        raise ValueError(f"the header is of a {header.size}-byte document, not {mv.nbytes}")
    if header.codec is None:
        return _dense(mv, header)
    return compressed_from(mv, header)


def compressed_from(mv: memoryview, header: DocumentHeader) -> CompressedGradient:
    """The compressed gradient of a validated gradstore/2 header over its buffer."""
    codec = header.codec
    assert codec is not None
    tensors = {
        t.name: CompressedTensor(
            codec, t.dtype, t.shape, np.frombuffer(mv, np.uint8, t.nbytes, t.offset)
        )
        for t in header.tensors
    }
    return CompressedGradient(codec, tensors, header.meta)


def _dense(mv: memoryview, header: DocumentHeader) -> Gradient:
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    for t in header.tensors:
        dt = numpy_dtype(t.dtype)
        assert dt is not None
        flat = np.frombuffer(mv, dtype=dt, count=t.nbytes // dt.itemsize, offset=t.offset)
        try:
            tensors[t.name] = flat.reshape(t.shape)
        except ValueError as e:  # only reachable with limits raised past what NumPy can index
            raise LimitExceededError(
                f"tensor {t.name!r} shape {t.shape}: {e}", "max_elements"
            ) from None
    return Gradient(tensors, header.meta)
