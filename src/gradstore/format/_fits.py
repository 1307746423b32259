"""Whether a decoder with given limits would accept a gradient's document: put's side of them.

What a store writes, a reader with the same limits must read back, so the writer checks
the document it is about to store against the limits the decoder applies (same bounds,
same wording).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import LimitExceededError
from ._compressed import CompressedGradient, CompressedTensor
from ._gradient import Gradient
from ._limits import Limits
from ._pack import pack_meta


def check_fits(gradient: Gradient | CompressedGradient, size: int, limits: Limits) -> None:
    """Raise ``LimitExceededError`` if the document of ``gradient`` (``size`` bytes) is over
    ``limits``: what ``decode(doc, limits)`` would refuse for its size or shape (for a
    compressed gradient, also the dense bytes it stands for)."""
    if size > limits.max_bytes:
        raise LimitExceededError(f"document is {size} bytes, over max_bytes={limits.max_bytes}")
    if len(gradient.tensors) > limits.max_tensors:
        raise LimitExceededError(
            f"document has {len(gradient.tensors)} tensors, over max_tensors={limits.max_tensors}"
        )
    meta = len(pack_meta(gradient.meta))
    if meta > limits.max_meta_bytes:
        raise LimitExceededError(
            f"meta is {meta} bytes, over max_meta_bytes={limits.max_meta_bytes}"
        )
    if isinstance(gradient, CompressedGradient) and gradient.dense_nbytes > limits.max_bytes:
        raise LimitExceededError(
            f"the document stands for {gradient.dense_nbytes} dense bytes, over "
            f"max_bytes={limits.max_bytes}"
        )
    elements = 0
    tensors: dict[str, Any] = dict(gradient.tensors)
    for name, value in tensors.items():
        shape = value.shape if isinstance(value, CompressedTensor) else np.shape(value)
        if len(name.encode("utf-8", "surrogatepass")) > limits.max_name_bytes:
            raise LimitExceededError(
                f"tensor name {name[:40]!r}... is over max_name_bytes={limits.max_name_bytes}"
            )
        if len(shape) > limits.max_rank:
            raise LimitExceededError(
                f"tensor {name!r} has rank {len(shape)}, over max_rank={limits.max_rank}"
            )
        extent = 1
        for d in shape:
            extent *= max(int(d), 1)
        elements += int(np.prod(shape, dtype=object))
        if extent > limits.max_elements or elements > limits.max_elements:
            raise LimitExceededError(
                f"tensor {name!r} brings the document over max_elements={limits.max_elements}"
            )
