"""The ``.npy`` header of a plain array, read and written without NumPy.

A plain array is what a gradstore/1 document holds byte for byte: one of NumPy's
little-endian numeric types but bool (whose bytes must be checked), in C order. For it,
an ``.npz`` member and a document tensor differ only in their headers, so ``put``, ``cid``
and ``get`` move the bytes as they are and never build an array. Everything else
(big-endian, Fortran order, bool, raw bytes, objects, a header this reader does not
take) is left to NumPy's own reader, which converts or refuses it as it always has.

The header written is exactly NumPy's (``np.save``, format 1.0, else 2.0): the dict's
``repr`` with sorted keys, spare spaces after the shape so it may grow, padded with spaces
and a newline to a multiple of 64 bytes.
"""

from __future__ import annotations

import ast
import struct
from dataclasses import dataclass
from typing import Final

from ..format import ITEMSIZE, NUMPY_CODES

MAGIC: Final = b"\x93NUMPY"
_PREFIX_LEN: Final = len(MAGIC) + 2  # magic, major, minor
_LENGTH: Final = {(1, 0): struct.Struct("<H"), (2, 0): struct.Struct("<I")}
ALIGN: Final = 64
MAX_HEADER: Final = 10_000
"""Longer headers are left to NumPy (which refuses them unless pickles are allowed)."""
_GROWTH_DIGITS: Final = 21  # NumPy's spare room for the growing axis' length

PLAIN: Final = frozenset(NUMPY_CODES) - {"|b1"}
"""The ``descr`` of every plain array: the document's dtype strings for NumPy's types, but
``|b1``."""

_KEYS: Final = frozenset(("descr", "fortran_order", "shape"))
MAX_RANK: Final = 32
"""Higher ranks are left to NumPy: 32 dimensions is NumPy 1.26's limit (2.x allows 64)."""
_MAX_INTP: Final = (1 << 63) - 1  # NumPy refuses arrays whose extent in bytes passes this


@dataclass(frozen=True)
class PlainHeader:
    """A parsed header of a plain array: its dtype string, shape and header length."""

    dtype: str
    shape: tuple[int, ...]
    length: int  # bytes from the magic to the first data byte

    @property
    def nbytes(self) -> int:
        """Bytes of data the header declares."""
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


def parse_plain(raw: bytes) -> PlainHeader | None:
    """The header at the start of ``raw`` if it is a plain array's (1.0 or 2.0); else None.

    ``raw`` holds at least the whole header, or the member ends before it does (then None:
    NumPy's reader gives the refusal). Accepted only where NumPy would read the same
    array: the same keys and types NumPy checks, non-negative dimensions.
    """
    if len(raw) < _PREFIX_LEN or raw[: len(MAGIC)] != MAGIC:
        return None
    size = _LENGTH.get((raw[6], raw[7]))
    if size is None or len(raw) < _PREFIX_LEN + size.size:
        return None
    (text_len,) = size.unpack_from(raw, _PREFIX_LEN)
    start = _PREFIX_LEN + size.size
    if text_len > MAX_HEADER or len(raw) < start + text_len:
        return None
    try:
        fields = ast.literal_eval(raw[start : start + text_len].decode("latin1"))
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(fields, dict) or fields.keys() != _KEYS:
        return None
    descr, fortran, shape = fields["descr"], fields["fortran_order"], fields["shape"]
    if not (isinstance(descr, str) and descr in PLAIN and isinstance(fortran, bool)):
        return None
    if not isinstance(shape, tuple) or not all(type(d) is int and d >= 0 for d in shape):
        return None
    if fortran and len(shape) > 1:  # another element order: NumPy transposes it
        return None
    if len(shape) > MAX_RANK or not _numpy_can_hold(ITEMSIZE[descr], shape):
        return None
    return PlainHeader(descr, shape, start + text_len)


def _numpy_can_hold(itemsize: int, shape: tuple[int, ...]) -> bool:
    """Whether NumPy makes an array of this shape (a zero-size one too: NumPy multiplies
    the other dimensions and refuses an extent past its index type)."""
    extent = itemsize
    for d in shape:
        extent *= max(d, 1)
        if extent > _MAX_INTP:
            return False
    return True


def plain_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes for a C-order array of ``dtype`` (in ``PLAIN``, or
    ``|b1``) and ``shape``: format 1.0, or 2.0 when the header is too long for it."""
    text = f"{{'descr': {dtype!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    if shape:
        text += " " * (_GROWTH_DIGITS - len(repr(shape[0])))
    body = text.encode("latin1")
    for version, size in _LENGTH.items():
        length = len(body) + 1  # the final newline
        pad = ALIGN - (_PREFIX_LEN + size.size + length) % ALIGN
        if length + pad <= (1 << (8 * size.size)) - 1:
            prefix = MAGIC + bytes(version) + size.pack(length + pad)
            return prefix + body + b" " * pad + b"\n"
    raise ValueError(f"the .npy header of shape {shape} is too long")
