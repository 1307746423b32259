"""Where a file is written: never replacing what the path names until the data is complete.

- a symlink: followed, and what it points to gets the data (the link stays);
- a FIFO, a character or block device: written in place, like ``cat > PATH`` (such a
  file cannot be replaced by a regular one without breaking whoever reads it);
- a regular file, or nothing yet: a temporary file next to it, renamed over it once
  complete, so a failure never leaves a half-written file (an existing file's mode is
  kept);
- a directory: refused.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast


@dataclass(frozen=True)
class Output:
    """An open output: ``stream`` to write to; ``path`` when it is a regular file being built
    (a writer that only writes files, such as safetensors', may write there instead)."""

    stream: BinaryIO
    path: Path | None


def check_path(path: str | Path) -> None:
    """Refuse, before any work, a path that cannot be written: a directory."""
    with contextlib.suppress(OSError):  # a missing or unreadable path fails when opened
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))


@contextlib.contextmanager
def open_file(path: str | Path) -> Iterator[Output]:
    """Open ``path`` as the module docstring says; the data counts once the block exits
    (a regular file is renamed into place then; an exception leaves it as it was)."""
    check_path(path)
    real = Path(os.path.realpath(path))
    try:
        mode: int | None = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(real, "wb") as stream:
            yield Output(cast(BinaryIO, SequentialWriter(stream)), None)
        return
    if not real.parent.is_dir():  # (mkstemp's error would name its temporary file)
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(real.parent))
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".part")
    wanted = stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask()
    try:
        with os.fdopen(fd, "wb") as stream:
            os.fchmod(fd, wanted)
            yield Output(stream, Path(tmp))
        os.chmod(tmp, wanted)  # a writer that replaced the file (safetensors) made it 0600
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class SequentialWriter(io.RawIOBase):
    """Writes through to ``stream``, and says it cannot seek.

    ``/dev/null``, a device and a redirected stdout may claim to seek while positions mean
    nothing there; writers that seek back (zip headers) then produce garbage or fail. Told
    the truth, they write sequentially (zip's data descriptors).
    """

    def __init__(self, stream: BinaryIO) -> None:
        super().__init__()
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._stream.write(data)
        return memoryview(data).nbytes

    def flush(self) -> None:
        if not self._stream.closed:
            self._stream.flush()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
