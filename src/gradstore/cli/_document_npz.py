"""A fetched dense document written as an ``.npz`` straight from its bytes (``get``).

A tensor of NumPy's types (``format.NUMPY_CODES``, bool included: the reader checked its
bytes) is a ``.npy`` member byte for byte under another header (``_npy``), so ``get``
writes each from the fetched buffer without building arrays and without NumPy. The bytes
are those ``write_npz`` gives for the decoded gradient (the same headers, members, order).
"""

from __future__ import annotations

from pathlib import Path

from ..format import NUMPY_CODES, DocumentHeader
from ._npy import plain_header
from ._npz_directory import NPY
from ._output import open_output
from ._stored_zip import StoredZipWriter


def writes_as_bytes(header: DocumentHeader) -> bool:
    """Whether every tensor of the (dense) document can be written from its bytes."""
    return header.codec is None and all(t.dtype in NUMPY_CODES for t in header.tensors)


def write_document_npz(target: str | Path, header: DocumentHeader, buf: memoryview) -> None:
    """Write the tensors of ``buf`` (the document ``header`` describes) as an ``.npz``."""
    assert writes_as_bytes(header)
    with open_output(target) as out:
        archive = StoredZipWriter(out.stream)
        for t in header.tensors:
            data = buf[t.offset : t.offset + t.nbytes]
            archive.add(t.name + NPY, [memoryview(plain_header(t.dtype, t.shape)), data])
        archive.close()
