"""Gradient -> canonical gradstore/1 bytes, streamed as header pieces and zero-copy data views."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidDocumentError
from ._compressed import CompressedGradient, CompressedTensor
from ._dtypes import canonical_dtype, normalize_array
from ._gradient import Gradient
from ._layout import (
    KEY_CODEC,
    KEY_TENSORS,
    PREFIX2,
    EncodedDocument,
    TensorSlot,
    dense_head,
    sorted_names,
    tensor_layout,
)
from ._pack import array_header, pack_meta
from .codecs import Codec


def encode(g: Gradient | CompressedGradient) -> EncodedDocument:
    """The canonical document of ``g`` (gradstore/1, or gradstore/2 when it is compressed),
    without copying tensor data.

    Arrays are normalised (little-endian, C order; a copy only when needed); compressed
    payloads are checked against their codec's rules. Raises InvalidDocumentError (a
    ValueError) naming the tensor or meta path for anything the format cannot hold.
    """
    if isinstance(g, CompressedGradient):
        return _encode_compressed(g)
    if not isinstance(g, Gradient):
        raise TypeError(f"encode() takes a Gradient, got {type(g).__name__}")
    named = sorted_names(g.tensors)
    head = dense_head(g.meta, len(named))
    items = []
    for i, (raw, name, value) in enumerate(named):
        arr = normalize_array(value, f"$.tensors[{i}]")
        code = canonical_dtype(arr.dtype)
        assert code is not None  # normalize_array refuses the rest
        items.append((TensorSlot(raw, name, code, arr.shape, arr.nbytes), arr))
    return _with_tensors(head, items)


def _encode_compressed(g: CompressedGradient) -> EncodedDocument:
    if not isinstance(g.codec, Codec):
        raise InvalidDocumentError(
            f"codec must be a Codec, got {type(g.codec).__name__}", "$.codec"
        )
    named = sorted_names(g.tensors)
    head = bytearray(PREFIX2)
    head += pack_meta(g.meta)
    head += KEY_CODEC + g.codec.pack() + KEY_TENSORS + array_header(len(named))
    items = []
    for i, (raw, name, t) in enumerate(named):
        path = f"$.tensors[{i}]"
        if not isinstance(t, CompressedTensor):
            raise InvalidDocumentError(
                f"a compressed gradient holds CompressedTensors, got {type(t).__name__}", path
            )
        if t.codec != g.codec:
            raise InvalidDocumentError(
                f"tensor {name!r} uses codec {t.codec}, the document {g.codec}", path
            )
        t.check(f"{path}.data")
        items.append((TensorSlot(raw, name, t.dtype_code, t.shape, t.payload.nbytes), t.payload))
    return _with_tensors(head, items)


def _with_tensors(
    head: bytearray, items: list[tuple[TensorSlot, np.ndarray[Any, Any]]]
) -> EncodedDocument:
    """The document from its header so far and each tensor's slot and data array: the
    header pieces around zero-copy views of the arrays."""
    pieces, size = tensor_layout(head, [slot for slot, _ in items])
    return EncodedDocument(
        [memoryview(p) if isinstance(p, bytes) else _byte_view(items[p][1]) for p in pieces], size
    )


def _byte_view(arr: np.ndarray[Any, Any]) -> memoryview:
    """A format-'B' memoryview of a C-contiguous array's buffer (no copy)."""
    return arr.reshape(-1).view(np.uint8).data
