"""The codecs of gradstore/2 documents, one small class per codec (see ``base``).

Adding a codec is a module here (its class: parameters, record layout, payload checks,
decompression, spec), its import below, and its encoder in ``gradstore.compress.encoders``
(docs/design/compression.md, "Adding a codec").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .base import DEFAULT_GROUP, MAX_GROUP, MAX_TEXT, Codec, registered
from .cast import Bf16, Cast, Fp16
from .int8 import Int8
from .topk import INDEX_BITS, VALUE_FORMATS, TopK

#: Every codec, by the name documents, round records and specs use, in the order above.
REGISTRY: Final[Mapping[str, type[Codec]]] = registered()

#: Codec names, in the order the design lists them.
CODECS: Final = tuple(REGISTRY)

__all__ = [
    "CODECS",
    "DEFAULT_GROUP",
    "INDEX_BITS",
    "MAX_GROUP",
    "MAX_TEXT",
    "REGISTRY",
    "VALUE_FORMATS",
    "Bf16",
    "Cast",
    "Codec",
    "Fp16",
    "Int8",
    "TopK",
]
