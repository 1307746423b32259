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
import math
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..dag import CID
from ..errors import CIDError, FormatError
from ..files import load_gradient, open_gradient
from ..format import EncodedDocument, Limits
from ..store import GradientStore
from . import _exit
from ._documents import DocumentOptions
from ._nodes import node_from_args
from ._output import announce_written, check_target, open_output
from ._patience import Patience
from ._progress import ByteProgressBar
from ._sources import StallReport
from ._text import printable

if TYPE_CHECKING:
    from ..format import Codec, DocumentHeader
    from ..node import Node

T = TypeVar("T")


@dataclass(frozen=True)
class _Session:
    """A node command's options, parsed once: how to reach the node (``--api``,
    ``--local``, ``--api-auth``: ``_nodes``), ``--timeout``, and the documents' limits
    and meta."""

    connect: Callable[[], Node]
    timeout: float
    documents: DocumentOptions

    @classmethod
    def parse(cls, args: argparse.Namespace) -> _Session:
        """The options of ``args``; the node is made when a command runs (in its loop)."""
        return cls(
            lambda: node_from_args(args, wait_s=args.timeout),
            args.timeout,
            DocumentOptions.parse(args),
        )

    def run(
        self,
        subject: str,
        work: Callable[[GradientStore, Callable[[int, int], None]], Awaitable[T]],
        bar: ByteProgressBar | None = None,
        *,
        waiting: Callable[[str], str] | None = None,
        fetching: CID | None = None,
    ) -> T:
        """Run ``work(store, progress)`` on the node, patiently (``--timeout``, "waiting for").

        ``subject`` (a CID, a file) leads refusals; ``waiting(node_name)`` says what is
        awaited (default: the CID ``subject`` from the node). ``fetching``, the CID fetched,
        lets a stall say why it lasts (no peers, no provider).
        """

        async def run() -> T:
            node = self.connect()
            what = waiting(node.name) if waiting else f"CID {subject} from {node.name}"
            stall = None if fetching is None else (fetching, StallReport(node))
            patience = Patience(what, self.timeout, then=bar, fetching=stall)
            try:
                store = GradientStore(node, limits=self.documents.limits)
                return await patience.run(work(store, patience.progress))
            finally:
                await node.aclose()

        with self.refusals(subject):
            return asyncio.run(run())

    @contextlib.contextmanager
    def refusals(self, subject: str) -> Iterator[None]:
        """Size refusals name ``--max-bytes``; format refusals name ``subject`` (a CID of
        something else: say which)."""
        try:
            with self.documents.named_limits(subject):
                yield
        except FormatError as exc:
            raise FormatError(f"{subject}: {exc}") from exc


def cmd_put(args: argparse.Namespace) -> int:
    session = _Session.parse(args)
    if args.compress is not None or args.residual is not None:  # (--residual needs --compress)
        cid = _put_compressed(session, args.input, args.compress, args.residual)
    else:
        cid = _put_file(session, args.input)
    print(cid)
    return _exit.SUCCESS


def _put_file(session: _Session, path: str) -> CID:
    """Store the file's document; an ``.npz`` of plain arrays is read while it is sent."""
    with open_gradient(path, session.documents.meta) as source:
        doc = source.document()  # an .npz is read from here on, while its blocks are sent
        try:
            return _store(session, path, doc, source.check)
        except FormatError:
            failure = source.failure()  # the file's own refusal, as it is worded
            if failure is not None:
                raise failure from None
            raise


def _store(
    session: _Session, path: str, doc: EncodedDocument, check: Callable[[int, Limits], None]
) -> CID:
    """``check(doc.size, limits)`` the document against --max-bytes (``check_fits`` of its
    gradient), then store it with a progress bar."""
    session.documents.check(f"put {path}", check, doc.size)
    bar = ByteProgressBar("put")
    try:
        return session.run(
            path,
            lambda s, progress: s.put_document(doc, progress=progress),
            bar,
            waiting=lambda node: f"{node} to store {path}",
        )
    finally:
        bar.close()


def _put_compressed(session: _Session, path: str, spec: str | None, residual: str | None) -> CID:
    """``put --compress``: the whole gradient is read, compressed (with --residual's
    error feedback), checked against the limits and stored."""
    from ..format import check_fits, encode
    from ._compress_cmd import compressed_update

    gradient = load_gradient(path, session.documents.meta)
    document, stored = compressed_update(spec, residual, gradient)
    cid = _store(
        session, path, encode(document), lambda size, limits: check_fits(document, size, limits)
    )
    stored()
    return cid


def cmd_get(args: argparse.Namespace) -> int:
    """Fetch and verify; a dense document of NumPy's types goes to an ``.npz`` as bytes
    (``files.write_document_npz``: no NumPy), anything else is decoded (decompressed) and
    written."""
    from ..files import is_safetensors, write_document_npz, writes_as_bytes
    from ..format import read_header

    session = _Session.parse(args)
    cid = CID.parse(args.cid)
    check_target(args.output)  # before fetching: a directory or a terminal cannot take it
    bar = ByteProgressBar("get")
    try:
        buf = session.run(
            str(cid),
            lambda s, progress: s.fetch_view(cid, progress=progress),
            bar,
            fetching=cid,
        )
    finally:
        bar.close()
    with session.refusals(str(cid)):
        header = read_header(buf, session.documents.limits)
    if writes_as_bytes(header) and not args.float64 and not is_safetensors(args.output):
        with open_output(args.output) as out:
            write_document_npz(out.stream, header, buf)
        announce_written(args.output)
        return _exit.SUCCESS
    from ..format import from_header
    from ._decompressed import write_dense

    write_dense(
        from_header(buf, header),
        str(cid),
        session.documents,
        output=args.output,
        float64=args.float64,
    )
    return _exit.SUCCESS


def cmd_verify(args: argparse.Namespace) -> int:
    session = _Session.parse(args)
    cid = CID.parse(args.cid)
    report = session.run(
        str(cid), lambda s, progress: s.verify(cid, progress=progress), fetching=cid
    )
    print(
        f"ok {report.cid}: {report.size} bytes, {report.blocks} blocks, "
        f"{report.tensors} tensors, verified in {report.seconds:.2f}s"
    )
    return _exit.SUCCESS


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..format import read_header

    session = _Session.parse(args)
    target: str = args.target
    if Path(target).is_file():
        source = target
        limits = session.documents.limits
        header = session.documents.read_document(target, lambda buf: read_header(buf, limits))
    else:
        try:
            cid = CID.parse(target)
        except CIDError as exc:
            raise CIDError(f"{target!r} is neither a file nor a CID ({exc})") from exc
        source = str(cid)

        async def fetch(store: GradientStore, progress: Callable[[int, int], None]) -> Any:
            return read_header(await store.fetch_document(cid, progress=progress), store.limits)

        header = session.run(str(cid), fetch, fetching=cid)
    if args.json:
        print(json.dumps(_header_json(source, header), indent=2, default=_json_default))
    else:
        _print_header(source, header)
    return _exit.SUCCESS


def _header_json(source: str, header: DocumentHeader) -> dict[str, Any]:
    """``inspect --json``; a compressed document's tensors also say how many ``elements``
    they have and how many of them the payload ``kept`` (fewer for top-k)."""
    tensors = []
    for t in header.tensors:
        entry: dict[str, Any] = {
            "name": t.name,
            "dtype": t.dtype,
            "shape": list(t.shape),
            "nbytes": t.nbytes,
            "offset": t.offset,
        }
        if header.codec is not None:
            entry["elements"] = math.prod(t.shape)
            entry["kept"] = header.codec.kept_elements(entry["elements"])
        tensors.append(entry)
    return {
        "source": source,
        "format": header.format,
        "codec": None if header.codec is None else header.codec.fields(),
        "size": header.size,
        "meta": header.meta,
        "tensors": tensors,
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
    # top-k's k counts per chunk: what each tensor kept is its own column
    sparse = header.codec if header.codec is not None and header.codec.sparse else None
    kept = [] if sparse is None else [_kept(sparse, t.shape) for t in header.tensors]
    kwidth = max([len("kept"), *map(len, kept)])
    kept_title = f"{'kept':<{kwidth}}  " if kept else ""
    out.write(f"  {'name':<{width}}  {'dtype':<{dwidth}}  {'shape':<20}  {kept_title}bytes\n")
    for i, (name, t) in enumerate(zip(names, header.tensors, strict=True)):
        shape = "(" + ", ".join(map(str, t.shape)) + ("," if len(t.shape) == 1 else "") + ")"
        kept_cell = f"{kept[i]:<{kwidth}}  " if kept else ""
        out.write(f"  {name:<{width}}  {t.dtype:<{dwidth}}  {shape:<20}  {kept_cell}{t.nbytes}\n")


def _kept(codec: Codec, shape: tuple[int, ...]) -> str:
    """``10 of 640``: the elements a sparse codec kept of a tensor's."""
    count = math.prod(shape)
    return f"{codec.kept_elements(count)} of {count}"
