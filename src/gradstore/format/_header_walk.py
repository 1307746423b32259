"""A document's header read from windows of its bytes, for a reader that never holds it whole.

``read_header`` validates a whole document in memory. A document kept on a node and read
back by ranges (``store.StoredDocument``) can be walked instead: ``HeaderWalk`` says which
bytes it needs next (the start, then each tensor's map, which begins where the previous
tensor's data ends), and each window is parsed by the same code as ``read_header``, with
the same refusals. Only the tensors' data is not looked at: the bytes of a ``|b1`` tensor
and a compressed payload are the caller's to check if it uses them.
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import InvalidDocumentError, LimitExceededError, MalformedDocumentError
from ._dtype_codes import ITEMSIZE
from ._header import (
    NOT_A_DOCUMENT,
    DocumentHeader,
    TensorInfo,
    _first_bytes,
    _read_tensor,
    read_head,
)
from ._layout import ALIGN, PREFIX
from ._limits import DEFAULT_LIMITS, Limits
from ._unpack import MAP, Reader
from .codecs import Codec

#: Bytes of a document's start beyond its meta: the format key, the codec map, the tensors key.
_HEAD_SLACK: Final = 4096
#: Bytes of one tensor map beyond its name and shape: keys, headers, dtype, the pad.
_TENSOR_SLACK: Final = 256


class HeaderWalk:
    """Walk a document of ``size`` bytes from windows of it: while ``wanted`` is not None,
    ``feed`` it the document's bytes ``wanted`` names; then ``header()``.

    Refusals are ``read_header``'s (``MalformedDocumentError``, ``InvalidDocumentError``,
    ``LimitExceededError``), with document offsets."""

    def __init__(self, size: int, limits: Limits = DEFAULT_LIMITS) -> None:
        if size > limits.max_bytes:
            raise LimitExceededError(
                f"document is {size} bytes, over max_bytes={limits.max_bytes}", "max_bytes"
            )
        self.size = size
        self.limits = limits
        self._pos: int | None = None  # where the next tensor's map starts (None: at the start)
        self._meta: dict[str, Any] = {}
        self._codec: Codec | None = None
        self._count = 0
        self._infos: list[TensorInfo] = []
        self._prev = b""
        self._elements = 0
        self._dense = 0

    @property
    def wanted(self) -> tuple[int, int] | None:
        """(offset, length) of the bytes to ``feed`` next, or None once the walk is done."""
        if self._pos is None:
            return 0, min(self.size, len(PREFIX) + self.limits.max_meta_bytes + _HEAD_SLACK)
        if len(self._infos) == self._count:
            return None
        start = self._pos - self._pos % ALIGN  # alignment is checked on relative offsets
        most = ALIGN + _TENSOR_SLACK + self.limits.max_name_bytes + 9 * self.limits.max_rank
        return start, min(self.size - start, most)

    def feed(self, window: memoryview) -> None:
        """Parse the bytes ``wanted`` named (a format-'B' view of exactly that range)."""
        wanted = self.wanted
        if wanted is None:
            raise ValueError("the walk is done: nothing more is wanted")
        start, length = wanted
        if window.nbytes != length:
            raise ValueError(f"wanted {length} bytes at {start}, got {window.nbytes}")
        if self._pos is None:
            self._head(window)
        else:
            self._tensor(window, start)
        if self.wanted is None and self._pos != self.size:
            assert self._pos is not None
            raise MalformedDocumentError(
                f"{self.size - self._pos} trailing bytes after the document", self._pos
            )

    def header(self) -> DocumentHeader:
        """The header, once ``wanted`` is None."""
        if self.wanted is not None:
            raise ValueError(f"the walk is not done: it wants {self.wanted}")
        return DocumentHeader(self._meta, tuple(self._infos), self.size, self._codec)

    def _head(self, window: memoryview) -> None:
        first = Reader(window, 0, window.nbytes)
        if window.nbytes and window[0] != PREFIX[0] and first.head()[0] is not MAP:
            raise InvalidDocumentError(
                f"{NOT_A_DOCUMENT} (it would begin with a msgpack map of format, meta, "
                f"tensors; this begins with {_first_bytes(window)})",
                "$",
            )
        r = Reader(window, 0, window.nbytes)
        self._meta, self._codec, self._count = read_head(r, self.limits)
        self._pos = r.pos

    def _tensor(self, window: memoryview, start: int) -> None:
        assert self._pos is not None
        # reads of the map stay inside the window (its length bounds any map the limits
        # allow); the data is only skipped, up to the document's end
        r = Reader(window, self._pos - start, self.size - start)
        i = len(self._infos)
        limits = self.limits
        try:
            info, self._prev, n = _read_tensor(
                r,
                i,
                self._prev,
                limits,
                limits.max_elements - self._elements,
                self._codec,
                limits.max_bytes - self._dense,
                check_data=False,
            )
        except MalformedDocumentError as exc:  # its offset is the window's: say the document's
            if exc.offset is None:
                raise
            message = str(exc).rpartition(" - at byte ")[0]
            raise MalformedDocumentError(message, exc.offset + start) from None
        self._elements += n
        self._dense += n * ITEMSIZE[info.dtype]
        self._infos.append(
            TensorInfo(info.name, info.dtype, info.shape, info.offset + start, info.nbytes)
        )
        self._pos = start + r.pos
