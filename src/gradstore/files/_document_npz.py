"""A dense document written as an ``.npz`` straight from its bytes (``gradstore get``).

A tensor of NumPy's types (``format.NUMPY_CODES``, bool included: the reader checked its
bytes) is a ``.npy`` member byte for byte under another header (``_npy``), so ``get``
writes each from the fetched buffer without building arrays and without NumPy. The bytes
are those ``write_npz`` gives for the decoded gradient (the same headers, members, order).
"""

from __future__ import annotations

from typing import BinaryIO

from ..errors import FormatError
from ..format import NUMPY_CODES, DocumentHeader
from ._npy import plain_header
from ._npz_directory import NPY
from ._stored_zip import StoredZipWriter


def writes_as_bytes(header: DocumentHeader) -> bool:
    """Whether every tensor of the (dense) document can be written from its bytes."""
    return header.codec is None and all(t.dtype in NUMPY_CODES for t in header.tensors)


def write_document_npz(stream: BinaryIO, header: DocumentHeader, buf: memoryview) -> None:
    """Write the tensors of ``buf`` (the document ``header`` describes, ``writes_as_bytes``)
    as an ``.npz`` to ``stream``: the bytes ``write_npz`` gives for the decoded gradient."""
    if not writes_as_bytes(header):
        raise FormatError(
            "the document is compressed or holds bfloat16/float8 tensors, which are not "
            ".npy members byte for byte: decode it and use write_npz"
        )
    archive = StoredZipWriter(stream)
    for t in header.tensors:
        data = buf[t.offset : t.offset + t.nbytes]
        archive.add(t.name + NPY, [memoryview(plain_header(t.dtype, t.shape)), data])
    archive.close()
