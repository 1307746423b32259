"""Error feedback: what compression left out is kept by the peer and added to the next update.

``u = g + r; c = compress(u); r = u - decompress(c)``, in float64, tensor by tensor. Then
everything sent plus the residual sums to the raw updates (docs/design/compression.md, "Error
feedback"). Residuals are saved as gradstore/1 documents of float64 tensors: nothing is
ever unpickled.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..errors import CompressionError, FormatError
from ..format import FLOATS, Codec, CompressedGradient, Gradient, decode, dtype_code, encode
from ._spec import parse_spec
from ._tensor import compress_array

Array = np.ndarray[Any, Any]

#: ``meta.kind`` of a residual file.
RESIDUAL_KIND: Final = "residual"


def with_feedback(
    gradient: Gradient, spec: str | Codec, residual: Mapping[str, Array] | None
) -> tuple[CompressedGradient, dict[str, Array]]:
    """``gradient + residual`` compressed, and the new residual (float64, what was left out).

    Each tensor keeps its dtype as the one the compressed tensor stands for. The residual
    must have exactly the gradient's tensor names and shapes (CompressionError otherwise);
    ``None`` is a zero residual.
    """
    codec = parse_spec(spec)
    if residual is not None:
        check_residual(gradient.tensors, residual)
    tensors = {}
    left: dict[str, Array] = {}
    for name, array in gradient.tensors.items():
        array = np.asarray(array)
        update = np.array(array, dtype=np.float64)  # a copy: the caller's array stays as it was
        if residual is not None:
            np.add(update, residual[name], out=update)
        code = dtype_code(array.dtype)
        if code not in FLOATS:
            raise CompressionError(
                f"tensor {name!r} has dtype {code or array.dtype}; only float tensors are compressed"
            )
        t = compress_array(update, codec, name, code)
        tensors[name] = t
        np.subtract(update, t.decompress(), out=update)
        left[name] = update
    return CompressedGradient(codec, tensors, dict(gradient.meta)), left


def check_residual(tensors: Mapping[str, Array], residual: Mapping[str, Array]) -> None:
    """CompressionError unless ``residual`` has exactly the names and shapes of ``tensors``."""
    missing = sorted(set(tensors) - set(residual))
    extra = sorted(set(residual) - set(tensors))
    if missing or extra:
        raise CompressionError(
            f"the residual does not fit the gradient: missing {missing}, extra {extra}"
        )
    for name, array in tensors.items():
        if np.shape(residual[name]) != np.shape(array):
            raise CompressionError(
                f"the residual of {name!r} has shape {np.shape(residual[name])}, "
                f"the gradient {np.shape(array)}"
            )


class ErrorFeedback:
    """A peer's residual across rounds: ``compress(g)`` sends ``g`` plus what earlier rounds
    left out, and keeps what this one leaves out."""

    def __init__(self, spec: str | Codec, residual: Mapping[str, Array] | None = None) -> None:
        self.codec = parse_spec(spec)
        self.residual: dict[str, Array] | None = (
            None
            if residual is None
            else {n: np.asarray(a, np.float64) for n, a in residual.items()}
        )

    def compress(self, gradient: Gradient) -> CompressedGradient:
        """``gradient`` plus the residual, compressed; the residual becomes what was left out."""
        compressed, self.residual = with_feedback(gradient, self.codec, self.residual)
        return compressed


def save_residual(path: str | Path, residual: Mapping[str, Array], codec: Codec) -> None:
    """Write ``residual`` to ``path`` atomically (a temporary file renamed over it)."""
    target = Path(path)
    doc = encode(
        Gradient(
            {n: np.asarray(a, np.float64) for n, a in residual.items()},
            {"kind": RESIDUAL_KIND, "codec": str(codec)},
        )
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            doc.write_to(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_residual(path: str | Path) -> dict[str, Array] | None:
    """The residual saved at ``path``, or None when there is no such file."""
    target = Path(path)
    if not target.exists():
        return None
    buf = np.fromfile(target, dtype=np.uint8)
    try:
        gradient = decode(buf)
    except FormatError as exc:
        raise CompressionError(f"{target}: not a residual file: {exc}") from exc
    if gradient.meta.get("kind") != RESIDUAL_KIND:
        raise CompressionError(
            f"{target}: not a residual file (kind {gradient.meta.get('kind')!r})"
        )
    for name, array in gradient.tensors.items():
        if array.dtype != np.float64:
            raise CompressionError(f"{target}: residual {name!r} is {array.dtype}, not float64")
    return {n: np.array(a) for n, a in gradient.tensors.items()}
