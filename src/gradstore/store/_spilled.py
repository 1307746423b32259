"""A verified document's bytes kept in a local file (a coordinator's spill file), read by ranges.

The coordinator writes the bytes of a document it fetched and hashed to a file of its own
while it verifies it; when the round is aggregated, ``SpilledDocument`` reads them back
with ``preadv`` straight into the caller's array (off the event loop, no copy), instead of
fetching and hashing every leaf from the node again. The file is trusted only by the
process that wrote it: a restart deletes it and verifies the input again.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DAGError
from ..format import Codec, TensorInfo
from ._stored import StoredGradient
from ._stored_compressed import StoredCompressed, StoredSparse


class SpilledDocument:
    """The ``size`` bytes of a verified document in the file at ``path`` (opened at once)."""

    def __init__(self, path: str | Path, size: int) -> None:
        self.path = Path(path)
        self.size = size
        self._fd: int | None = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        held = os.fstat(self._fd).st_size
        if held != size:
            self.close()
            raise DAGError(f"spill file {self.path} holds {held} bytes, the document {size}")

    def close(self) -> None:
        """Close the file (reads after this fail)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def read_into(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        """Fill ``out`` (uint8) with the document's bytes ``offset .. offset + len(out)``."""
        length = int(out.size)
        if offset < 0 or offset + length > self.size:
            raise ValueError(f"range {offset}+{length} is outside the {self.size}-byte document")
        if length:
            await asyncio.to_thread(self._pread, offset, out)

    def _pread(self, offset: int, out: np.ndarray[Any, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"spill file {self.path} is closed")
        view = out.data.cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got == 0:
                raise DAGError(f"spill file {self.path} ended at {offset + done} of {self.size}")
            done += got


def spilled_source(
    document: SpilledDocument, tensors: Mapping[str, TensorInfo], codec: Codec | None
) -> StoredGradient | StoredCompressed:
    """An ``aggregate.InputSource`` over a spilled document: the same readers as over the
    node (``StoredGradient``, or ``StoredCompressed``/``StoredSparse`` decompressing)."""
    if codec is None:
        return StoredGradient(document, tensors)
    kind = StoredSparse if codec.sparse else StoredCompressed
    return kind(document, tensors, codec)
