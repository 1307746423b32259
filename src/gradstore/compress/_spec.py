"""Compression specs as users write them: ``topk:0.015,values=int8`` -> a ``Codec``.

``NAME[:ARG][,KEY=VALUE]...``: the name picks the codec class (``format.codecs``), the
keys are its parameters, and the class makes its codec from the argument and the options
(``Codec.from_spec``): ``bf16``, ``fp16``; ``int8`` (``int8:BLOCK`` or ``block=``, default
4096); ``topk:RATIO`` (or ``k=``), with ``chunk=`` (default 4096), ``values=bf16|int8|2bit``
(default bf16) and ``index=12|16`` (default 12 when the chunk allows it).
"""

from __future__ import annotations

from ..errors import CompressionError, InvalidDocumentError
from ..format.codecs import DEFAULT_GROUP, REGISTRY, Codec

__all__ = ["DEFAULT_GROUP", "parse_spec"]


def parse_spec(spec: str | Codec) -> Codec:
    """The codec a spec names (a ``Codec`` is returned as it is); CompressionError if unusable."""
    if isinstance(spec, Codec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise CompressionError(f"a compression spec is a non-empty string, got {spec!r}")
    text = spec.strip()
    name, _, rest = text.partition(":")
    name = name.strip().lower()
    cls = REGISTRY.get(name)
    if cls is None:
        raise CompressionError(f"unknown codec {name!r} in {spec!r}; known: {', '.join(REGISTRY)}")
    keys = cls.params()
    argument: str | None = None
    options: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in rest.split(",")) if rest else ():
        key, eq, value = part.partition("=")
        if not eq:
            if i == 0 and part:
                argument = part
                continue
            raise CompressionError(f"{spec!r}: expected KEY=VALUE, got {part!r}")
        key = key.strip().lower()
        if key not in keys:
            allowed = ", ".join(keys) or "none"
            raise CompressionError(f"{spec!r}: {name} has no option {key!r} (options: {allowed})")
        if key in options:
            raise CompressionError(f"{spec!r}: {key} is given twice")
        options[key] = value.strip()
    try:
        return cls.from_spec(spec, argument, options)
    except InvalidDocumentError as exc:
        raise CompressionError(f"{spec!r}: {exc}") from None
