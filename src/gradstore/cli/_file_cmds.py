"""encode, decode, cid: the store commands that need no node (their parsers: ``_store_args``).

They import neither the node layer nor httpx nor asyncio, and what needs NumPy only in
the command that uses it: a ``gradstore cid`` of an ``.npz`` of plain arrays starts with
what hashing a file needs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from ..dag import file_cid
from ..files import open_gradient
from . import _exit
from ._documents import DocumentOptions
from ._exit import UsageError
from ._output import announce_written, open_output

_FILE_CHUNK = 16 << 20


def cmd_encode(args: argparse.Namespace) -> int:
    """Write the document; refused, as put refuses it, when decode could not read it back."""
    options = DocumentOptions.parse(args)
    with open_gradient(args.input, options.meta) as source:
        doc = source.document()
        options.check(f"encode {args.input}", source.check, doc.size)
        with open_output(args.output) as out:
            doc.write_to(out.stream)  # an .npz is read from here on
    announce_written(args.output)
    return _exit.SUCCESS


def cmd_decode(args: argparse.Namespace) -> int:
    from ..format import decode_any
    from ._decompressed import write_dense

    options = DocumentOptions.parse(args)
    limits = options.limits
    document = options.read_document(args.input, lambda buf: decode_any(buf, limits))
    write_dense(document, args.input, options, output=args.output, float64=args.float64)
    return _exit.SUCCESS


def cmd_cid(args: argparse.Namespace) -> int:
    if args.raw:
        ignored = [
            opt for opt, given in (("--meta", args.meta), ("--max-bytes", args.max_bytes)) if given
        ]
        if ignored:  # they shape or bound a document, and --raw makes none
            raise UsageError(
                f"--raw hashes the file's bytes as they are: {' and '.join(ignored)} cannot apply"
            )
        print(file_cid(_file_pieces(args.input)))
    else:
        options = DocumentOptions.parse(args)
        with open_gradient(args.input, options.meta) as source:
            doc = source.document()
            options.check(f"cid {args.input}", source.check, doc.size)  # as put's
            print(file_cid(doc))
    return _exit.SUCCESS


def _file_pieces(path: str) -> Iterator[memoryview]:
    with open(path, "rb") as f:
        while True:
            buf = bytearray(_FILE_CHUNK)
            n = f.readinto(buf)
            if not n:
                return
            yield memoryview(buf)[:n]
