"""Gradients from and to ``.npz`` files, the CLI's exchange format (never pickled)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import FormatError
from ..format import EXTENDED, Gradient, dtype_code

_PICKLE_REFUSED = "Object arrays cannot be loaded"  # NumPy's message when allow_pickle=False bites


def load_npz(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """Read every array of an ``.npz`` (``allow_pickle=False``) as a gradient."""
    with open(path, "rb"):  # a missing or unreadable file is an OSError naming it
        pass
    if not zipfile.is_zipfile(path):
        raise FormatError(f"{path}: not an .npz file (not a zip archive of .npy arrays)")
    tensors: dict[str, np.ndarray[Any, Any]] = {}
    try:
        with np.load(path, allow_pickle=False) as npz:
            for name in npz.files:
                value = npz[name]
                if not isinstance(value, np.ndarray):
                    raise FormatError(f"{path}: member {name!r} is not a .npy array")
                if value.dtype.kind == "V" and value.dtype.fields is None:
                    raise FormatError(
                        f"{path}: member {name!r} is raw bytes ({value.dtype.str}), which is "
                        "how NumPy's .npy writes bfloat16 and float8 (the type is lost): "
                        "use a .safetensors file"
                    )
                tensors[name] = value
    except FormatError:
        raise
    except ValueError as exc:
        if _PICKLE_REFUSED in str(exc):
            raise FormatError(
                f"{path}: holds an object array (pickled Python objects); "
                "gradstore loads plain numeric arrays only (allow_pickle=False)"
            ) from exc
        raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise FormatError(f"{path}: not a readable .npz of plain arrays ({exc})") from exc
    if not tensors:
        raise FormatError(f"{path}: the .npz holds no arrays")
    return Gradient(tensors, dict(meta or {}))


def check_npz(target: str | Path, gradient: Gradient) -> None:
    """Refuse, before anything is opened, tensors an ``.npz`` cannot hold."""
    for name, array in gradient.tensors.items():
        code = dtype_code(np.asarray(array).dtype)
        if code in EXTENDED:
            raise FormatError(
                f"{target}: tensor {name!r} is {code}, which .npz cannot hold "
                "(NumPy's .npy would write raw bytes and lose the type): "
                "write a .safetensors file instead"
            )


def write_npz(stream: BinaryIO, gradient: Gradient) -> None:
    """Write the tensors as an uncompressed ``.npz`` to ``stream`` (meta is not kept).

    Member by member, so any tensor name works (``file`` included); ``stream`` need not
    be seekable (a pipe: zip's data descriptors then follow each member).
    """
    with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in gradient.tensors.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
