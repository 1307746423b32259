"""The encoders, one per codec class (see ``base``): what ``compress`` writes.

A codec (``gradstore.format.codecs``) says how its payload is read and checked; its
encoder here says how one is written. ``encoder_for`` finds it by the codec's class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...errors import CompressionError
from ...format.codecs import Codec
from .base import Encoder
from .cast import Bf16Encoder, Fp16Encoder
from .int8 import Int8Encoder
from .topk import TopKEncoder

#: Every encoder, by the codec class it writes.
ENCODERS: Final[Mapping[type[Codec], Encoder[Any]]] = {
    e.codec: e for e in (Bf16Encoder(), Fp16Encoder(), Int8Encoder(), TopKEncoder())
}


def encoder_for(codec: Codec) -> Encoder[Any]:
    """The encoder of ``codec``'s class; CompressionError when it has none."""
    encoder = ENCODERS.get(type(codec))
    if encoder is None:
        raise CompressionError(f"no encoder writes codec {codec.name}")
    return encoder


__all__ = [
    "ENCODERS",
    "Bf16Encoder",
    "Encoder",
    "Fp16Encoder",
    "Int8Encoder",
    "TopKEncoder",
    "encoder_for",
]
