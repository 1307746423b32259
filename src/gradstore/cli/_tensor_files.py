"""The CLI's tensor files, chosen by extension: ``.safetensors``, else ``.npz``.

The same tensors (names, dtypes, shapes, values) give the same gradient, and so the same
CID, from either kind of file; neither keeps the gradient's meta.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..format import Gradient
from ._npz import load_npz, save_npz
from ._safetensors import load_safetensors, save_safetensors

SAFETENSORS_SUFFIX = ".safetensors"


def is_safetensors(path: str | Path) -> bool:
    """Whether ``path`` names a .safetensors file (by its extension, any case)."""
    return Path(path).suffix.lower() == SAFETENSORS_SUFFIX


def load_gradient(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """The tensors of a .safetensors or .npz file, with ``meta``."""
    if is_safetensors(path):
        return load_safetensors(path, meta)
    return load_npz(path, meta)


def save_gradient(path: str | Path, gradient: Gradient) -> None:
    """Write the tensors to exactly ``path``: .safetensors by its extension, else .npz."""
    if is_safetensors(path):
        save_safetensors(path, gradient)
    else:
        save_npz(path, gradient)
