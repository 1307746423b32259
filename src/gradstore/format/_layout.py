"""A document's bytes around its tensor data, and the lazily produced document: no NumPy.

``encode`` (``_encode``) fills the data from arrays; the command line fills it from the
``.npy`` members of a file as it reads them, without building arrays. Both go through
``tensor_layout``, so there is one writer of the canonical header bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Final, NamedTuple, TypeVar

from ..errors import InvalidDocumentError
from ._names import name_problem
from ._pack import array_header, bin_header, pack_int, pack_meta, pack_str, str_header

T = TypeVar("T")

FORMAT_ID: Final = "gradstore/1"
COMPRESSED_FORMAT_ID: Final = "gradstore/2"
ALIGN: Final = 64  # data starts at a multiple of this from the document start

# Fixed pieces, written once: fixmap(3) "format" "gradstore/1" "meta".
PREFIX: Final = b"\x83" + pack_str("format") + pack_str(FORMAT_ID) + pack_str("meta")
KEY_TENSORS: Final = pack_str("tensors")
KEY_CODEC: Final = pack_str("codec")
# fixmap(4) "format" "gradstore/2" "meta": a compressed document (then "codec" before "tensors")
PREFIX2: Final = b"\x84" + pack_str("format") + pack_str(COMPRESSED_FORMAT_ID) + pack_str("meta")
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
    modify them in between. A subclass may produce its pieces as it is iterated
    (``tobytes`` and ``write_to`` iterate).
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
        return b"".join(self)

    def write_to(self, f: BinaryIO) -> int:
        """Write the document to a binary file object; returns the number of bytes written."""
        for piece in self:
            view = piece
            while view.nbytes:
                n = f.write(view)
                if n is None:  # a non-blocking raw file that could not write
                    raise BlockingIOError("write_to needs a blocking file object")
                view = view[n:]
        return self.size

    def __repr__(self) -> str:
        return f"<EncodedDocument {FORMAT_ID} size={self.size} pieces={len(self._pieces)}>"


class TensorSlot(NamedTuple):
    """One tensor as the header writes it: its UTF-8 name, dtype string, shape and size."""

    raw: bytes
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def dense_head(meta: Mapping[str, Any], count: int) -> bytearray:
    """A gradstore/1 document's bytes up to its first tensor: format, meta, ``count`` tensors."""
    head = bytearray(PREFIX)
    head += pack_meta(meta)
    head += KEY_TENSORS + array_header(count)
    return head


def dense_layout(
    meta: Mapping[str, Any], tensors: Mapping[str, tuple[str, tuple[int, ...], int]]
) -> tuple[list[bytes | str], int]:
    """The gradstore/1 document of ``tensors`` (name -> dtype string, shape, data bytes)
    without their data: its header pieces (``bytes``) and, where a tensor's data goes, its
    name (none for an empty tensor); and its size. Names are checked and sorted as by
    ``encode``; the dtypes and sizes are the caller's to get right."""
    named = sorted_names(tensors)
    slots = [TensorSlot(raw, name, *described) for raw, name, described in named]
    pieces, size = tensor_layout(dense_head(meta, len(slots)), slots)
    return [p if isinstance(p, bytes) else named[p][1] for p in pieces], size


def sorted_names(tensors: Mapping[str, T]) -> list[tuple[bytes, str, T]]:
    """(UTF-8 name, name, value) of every tensor, sorted by the UTF-8 bytes."""
    if not isinstance(tensors, dict):
        raise InvalidDocumentError(
            f"tensors must be a dict, got {type(tensors).__name__}", "$.tensors"
        )
    named = []
    for name, value in tensors.items():
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
    return named


def tensor_layout(head: bytearray, slots: Sequence[TensorSlot]) -> tuple[list[bytes | int], int]:
    """The document from its header so far: header pieces (``bytes``), and where tensor
    ``i``'s data goes, ``i`` (none for an empty tensor); and the document's size."""
    pieces: list[bytes | int] = []
    pos = 0  # document offset where `head` starts
    for i, (raw, name, code, shape, nbytes) in enumerate(slots):
        if nbytes > _MAX_BIN:
            raise InvalidDocumentError(
                f"tensor {name!r} has {nbytes} bytes; one msgpack bin holds at most 2^32 - 1",
                f"$.tensors[{i}].data",
            )
        head += TENSOR_START + _str_bytes(raw) + KEY_DTYPE + pack_str(code) + KEY_SHAPE
        head += array_header(len(shape))
        for dim in shape:
            head += pack_int(dim)
        head += KEY_PAD
        data_header = bin_header(nbytes)
        unpadded = pos + len(head) + PAD_HEADER_LEN + len(KEY_DATA) + len(data_header)
        pad = -unpadded % ALIGN
        head += bytes((0xC4, pad)) + _ZEROS[:pad] + KEY_DATA + data_header
        pieces.append(bytes(head))
        pos += len(head)
        head = bytearray()
        if nbytes:
            pieces.append(i)
            pos += nbytes
    if head:
        pieces.append(bytes(head))
        pos += len(head)
    return pieces, pos


def _str_bytes(raw: bytes) -> bytes:
    return str_header(len(raw)) + raw
