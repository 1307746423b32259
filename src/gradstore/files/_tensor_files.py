"""Tensor files chosen by extension: ``.safetensors``, else ``.npz``.

The same tensors (names, dtypes, shapes, values) give the same gradient, and so the same
CID, from either kind of file; neither keeps the gradient's meta. Files are written
through ``_target`` (special files in place, regular ones replaced once complete).

The readers and writers (NumPy, safetensors) are imported when a file is read or written
whole: an ``.npz`` of plain arrays is streamed into its document (``_npz_stream``)
without them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._closing import Closing
from ..errors import FormatError
from ..format import EncodedDocument, Limits
from ._names import check_names
from ._npz_stream import NpzStream
from ._target import Output, open_file

if TYPE_CHECKING:
    from ..format import Gradient

SAFETENSORS_SUFFIX = ".safetensors"

Opener = Callable[[str | Path], AbstractContextManager[Output]]
"""How a path is opened for writing: ``open_file``, or a caller's own (the command line's
also takes ``-`` for standard output)."""


def is_safetensors(path: str | Path) -> bool:
    """Whether ``path`` names a .safetensors file (by its extension, any case)."""
    return Path(path).suffix.lower() == SAFETENSORS_SUFFIX


def load_gradient(path: str | Path, meta: dict[str, Any] | None = None) -> Gradient:
    """The tensors of a .safetensors (by its extension) or .npz file, with ``meta``.

    Raises FormatError for a file that is not a readable one of its kind (never unpickled),
    OSError for a missing or unreadable file, MissingExtraError for a .safetensors file
    without the ``safetensors`` extra.
    """
    if is_safetensors(path):
        from ._safetensors import load_safetensors

        return load_safetensors(path, meta)
    from ._npz import load_npz

    return load_npz(path, meta)


class LoadedGradient(Closing):
    """A gradient read whole from ``path``, with the interface of ``NpzStream`` (what
    ``open_gradient`` gives for a file that is not streamed)."""

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
        """Nothing is read after opening: no failure to report."""
        return None

    def close(self) -> None:
        """Nothing to release: the gradient is in memory."""


def open_gradient(
    path: str | Path, meta: dict[str, Any] | None = None
) -> NpzStream | LoadedGradient:
    """A tensor file whose ``document()`` is to be stored, hashed or written: an ``.npz`` of
    plain arrays is read while its document is (``NpzStream``: a few MiB in memory, no
    NumPy), any other file whole (``LoadedGradient``). Use it in a ``with``."""
    stream = None if is_safetensors(path) else NpzStream.open(path, meta)
    return stream if stream is not None else LoadedGradient(load_gradient(path, meta), path)


def save_gradient(target: str | Path, gradient: Gradient, *, output: Opener = open_file) -> None:
    """Write the tensors to ``target``: .safetensors by its extension, else .npz (the
    gradient's meta is not kept), opened by ``output`` (``open_file``: a file is replaced
    only once complete).

    Everything that can be refused (names, dtypes) is refused before the target is opened:
    opening a FIFO waits for a reader, and a device must not be written half. Refusals
    (FormatError) name ``target``.
    """
    check_names(target, gradient)
    if not is_safetensors(target):
        from ._npz import check_npz, write_npz

        check_npz(target, gradient)
        with output(target) as out:
            write_npz(out.stream, gradient)
        return
    from ._safetensors import copy_safetensors, safetensors_arrays, write_safetensors_file

    arrays = safetensors_arrays(target, gradient)
    with output(target) as out:
        if out.path is not None:
            write_safetensors_file(out.path, arrays, target)
        else:
            copy_safetensors(out.stream, arrays, target)
