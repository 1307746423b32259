"""Gradient -> canonical gradstore/1 bytes, streamed as header pieces and zero-copy data views."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO, Final

import numpy as np

from ..errors import InvalidDocumentError
from ._dtypes import canonical_dtype, normalize_array
from ._gradient import Gradient
from ._names import name_problem
from ._pack import array_header, bin_header, pack_int, pack_meta, pack_str, str_header

FORMAT_ID: Final = "gradstore/1"
ALIGN: Final = 64  # data starts at a multiple of this from the document start

# Fixed pieces, written once: fixmap(3) "format" "gradstore/1" "meta".
PREFIX: Final = b"\x83" + pack_str("format") + pack_str(FORMAT_ID) + pack_str("meta")
KEY_TENSORS: Final = pack_str("tensors")
TENSOR_START: Final = b"\x85" + pack_str("name")  # fixmap(5), first key
KEY_DTYPE: Final = pack_str("dtype")
KEY_SHAPE: Final = pack_str("shape")
KEY_PAD: Final = pack_str("pad")
KEY_DATA: Final = pack_str("data")
PAD_HEADER_LEN: Final = 2  # pad is always a bin8: 0xc4, length
_ZEROS: Final = bytes(ALIGN)
_MAX_BIN: Final = 0xFFFFFFFF


class EncodedDocument:
    """The canonical bytes of one gradient, produced lazily.

    ``size`` is exact before streaming. Iterating yields the small header pieces
    and memoryviews (format ``'B'``) of the tensors' own buffers, in order; they
    concatenate to the document. The arrays are read when streamed, so do not
    modify them in between.
    """

    __slots__ = ("_pieces", "size")

    def __init__(self, pieces: list[memoryview], size: int) -> None:
        self._pieces = pieces
        self.size = size

    def __iter__(self) -> Iterator[memoryview]:
        return iter(self._pieces)

    def __len__(self) -> int:
        return self.size

    def tobytes(self) -> bytes:
        """The whole document as one ``bytes`` (a full copy: for small documents and tests)."""
        return b"".join(self._pieces)

    def write_to(self, f: BinaryIO) -> int:
        """Write the document to a binary file object; returns the number of bytes written."""
        for piece in self._pieces:
            view = piece
            while view.nbytes:
                n = f.write(view)
                if n is None:  # a non-blocking raw file that could not write
                    raise BlockingIOError("write_to needs a blocking file object")
                view = view[n:]
        return self.size

    def __repr__(self) -> str:
        return f"<EncodedDocument {FORMAT_ID} size={self.size} pieces={len(self._pieces)}>"


def encode(g: Gradient) -> EncodedDocument:
    """The canonical gradstore/1 document of ``g``, without copying tensor data.

    Arrays are normalised (little-endian, C order; a copy only when needed).
    Raises InvalidDocumentError (a ValueError) naming the tensor or meta path
    for anything the format cannot hold.
    """
    if not isinstance(g, Gradient):
        raise TypeError(f"encode() takes a Gradient, got {type(g).__name__}")
    if not isinstance(g.tensors, dict):
        raise InvalidDocumentError(
            f"tensors must be a dict, got {type(g.tensors).__name__}", "$.tensors"
        )
    named = []
    for name, value in g.tensors.items():
        if not isinstance(name, str) or not name:
            raise InvalidDocumentError(
                f"tensor names must be non-empty str, got {name!r}", "$.tensors"
            )
        try:
            raw = name.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidDocumentError(
                f"tensor name {name!r} is not valid UTF-8", "$.tensors"
            ) from None
        problem = name_problem(name)
        if problem is not None:
            raise InvalidDocumentError(f"tensor name {name!r} {problem}", "$.tensors")
        named.append((raw, name, value))
    named.sort(key=lambda t: t[0])

    head = bytearray(PREFIX)
    head += pack_meta(g.meta)
    head += KEY_TENSORS + array_header(len(named))
    pieces: list[memoryview] = []
    pos = 0  # document offset where `head` starts
    for i, (raw, name, value) in enumerate(named):
        arr = normalize_array(value, f"$.tensors[{i}]")
        nbytes = arr.nbytes
        if nbytes > _MAX_BIN:
            raise InvalidDocumentError(
                f"tensor {name!r} has {nbytes} bytes; one msgpack bin holds at most 2^32 - 1",
                f"$.tensors[{i}].data",
            )
        code = canonical_dtype(arr.dtype)
        assert code is not None  # normalize_array refuses the rest
        head += TENSOR_START + _str_bytes(raw) + KEY_DTYPE + pack_str(code) + KEY_SHAPE
        head += array_header(arr.ndim)
        for dim in arr.shape:
            head += pack_int(dim)
        head += KEY_PAD
        data_header = bin_header(nbytes)
        unpadded = pos + len(head) + PAD_HEADER_LEN + len(KEY_DATA) + len(data_header)
        pad = -unpadded % ALIGN
        head += bytes((0xC4, pad)) + _ZEROS[:pad] + KEY_DATA + data_header
        pieces.append(memoryview(bytes(head)))
        pos += len(head)
        head = bytearray()
        if nbytes:
            pieces.append(_byte_view(arr))
            pos += nbytes
    if head:
        pieces.append(memoryview(bytes(head)))
        pos += len(head)
    return EncodedDocument(pieces, pos)


def _str_bytes(raw: bytes) -> bytes:
    return str_header(len(raw)) + raw


def _byte_view(arr: np.ndarray[Any, Any]) -> memoryview:
    """A format-'B' memoryview of a C-contiguous array's buffer (no copy)."""
    return arr.reshape(-1).view(np.uint8).data
