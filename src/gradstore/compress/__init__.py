"""Compressing gradients for the network: bf16/fp16 casts, blockwise int8, chunked top-k.

``compress(gradient, "topk:0.015,values=int8")`` gives a ``CompressedGradient`` that
``GradientStore.put`` stores as a gradstore/2 document; ``ErrorFeedback`` keeps what
compression leaves out and adds it to the next update (docs/design/compression.md; the
codecs and what they write: docs/spec.md, sections 2.3 and 2.4). Aggregation decompresses
every input to float64, exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..format import Codec, CompressedGradient, Gradient
from ._feedback import (
    RESIDUAL_KIND,
    ErrorFeedback,
    check_residual,
    load_residual,
    save_residual,
    with_feedback,
)
from ._spec import DEFAULT_GROUP, parse_spec
from ._tensor import compress_array

__all__ = [
    "DEFAULT_GROUP",
    "RESIDUAL_KIND",
    "ErrorFeedback",
    "check_residual",
    "compress",
    "compress_array",
    "load_residual",
    "parse_spec",
    "save_residual",
    "with_feedback",
]


def compress(
    gradient: Gradient | Mapping[str, np.ndarray[Any, Any]], spec: str | Codec
) -> CompressedGradient:
    """Every tensor of ``gradient`` compressed with the codec ``spec`` names; meta is kept.

    Raises CompressionError for a bad spec, a non-float tensor, NaN/Inf, or a value beyond
    the codec's range (naming the tensor).
    """
    codec = parse_spec(spec)
    tensors = gradient.tensors if isinstance(gradient, Gradient) else gradient
    meta = dict(gradient.meta) if isinstance(gradient, Gradient) else {}
    return CompressedGradient(
        codec, {name: compress_array(a, codec, name) for name, a in tensors.items()}, meta
    )
