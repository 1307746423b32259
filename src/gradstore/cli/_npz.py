"""Gradients from and to ``.npz`` files, the CLI's exchange format (never pickled)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..format import Gradient


def load_npz(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """Read every array of an ``.npz`` (``allow_pickle=False``) as a gradient."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            tensors = {name: np.asarray(npz[name]) for name in npz.files}
    except FileNotFoundError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    if not tensors:
        raise FormatError(f"{path}: the .npz holds no arrays")
    return Gradient(tensors, dict(meta or {}))


def save_npz(path: str | Path, gradient: Gradient) -> None:
    """Write the gradient's tensors to an uncompressed ``.npz`` (meta is not kept)."""
    np.savez(path, **gradient.tensors)  # type: ignore[arg-type]
