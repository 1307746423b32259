"""The CLI's tensor files, chosen by extension: ``.safetensors``, else ``.npz``.

The same tensors (names, dtypes, shapes, values) give the same gradient, and so the same
CID, from either kind of file; neither keeps the gradient's meta. Files are written
through ``_output`` (``-`` is stdout, as an ``.npz``; special files are written in place).

The readers and writers (NumPy, safetensors) are imported when a file is read or written
whole: ``put`` and ``cid`` of an ``.npz`` of plain arrays stream it (``_npz_stream``)
without them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._closing import Closing
from ..errors import FormatError
from ..format import EncodedDocument, Limits, name_problem
from ._npz_stream import NpzStream
from ._output import check_target, open_output

if TYPE_CHECKING:
    from ..format import Gradient

SAFETENSORS_SUFFIX = ".safetensors"


def is_safetensors(path: str | Path) -> bool:
    """Whether ``path`` names a .safetensors file (by its extension, any case)."""
    return Path(path).suffix.lower() == SAFETENSORS_SUFFIX


def load_gradient(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """The tensors of a .safetensors or .npz file, with ``meta``."""
    if is_safetensors(path):
        from ._safetensors import load_safetensors

        return load_safetensors(path, meta)
    from ._npz import load_npz

    return load_npz(path, meta)


class LoadedGradient(Closing):
    """A gradient read whole from ``path``, with the interface of ``NpzStream``."""

    def __init__(self, gradient: Gradient, path: str | Path) -> None:
        self.gradient = gradient
        self.path = path

    def document(self) -> EncodedDocument:
        """The gradient's document (the format's refusals name the file)."""
        from ..format import encode

        try:
            return encode(self.gradient)
        except FormatError as exc:
            raise FormatError(f"{self.path}: {exc}") from exc

    def check(self, size: int, limits: Limits) -> None:
        """Refuse (``LimitExceededError``) a document of ``size`` bytes over ``limits``."""
        from ..format import check_fits

        check_fits(self.gradient, size, limits)

    def failure(self) -> BaseException | None:
        return None

    def close(self) -> None:
        """Nothing to release: the gradient is in memory."""


def open_gradient(
    path: str | Path, meta: dict[str, Any] | None = None
) -> NpzStream | LoadedGradient:
    """The tensors of a file for ``put`` and ``cid``: an ``.npz`` of plain arrays is read
    while its document is hashed (``_npz_stream``), any other file whole. Use it in a
    ``with``."""
    stream = None if is_safetensors(path) else NpzStream.open(path, meta)
    return stream if stream is not None else LoadedGradient(load_gradient(path, meta), path)


def save_gradient(target: str | Path, gradient: Gradient) -> None:
    """Write the tensors to ``target``: .safetensors by its extension, else .npz.

    Everything that can be refused (names, dtypes, the target) is refused before the
    target is opened: opening a FIFO waits for a reader, and a device must not be
    written half.
    """
    check_target(target)
    for name in gradient.tensors:
        problem = name_problem(name)
        if problem is not None:  # the format refuses these; a Gradient built here may not
            raise FormatError(f"{target}: tensor name {name!r} {problem}")
    if not is_safetensors(target):
        from ._npz import check_npz, write_npz

        check_npz(target, gradient)
        with open_output(target) as out:
            write_npz(out.stream, gradient)
        return
    from ._safetensors import safetensors_arrays, write_safetensors

    arrays = safetensors_arrays(target, gradient)
    with open_output(target) as out:
        if out.path is not None:
            write_safetensors(out.path, arrays, target)
            return
        with tempfile.TemporaryDirectory(prefix="gradstore-") as tmp:
            built = Path(tmp) / "out.safetensors"  # safetensors writes files, not streams
            write_safetensors(built, arrays, target)
            with open(built, "rb") as f:
                shutil.copyfileobj(f, out.stream, 1 << 20)
