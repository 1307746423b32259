"""Store subcommands: encode, decode, cid, put, get, verify, inspect (their parsers: ``_store_args``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..dag import CID, file_cid
from ..errors import CIDError, FormatError, LimitExceededError
from ..format import (
    DEFAULT_LIMITS,
    FORMAT_ID,
    DocumentHeader,
    Limits,
    check_fits,
    decode,
    encode,
    read_header,
)
from ..store import GradientStore
from . import _exit
from ._exit import UsageError
from ._nodes import node_from_args
from ._output import announce_written, check_target, open_output
from ._patience import Patience
from ._progress import ProgressBar
from ._tensor_files import load_gradient, save_gradient
from ._text import printable

T = TypeVar("T")
_FILE_CHUNK = 16 << 20


def parse_meta(items: list[str]) -> dict[str, Any]:
    """``k=v`` pairs: v as JSON when it parses (numbers, true/false/null, quoted strings), else a string."""
    meta: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--meta expects KEY=VALUE, got {item!r}")
        if key in meta:
            raise UsageError(f"--meta {key} is given twice")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        meta[key] = parsed
    return meta


def _read_file(path: str) -> np.ndarray:
    """A file's bytes in a NumPy buffer (no big ``bytes`` object)."""
    return np.fromfile(path, dtype=np.uint8)


def _read_document(args: argparse.Namespace, path: str, parse: Callable[[np.ndarray], T]) -> T:
    """Parse a document file with ``parse``; a refusal names the file (and --max-bytes)."""
    buf = _read_file(path)
    try:
        return parse(buf)
    except LimitExceededError as exc:
        raise _name_the_option(exc, args, path) from exc
    except FormatError as exc:
        if str(exc).startswith(f"not a {FORMAT_ID} document"):
            raise FormatError(f"{path}: {exc}") from exc
        raise FormatError(f"{path}: not a valid gradstore/1 document: {exc}") from exc


def _file_pieces(path: str) -> Any:
    with open(path, "rb") as f:
        while True:
            buf = bytearray(_FILE_CHUNK)
            n = f.readinto(buf)
            if not n:
                return
            yield memoryview(buf)[:n]


def _limits(args: argparse.Namespace) -> Limits:
    """The limits a command runs with: the defaults, scaled to ``--max-bytes``.

    put checks what it stores against the same limits get decodes with, so what one
    stores the other fetches.
    """
    max_bytes = getattr(args, "max_bytes", None) or DEFAULT_LIMITS.max_bytes
    return Limits(max_bytes=max_bytes, max_elements=max(DEFAULT_LIMITS.max_elements, max_bytes))


def _name_the_option(exc: LimitExceededError, args: argparse.Namespace, what: str) -> Exception:
    """A size refusal that says which option raises the limit, and what it is now."""
    text = str(exc)
    if not any(word in text for word in ("max_bytes", "-byte limit", "max_elements")):
        return exc
    limit = _limits(args).max_bytes
    return LimitExceededError(
        f"{what}: {text} (the limit is --max-bytes {limit}; pass a larger --max-bytes N "
        "to allow it)"
    )


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
                work(GradientStore(node, limits=_limits(args)), patience.progress)
            )
        finally:
            await node.aclose()

    try:
        return asyncio.run(run())
    except LimitExceededError as exc:
        raise _name_the_option(exc, args, subject) from exc
    except FormatError as exc:  # a CID of something else: say which
        raise FormatError(f"{subject}: {exc}") from exc


def cmd_encode(args: argparse.Namespace) -> int:
    doc = encode(load_gradient(args.input, parse_meta(args.meta)))
    with open_output(args.output) as out:
        doc.write_to(out.stream)
    announce_written(args.output)
    return _exit.SUCCESS


def cmd_decode(args: argparse.Namespace) -> int:
    limits = _limits(args)
    save_gradient(args.output, _read_document(args, args.input, lambda buf: decode(buf, limits)))
    announce_written(args.output)
    return _exit.SUCCESS


def cmd_cid(args: argparse.Namespace) -> int:
    if args.raw:
        print(file_cid(_file_pieces(args.input)))
    else:
        print(file_cid(encode(load_gradient(args.input, parse_meta(args.meta)))))
    return _exit.SUCCESS


def cmd_put(args: argparse.Namespace) -> int:
    from ._compress_cmd import compressed_update

    gradient = load_gradient(args.input, parse_meta(args.meta))
    document, stored = compressed_update(args, gradient)  # --compress, --residual
    doc = encode(document)
    try:
        check_fits(document, doc.size, _limits(args))
    except LimitExceededError as exc:
        raise _name_the_option(exc, args, f"put {args.input}") from exc
    bar = ProgressBar("put")
    try:
        cid = _with_store(
            args,
            args.input,
            lambda s, progress: s.put_document(doc, progress=progress),
            bar,
            waiting=lambda node: f"{node} to store {args.input}",
        )
    finally:
        bar.close()
    stored()
    print(cid)
    return _exit.SUCCESS


def cmd_get(args: argparse.Namespace) -> int:
    cid = CID.parse(args.cid)
    check_target(args.output)  # before fetching: a directory or a terminal cannot take it
    bar = ProgressBar("get")
    try:
        gradient = _with_store(
            args, str(cid), lambda s, progress: s.get(cid, progress=progress), bar
        )
    finally:
        bar.close()
    save_gradient(args.output, gradient)
    announce_written(args.output)
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
    target: str = args.target
    if Path(target).is_file():
        source = target
        limits = _limits(args)
        header = _read_document(args, target, lambda buf: read_header(buf, limits))
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
