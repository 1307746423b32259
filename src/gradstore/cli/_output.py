"""Where ``-o`` writes: a path as ``gradstore.files`` writes it, and ``-`` for stdout.

- ``-``: standard output (refused when it is a terminal: the bytes are binary);
- any other path: ``files.open_file`` (a symlink followed, a FIFO or device written in
  place, a regular file replaced only once complete, a directory refused).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

from ..files import Output, SequentialWriter, check_path, open_file
from ._exit import UsageError

if TYPE_CHECKING:
    from ..format import Gradient

STDOUT = "-"


def is_stdout(target: str | Path) -> bool:
    """Whether ``-o`` names standard output."""
    return str(target) == STDOUT


def check_target(target: str | Path, *, terminal: bool = False) -> None:
    """Refuse, before any work, an output that cannot be written (a directory; a terminal,
    unless ``terminal``: the output is text)."""
    if is_stdout(target):
        if not terminal and sys.stdout.isatty():
            raise UsageError(
                "-o - would write binary data to the terminal: redirect stdout (> FILE, | ...)"
            )
        return
    check_path(target)


def announce_written(target: str | Path, line: str | None = None) -> None:
    """Print the result line (default: the path written) on stdout, or on stderr when the
    data itself went to stdout."""
    text = str(target) if line is None else line
    if is_stdout(target):
        if line is not None:
            print(text, file=sys.stderr)
        return
    print(text)


@contextlib.contextmanager
def open_output(target: str | Path, *, terminal: bool = False) -> Iterator[Output]:
    """Open ``target`` as the module docstring says; the data counts once the block exits.

    ``terminal``: the bytes are text, fit for a terminal when ``-`` is one.
    """
    check_target(target, terminal=terminal)
    if not is_stdout(target):
        with open_file(target) as out:
            yield out
        return
    sys.stdout.flush()
    yield Output(cast(BinaryIO, SequentialWriter(sys.stdout.buffer)), None)
    sys.stdout.buffer.flush()


def save_output(target: str | Path, gradient: Gradient) -> None:
    """Write ``gradient``'s tensors to ``-o target`` (``files.save_gradient``: .safetensors
    by its extension, else .npz; ``-`` is stdout, as an .npz), everything that can be
    refused refused before it is opened."""
    from ..files import save_gradient

    check_target(target)
    save_gradient(target, gradient, output=open_output)
