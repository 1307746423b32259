"""Gradient -> canonical gradstore/1 bytes, streamed as header pieces and zero-copy data views."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO, Final

import numpy as np

from ..errors import InvalidDocumentError
from ._codec import Codec
from ._compressed import CompressedGradient, CompressedTensor
from ._dtypes import canonical_dtype, normalize_array
from ._gradient import Gradient
from ._names import name_problem
from ._pack import array_header, bin_header, pack_int, pack_meta, pack_str, str_header

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


def encode(g: Gradient | CompressedGradient) -> EncodedDocument:
    """The canonical document of ``g`` (gradstore/1, or gradstore/2 when it is compressed),
    without copying tensor data.

    Arrays are normalised (little-endian, C order; a copy only when needed); compressed
    payloads are checked against their codec's rules. Raises InvalidDocumentError (a
    ValueError) naming the tensor or meta path for anything the format cannot hold.
    """
    if isinstance(g, CompressedGradient):
        return _encode_compressed(g)
    if not isinstance(g, Gradient):
        raise TypeError(f"encode() takes a Gradient, got {type(g).__name__}")
    named = _sorted_names(g.tensors)
    head = bytearray(PREFIX)
    head += pack_meta(g.meta)
    head += KEY_TENSORS + array_header(len(named))
    items = []
    for i, (raw, name, value) in enumerate(named):
        arr = normalize_array(value, f"$.tensors[{i}]")
        code = canonical_dtype(arr.dtype)
        assert code is not None  # normalize_array refuses the rest
        items.append((raw, name, code, arr.shape, arr))
    return _with_tensors(head, items)


def _encode_compressed(g: CompressedGradient) -> EncodedDocument:
    if not isinstance(g.codec, Codec):
        raise InvalidDocumentError(
            f"codec must be a Codec, got {type(g.codec).__name__}", "$.codec"
        )
    named = _sorted_names(g.tensors)
    head = bytearray(PREFIX2)
    head += pack_meta(g.meta)
    head += KEY_CODEC + g.codec.pack() + KEY_TENSORS + array_header(len(named))
    items = []
    for i, (raw, name, t) in enumerate(named):
        path = f"$.tensors[{i}]"
        if not isinstance(t, CompressedTensor):
            raise InvalidDocumentError(
                f"a compressed gradient holds CompressedTensors, got {type(t).__name__}", path
            )
        if t.codec != g.codec:
            raise InvalidDocumentError(
                f"tensor {name!r} uses codec {t.codec}, the document {g.codec}", path
            )
        t.check(f"{path}.data")
        items.append((raw, name, t.dtype_code, t.shape, t.payload))
    return _with_tensors(head, items)


def _sorted_names(tensors: object) -> list[tuple[bytes, str, Any]]:
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


def _with_tensors(
    head: bytearray,
    items: list[tuple[bytes, str, str, tuple[int, ...], np.ndarray[Any, Any]]],
) -> EncodedDocument:
    """The document from its header so far and each tensor's (raw name, name, dtype code,
    shape, data array): tensor maps, pads and zero-copy data views."""
    pieces: list[memoryview] = []
    pos = 0  # document offset where `head` starts
    for i, (raw, name, code, shape, arr) in enumerate(items):
        nbytes = arr.nbytes
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
