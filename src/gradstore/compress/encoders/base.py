"""What every encoder is: how one codec class writes a payload, in plain NumPy (its
``reference``, the definition) and as fast as it can (``encode``, the same bytes).

An encoder also says which finite inputs its codec cannot take because their values
would come back beyond their dtype (``overflow_problem``), so ``get`` can always write
what was stored (docs/design/compression.md; the bytes: docs/spec.md, section 2.4).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Generic, TypeVar

import numpy as np

from ...format.codecs import Codec

Array = np.ndarray[Any, Any]

C = TypeVar("C", bound=Codec)

#: The smallest magnitude that bfloat16 rounds beyond float16's largest value (65504): 65408
#: is the tie between 65280 and 65536, and ties go to the even 65536.
_BF16_PAST_FLOAT16: Final = 65408.0
#: Magnitudes from here up may come back past float32's largest value: a block's scale is a
#: float32, rounded to nearest, so ``127 * scale`` may exceed the block's peak by 2^-24.
_SCALED_PAST_FLOAT32: Final = float(np.finfo(np.float32).max) * (1 - 2.0**-22)


class Encoder(Generic[C]):
    """The encoder of one codec class (``codec``)."""

    #: The codec class it writes.
    codec: ClassVar[type[Codec]]

    def reference(self, codec: C, x: Array, what: str) -> Array:
        """The payload (1-D uint8) of the finite values ``x`` (1-D float32 or float64), in
        plain NumPy: the definition. CompressionError naming ``what`` for a value beyond
        the codec's range."""
        raise NotImplementedError(f"{type(self).__name__} has no reference")

    def encode(self, codec: C, x: Array, what: str) -> Array:
        """``reference``'s bytes, compiled where it pays (``_fast``): by default, the reference."""
        return self.reference(codec, x, what)

    def overflow_problem(self, codec: C, code: str, peak: float) -> str | None:
        """Why a tensor of dtype ``code`` whose largest magnitude is ``peak`` cannot be
        compressed with ``codec`` (its values would decompress beyond what ``code`` holds),
        or None."""
        return None


def bf16_past_float16(code: str, peak: float) -> str | None:
    """bfloat16 rounding of float16 values near 65504 gives 65536, beyond float16."""
    if code == "<f2" and peak >= _BF16_PAST_FLOAT16:
        return (
            f"float16 values of magnitude {peak:g} round in bf16 to 65536, beyond float16's "
            "largest (65504): use fp16 or int8"
        )
    return None


def scaled_past_float32(code: str, peak: float) -> str | None:
    """A float32 scale may bring values at float32's largest back beyond it."""
    if code == "<f4" and peak >= _SCALED_PAST_FLOAT32:
        return (
            f"values of magnitude {peak:g} sit at float32's largest, and the codec's float32 "
            "scale may bring them back beyond it: store this tensor uncompressed"
        )
    return None


def records(codec: Codec, x: Array) -> tuple[Array, Array, Array]:
    """The payload to fill for ``x``, its full records as an (n, record bytes) view, and the
    elements of the short last record (float64, (1, m); m may be 0)."""
    out = np.empty(codec.payload_nbytes(x.size), np.uint8)
    g = codec.group
    full = x.size // g
    size = codec.record_nbytes(g)
    tail = x[full * g :].astype(np.float64).reshape(1, -1)
    return out, out[: full * size].reshape(full, size), tail
