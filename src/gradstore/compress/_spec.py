"""Compression specs as users write them: ``topk:0.015,values=int8`` -> a ``Codec``.

``NAME[:ARG][,KEY=VALUE]...``: ``bf16``, ``fp16``; ``int8`` (``int8:BLOCK`` or
``block=``, default 4096); ``topk:RATIO`` (or ``k=``), with ``chunk=`` (default 4096),
``values=bf16|int8|2bit`` (default bf16) and ``index=12|16`` (default 12 when the chunk
allows it). A ratio becomes ``k = max(1, round(ratio * chunk))`` (halves up), so the
document records an exact count, not a float.
"""

from __future__ import annotations

import math
from typing import Final

from ..errors import CompressionError, InvalidDocumentError
from ..format import CODECS, Codec

#: Elements per int8 block and per top-k chunk unless the spec says otherwise.
DEFAULT_GROUP: Final = 4096

_KEYS: Final = {
    "bf16": (),
    "fp16": (),
    "int8": ("block",),
    "topk": ("chunk", "k", "index", "values"),
}


def parse_spec(spec: str | Codec) -> Codec:
    """The codec a spec names (a ``Codec`` is returned as it is); CompressionError if unusable."""
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise CompressionError(f"a compression spec is a non-empty string, got {spec!r}")
    text = spec.strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    if name not in CODECS:
        raise CompressionError(f"unknown codec {name!r} in {spec!r}; known: {', '.join(CODECS)}")
    positional: str | None = None
    options: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in rest.split(",")) if rest else ():
        key, eq, value = part.partition("=")
        if not eq:
            if i == 0 and part:
                positional = part
                continue
            raise CompressionError(f"{spec!r}: expected KEY=VALUE, got {part!r}")
        key = key.strip().lower()
        if key not in _KEYS[name]:
            allowed = ", ".join(_KEYS[name]) or "none"
            raise CompressionError(f"{spec!r}: {name} has no option {key!r} (options: {allowed})")
        if key in options:
            raise CompressionError(f"{spec!r}: {key} is given twice")
        options[key] = value.strip()
    try:
        if name in ("bf16", "fp16"):
            if positional is not None:
                raise CompressionError(f"{spec!r}: {name} takes no argument")
            return Codec(name)
        if name == "int8":
            if positional is not None and "block" in options:
                raise CompressionError(f"{spec!r}: the block size is given twice")
            block = _int(spec, "block", positional or options.get("block"), DEFAULT_GROUP)
            return Codec("int8", block=block)
        return _topk(spec, positional, options)
    except InvalidDocumentError as exc:
        raise CompressionError(f"{spec!r}: {exc}") from None


def _topk(spec: str, positional: str | None, options: dict[str, str]) -> Codec:
    chunk = _int(spec, "chunk", options.get("chunk"), DEFAULT_GROUP)
    if positional is not None and "k" in options:
        raise CompressionError(f"{spec!r}: give a ratio or k=, not both")
    if positional is None and "k" not in options:
        raise CompressionError(f"{spec!r}: topk needs a ratio (topk:0.015) or k=COUNT")
    if positional is not None:
        try:
            ratio = float(positional)
        except ValueError:
            raise CompressionError(f"{spec!r}: the ratio {positional!r} is not a number") from None
        if not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise CompressionError(f"{spec!r}: the ratio must be in (0, 1], got {positional}")
        k = max(1, min(chunk, math.floor(ratio * chunk + 0.5)))
    else:
        k = _int(spec, "k", options["k"], 0)
    index = _int(spec, "index", options.get("index"), 12 if chunk <= 4096 else 16)
    values = options.get("values", "bf16").lower()
    return Codec("topk", chunk=chunk, k=k, index=index, values=values)


def _int(spec: str, key: str, text: str | None, default: int) -> int:
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise CompressionError(f"{spec!r}: {key} must be a whole number, got {text!r}") from None
