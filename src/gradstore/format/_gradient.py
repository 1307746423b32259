"""The in-memory gradient: named NumPy tensors plus a small ``meta`` map."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FormatError
from ._dtypes import canonical_dtype, normalize_array
from ._pack import pack_meta


@dataclass(eq=False)
class Gradient:
    """Tensor name -> array, plus ``meta`` (msgpack scalars, lists and str-keyed dicts).

    The order of ``tensors`` does not matter: the document sorts names by their
    UTF-8 bytes. Arrays from :func:`decode` are views into the decoded buffer.
    """

    tensors: dict[str, np.ndarray[Any, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    __hash__ = None  # type: ignore[assignment]  # mutable container

    @property
    def nbytes(self) -> int:
        """Total bytes of tensor data (what the document's ``data`` fields hold)."""
        return sum(int(np.asarray(a).nbytes) for a in self.tensors.values())

    def __eq__(self, other: object) -> bool:
        """Equal when they encode to the same document: names, dtypes, shapes, bytes and meta."""
        if not isinstance(other, Gradient):
            return NotImplemented
        if self.tensors.keys() != other.tensors.keys():
            return False
        for name, a in self.tensors.items():
            if not _same_tensor(a, other.tensors[name], name):
                return False
        return _same_meta(self.meta, other.meta)

    def __repr__(self) -> str:
        parts = []
        for name in sorted(self.tensors, key=_utf8_key):
            a = self.tensors[name]
            dt = getattr(a, "dtype", None)
            code = (canonical_dtype(dt) or str(dt)) if dt is not None else type(a).__name__
            shape = "x".join(map(str, np.shape(a))) or "scalar"
            parts.append(f"{name!r}: {code}[{shape}]")
        meta = repr(self.meta)
        if len(meta) > 200:
            meta = meta[:197] + "..."
        return f"Gradient(tensors={{{', '.join(parts)}}}, meta={meta}, nbytes={self.nbytes})"


def _utf8_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


def _same_tensor(a: object, b: object, name: str) -> bool:
    try:
        x = normalize_array(a, name)
        y = normalize_array(b, name)
    except FormatError:
        return a is b
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    return bool(np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)))


def _same_meta(a: dict[str, Any], b: dict[str, Any]) -> bool:
    # Compare canonical encodings, so 1 and 1.0 (different bytes) differ and
    # key order does not matter; fall back to == for meta that cannot be encoded.
    try:
        return pack_meta(a) == pack_meta(b)
    except (FormatError, TypeError):
        return a == b
