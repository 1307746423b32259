"""Tensor files as gradients: ``.npz`` and ``.safetensors``, read and written without pickles.

    from gradstore.files import load_gradient, save_gradient, write_npz

    gradient = load_gradient("update.npz", meta={"round": 3})   # or "update.safetensors"
    save_gradient("back.safetensors", gradient)                # by its extension, else .npz
    with open("copy.npz", "wb") as f:                          # any binary stream, pipes too
        write_npz(f, gradient)

The same tensors give the same gradient, and so the same CID, from either kind of file;
neither keeps the gradient's meta. ``.npz`` members are read as ``np.load`` reads them
(``allow_pickle=False``), every stored member's CRC-32 checked; ``.npz`` files are written
as ``np.savez`` writes them. ``.safetensors`` needs the optional ``safetensors`` extra,
which is imported only when such a file is used (``MissingExtraError`` names it).

``open_gradient`` gives a file's document to store, hash or write: an ``.npz`` of plain
arrays (NumPy's little-endian numeric types but bool, in C order) is read while its
document is (``NpzStream``: a few MiB of memory whatever the file's size, no NumPy).
``save_gradient`` replaces a file only once it is complete (``open_file``).

Names are loaded on first use (``_lazy_exports``): importing this package loads neither
NumPy nor safetensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ._document_npz import write_document_npz, writes_as_bytes
    from ._npz import check_npz_dtypes, load_npz, write_npz
    from ._npz_stream import NpzStream
    from ._safetensors import CODES as SAFETENSORS_DTYPES
    from ._safetensors import load_safetensors, write_safetensors
    from ._target import Output, SequentialWriter, check_path, open_file
    from ._tensor_files import (
        LoadedGradient,
        Opener,
        is_safetensors,
        load_gradient,
        open_gradient,
        save_gradient,
    )

_HOMES: dict[str, str] = {
    "write_document_npz": "_document_npz",
    "writes_as_bytes": "_document_npz",
    "check_npz_dtypes": "_npz",
    "load_npz": "_npz",
    "write_npz": "_npz",
    "NpzStream": "_npz_stream",
    "SAFETENSORS_DTYPES": "_safetensors:CODES",
    "load_safetensors": "_safetensors",
    "write_safetensors": "_safetensors",
    "Output": "_target",
    "SequentialWriter": "_target",
    "check_path": "_target",
    "open_file": "_target",
    "LoadedGradient": "_tensor_files",
    "Opener": "_tensor_files",
    "is_safetensors": "_tensor_files",
    "load_gradient": "_tensor_files",
    "open_gradient": "_tensor_files",
    "save_gradient": "_tensor_files",
}
"""Where each name lives (the TYPE_CHECKING imports above say the same)."""


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "SAFETENSORS_DTYPES",
    "LoadedGradient",
    "NpzStream",
    "Opener",
    "Output",
    "SequentialWriter",
    "check_npz_dtypes",
    "check_path",
    "is_safetensors",
    "load_gradient",
    "load_npz",
    "load_safetensors",
    "open_file",
    "open_gradient",
    "save_gradient",
    "write_document_npz",
    "write_npz",
    "write_safetensors",
    "writes_as_bytes",
]
