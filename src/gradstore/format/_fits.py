"""Whether a decoder with given limits would accept a gradient's document: put's side of them.

What a store writes, a reader with the same limits must read back, so the writer checks
the document it is about to store against the limits the decoder applies (same bounds,
same wording). ``check_layout`` needs only names and shapes (no NumPy): the command line
checks an ``.npz`` it streams from its headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import LimitExceededError
from ._limits import Limits
from ._pack import pack_meta

if TYPE_CHECKING:
    from ._compressed import CompressedGradient
    from ._gradient import Gradient


def check_fits(gradient: Gradient | CompressedGradient, size: int, limits: Limits) -> None:
    """Raise ``LimitExceededError`` if the document of ``gradient`` (``size`` bytes) is over
    ``limits``: what ``decode(doc, limits)`` would refuse for its size or shape (for a
    compressed gradient, also the dense bytes it stands for)."""
    import numpy as np  # loaded already: the gradient holds arrays

    from ._compressed import CompressedGradient, CompressedTensor

    tensors: dict[str, Any] = dict(gradient.tensors)
    shapes = [
        (name, value.shape if isinstance(value, CompressedTensor) else np.shape(value))
        for name, value in tensors.items()
    ]
    dense = gradient.dense_nbytes if isinstance(gradient, CompressedGradient) else None
    check_layout(size, gradient.meta, shapes, limits, dense_nbytes=dense)


def check_layout(
    size: int,
    meta: Mapping[str, Any],
    shapes: Iterable[tuple[str, Sequence[int]]],
    limits: Limits,
    *,
    dense_nbytes: int | None = None,
) -> None:
    """``check_fits`` from the document's ``size``, its ``meta`` and each tensor's name and
    shape (and, for a compressed document, the dense bytes it stands for)."""
    if size > limits.max_bytes:
        raise LimitExceededError(
            f"document is {size} bytes, over max_bytes={limits.max_bytes}", "max_bytes"
        )
    shapes = list(shapes)
    if len(shapes) > limits.max_tensors:
        raise LimitExceededError(
            f"document has {len(shapes)} tensors, over max_tensors={limits.max_tensors}",
            "max_tensors",
        )
    packed = len(pack_meta(meta))
    if packed > limits.max_meta_bytes:
        raise LimitExceededError(
            f"meta is {packed} bytes, over max_meta_bytes={limits.max_meta_bytes}",
            "max_meta_bytes",
        )
    if dense_nbytes is not None and dense_nbytes > limits.max_bytes:
        raise LimitExceededError(
            f"the document stands for {dense_nbytes} dense bytes, over max_bytes={limits.max_bytes}",
            "max_bytes",
        )
    elements = 0
    for name, shape in shapes:
        if len(name.encode("utf-8", "surrogatepass")) > limits.max_name_bytes:
            raise LimitExceededError(
                f"tensor name {name[:40]!r}... is over max_name_bytes={limits.max_name_bytes}",
                "max_name_bytes",
            )
        if len(shape) > limits.max_rank:
            raise LimitExceededError(
                f"tensor {name!r} has rank {len(shape)}, over max_rank={limits.max_rank}",
                "max_rank",
            )
        extent = count = 1
        for d in shape:
            extent *= max(int(d), 1)
            count *= int(d)
        elements += count
        if extent > limits.max_elements or elements > limits.max_elements:
            raise LimitExceededError(
                f"tensor {name!r} brings the document over max_elements={limits.max_elements}",
                "max_elements",
            )
