"""put, get, verify, inspect: the store commands that talk to a node (their parsers: ``_store_args``).

encode, decode and cid need no node: they are in ``_file_cmds``, which imports none of this.
What needs NumPy (decoding, writing tensor files, compressing) is imported by the
commands that use it: ``put`` of an ``.npz`` of plain arrays runs without NumPy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..dag import CID
from ..errors import CIDError, FormatError
from ..files import load_gradient, open_gradient
from ..format import EncodedDocument, Limits
from ..store import GradientStore
from . import _exit
from ._documents import (
    check_limits,
    command_limits,
    named_limits,
    parse_meta,
    read_document,
)
from ._nodes import node_from_args
from ._output import announce_written, check_target, open_output
from ._patience import Patience
from ._progress import ProgressBar
from ._text import printable

if TYPE_CHECKING:
    from ..format import DocumentHeader

T = TypeVar("T")


def _with_store(
    args: argparse.Namespace,
    subject: str,
    work: Callable[[GradientStore, Callable[[int, int], None]], Awaitable[T]],
    bar: ProgressBar | None = None,
    *,
    waiting: Callable[[str], str] | None = None,
) -> T:
    """Run ``work(store, progress)`` on the chosen node, patiently (``--timeout``, "waiting for").

    ``subject`` (a CID, a file) leads refusals; ``waiting(node_name)`` says what is awaited
    (default: the CID ``subject`` from the node).
    """

    async def run() -> T:
        node = node_from_args(args, wait_s=args.timeout)
        what = waiting(node.name) if waiting else f"CID {subject} from {node.name}"
        patience = Patience(what, args.timeout, then=bar)
        try:
            return await patience.run(
                work(GradientStore(node, limits=command_limits(args)), patience.progress)
            )
        finally:
            await node.aclose()

    with _refusals(args, subject):
        return asyncio.run(run())


@contextlib.contextmanager
def _refusals(args: argparse.Namespace, subject: str) -> Iterator[None]:
    """Size refusals name ``--max-bytes``; format refusals name ``subject`` (a CID of
    something else: say which)."""
    try:
        with named_limits(args, subject):
            yield
    except FormatError as exc:
        raise FormatError(f"{subject}: {exc}") from exc


def cmd_put(args: argparse.Namespace) -> int:
    if args.compress is not None or args.residual is not None:  # (--residual needs --compress)
        cid = _put_compressed(args)
        print(cid)
        return _exit.SUCCESS
    with open_gradient(args.input, parse_meta(args.meta)) as source:
        doc = source.document()  # an .npz is read from here on, while its blocks are sent
        try:
            cid = _store(args, doc, source.check)
        except FormatError:
            failure = source.failure()  # the file's own refusal, as it is worded
            if failure is not None:
                raise failure from None
            raise
    print(cid)
    return _exit.SUCCESS


def _store(
    args: argparse.Namespace, doc: EncodedDocument, check: Callable[[int, Limits], None]
) -> object:
    """``check(doc.size, limits)`` the document against --max-bytes (``check_fits`` of its
    gradient), then store it with a progress bar."""
    check_limits(args, f"put {args.input}", check, doc.size)
    bar = ProgressBar("put")
    try:
        return _with_store(
            args,
            args.input,
            lambda s, progress: s.put_document(doc, progress=progress),
            bar,
            waiting=lambda node: f"{node} to store {args.input}",
        )
    finally:
        bar.close()


def _put_compressed(args: argparse.Namespace) -> object:
    """``put --compress``: the whole gradient is read, compressed (with --residual's
    error feedback), checked against the limits and stored."""
    from ..format import check_fits, encode
    from ._compress_cmd import compressed_update

    gradient = load_gradient(args.input, parse_meta(args.meta))
    document, stored = compressed_update(args, gradient)  # --compress, --residual
    cid = _store(args, encode(document), lambda size, limits: check_fits(document, size, limits))
    stored()
    return cid


def cmd_get(args: argparse.Namespace) -> int:
    """Fetch and verify; a dense document of NumPy's types goes to an ``.npz`` as bytes
    (``files.write_document_npz``: no NumPy), anything else is decoded (decompressed) and
    written."""
    from ..files import is_safetensors, write_document_npz, writes_as_bytes
    from ..format import read_header

    cid = CID.parse(args.cid)
    check_target(args.output)  # before fetching: a directory or a terminal cannot take it
    bar = ProgressBar("get")
    try:
        buf = _with_store(
            args, str(cid), lambda s, progress: s.fetch_view(cid, progress=progress), bar
        )
    finally:
        bar.close()
    with _refusals(args, str(cid)):
        header = read_header(buf, command_limits(args))
    if writes_as_bytes(header) and not args.float64 and not is_safetensors(args.output):
        with open_output(args.output) as out:
            write_document_npz(out.stream, header, buf)
        announce_written(args.output)
        return _exit.SUCCESS
    from ..format import from_header
    from ._decompressed import write_dense

    write_dense(from_header(buf, header), args, str(cid))
    return _exit.SUCCESS


def cmd_verify(args: argparse.Namespace) -> int:
    cid = CID.parse(args.cid)
    report = _with_store(args, str(cid), lambda s, progress: s.verify(cid, progress=progress))
    print(
        f"ok {report.cid}: {report.size} bytes, {report.blocks} blocks, "
        f"{report.tensors} tensors, verified in {report.seconds:.2f}s"
    )
    return _exit.SUCCESS


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..format import read_header

    target: str = args.target
    if Path(target).is_file():
        source = target
        limits = command_limits(args)
        header = read_document(args, target, lambda buf: read_header(buf, limits))
    else:
        try:
            cid = CID.parse(target)
        except CIDError as exc:
            raise CIDError(f"{target!r} is neither a file nor a CID ({exc})") from exc
        source = str(cid)

        async def fetch(store: GradientStore, progress: Callable[[int, int], None]) -> Any:
            return read_header(await store.fetch_document(cid, progress=progress), store.limits)

        header = _with_store(args, str(cid), fetch)
    if args.json:
        print(json.dumps(_header_json(source, header), indent=2, default=_json_default))
    else:
        _print_header(source, header)
    return _exit.SUCCESS


def _header_json(source: str, header: DocumentHeader) -> dict[str, Any]:
    return {
        "source": source,
        "format": header.format,
        "codec": None if header.codec is None else header.codec.fields(),
        "size": header.size,
        "meta": header.meta,
        "tensors": [
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "nbytes": t.nbytes,
                "offset": t.offset,
            }
            for t in header.tensors
        ],
    }


def _json_default(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _print_header(source: str, header: DocumentHeader) -> None:
    """The text listing; meta keys come from the network unchecked, so they are escaped."""
    out = sys.stdout
    codec = "" if header.codec is None else f" ({header.codec})"
    out.write(
        f"{printable(source)}: {header.format}{codec}, {header.size} bytes, "
        f"{len(header.tensors)} tensors\n"
    )
    if header.meta:
        out.write("meta:\n")
        for key, value in header.meta.items():
            out.write(f"  {printable(key)} = {printable(repr(value))}\n")
    names = [printable(t.name) for t in header.tensors]  # the format refuses controls already
    width = max([len("name"), *map(len, names)])
    dwidth = max([len("dtype"), *(len(t.dtype) for t in header.tensors)])  # "float8_e4m3fn"
    out.write(f"  {'name':<{width}}  {'dtype':<{dwidth}}  {'shape':<20}  bytes\n")
    for name, t in zip(names, header.tensors, strict=True):
        shape = "(" + ", ".join(map(str, t.shape)) + ("," if len(t.shape) == 1 else "") + ")"
        out.write(f"  {name:<{width}}  {t.dtype:<{dwidth}}  {shape:<20}  {t.nbytes}\n")
