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
from ..errors import CIDError, FormatError, LimitExceededError, NodeTimeoutError
from ..format import DEFAULT_LIMITS, DocumentHeader, Limits, decode, encode, read_header
from ..store import GradientStore
from . import _exit
from ._nodes import node_from_args
from ._output import announce_written, check_target, open_output
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
            raise FormatError(f"--meta expects KEY=VALUE, got {item!r}")
        if key in meta:
            raise FormatError(f"--meta {key} is given twice")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        meta[key] = parsed
    return meta


def _read_file(path: str) -> np.ndarray:
    """A file's bytes in a NumPy buffer (no big ``bytes`` object)."""
    return np.fromfile(path, dtype=np.uint8)


def _read_document(path: str, parse: Callable[[np.ndarray], T]) -> T:
    """Parse a document file with ``parse``; a refusal names the file."""
    buf = _read_file(path)
    try:
        return parse(buf)
    except LimitExceededError as exc:
        raise LimitExceededError(f"{path}: {exc}") from exc
    except FormatError as exc:
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
    """The decoding limits a command runs with: the defaults, scaled to ``--max-bytes``."""
    max_bytes = getattr(args, "max_bytes", None)
    if max_bytes is None:
        max_bytes = DEFAULT_LIMITS.max_bytes
    if max_bytes <= 0:
        raise LimitExceededError(f"--max-bytes must be positive, got {max_bytes}")
    return Limits(max_bytes=max_bytes, max_elements=max(DEFAULT_LIMITS.max_elements, max_bytes))


def _with_store(
    args: argparse.Namespace, what: str, work: Callable[[GradientStore], Awaitable[T]]
) -> T:
    """Run ``work`` on a store over the chosen node, within ``--timeout`` if given."""

    async def run() -> T:
        node = node_from_args(args)
        deadline = asyncio.timeout(args.timeout)
        try:
            async with deadline:
                return await work(GradientStore(node, limits=_limits(args)))
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise NodeTimeoutError(
                f"{what}: no result from {node.name} within {args.timeout:g}s"
            ) from exc
        finally:
            await node.aclose()

    return asyncio.run(run())


def cmd_encode(args: argparse.Namespace) -> int:
    doc = encode(load_gradient(args.input, parse_meta(args.meta)))
    with open_output(args.output) as out:
        doc.write_to(out.stream)
    announce_written(args.output)
    return _exit.SUCCESS


def cmd_decode(args: argparse.Namespace) -> int:
    limits = _limits(args)
    save_gradient(args.output, _read_document(args.input, lambda buf: decode(buf, limits)))
    announce_written(args.output)
    return _exit.SUCCESS


def cmd_cid(args: argparse.Namespace) -> int:
    if args.raw:
        print(file_cid(_file_pieces(args.input)))
    else:
        print(file_cid(encode(load_gradient(args.input, parse_meta(args.meta)))))
    return _exit.SUCCESS


def cmd_put(args: argparse.Namespace) -> int:
    gradient = load_gradient(args.input, parse_meta(args.meta))
    bar = ProgressBar("put")
    try:
        cid = _with_store(args, "put", lambda s: s.put(gradient, progress=bar))
    finally:
        bar.close()
    print(cid)
    return _exit.SUCCESS


def cmd_get(args: argparse.Namespace) -> int:
    cid = CID.parse(args.cid)
    check_target(args.output)  # before fetching: a directory or a terminal cannot take it
    bar = ProgressBar("get")
    try:
        gradient = _with_store(args, f"get {cid}", lambda s: s.get(cid, progress=bar))
    finally:
        bar.close()
    save_gradient(args.output, gradient)
    announce_written(args.output)
    return _exit.SUCCESS


def cmd_verify(args: argparse.Namespace) -> int:
    cid = CID.parse(args.cid)
    report = _with_store(args, f"verify {cid}", lambda s: s.verify(cid))
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
        header = _read_document(target, lambda buf: read_header(buf, limits))
    else:
        try:
            cid = CID.parse(target)
        except CIDError as exc:
            raise CIDError(f"{target!r} is neither a file nor a CID ({exc})") from exc
        source = str(cid)
        buf = _with_store(args, f"inspect {cid}", lambda s: s.fetch_document(cid))
        header = read_header(buf, _limits(args))
    if args.json:
        print(json.dumps(_header_json(source, header), indent=2, default=_json_default))
    else:
        _print_header(source, header)
    return _exit.SUCCESS


def _header_json(source: str, header: DocumentHeader) -> dict[str, Any]:
    return {
        "source": source,
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
    out.write(
        f"{printable(source)}: gradstore/1, {header.size} bytes, {len(header.tensors)} tensors\n"
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
