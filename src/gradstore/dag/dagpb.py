"""The dag-pb codec (PBNode / PBLink), canonical on output and strict on input.

Canonical form, as Go and JS write it: a node's Links (field 2) come before its
Data (field 1); a link writes Hash (1), Name (2), Tsize (3) in that order.
The decoder refuses anything else (unknown fields, wrong order, duplicates),
as the dag-pb spec asks, so one node has one encoding and one CID.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ..errors import CIDError, DAGError
from .cid import CID
from .varint import encode_varint, read_varint

_LINKS_TAG = b"\x12"  # field 2, length-delimited
_DATA_TAG = b"\x0a"  # field 1, length-delimited
_HASH_TAG = b"\x0a"
_NAME_TAG = b"\x12"
_TSIZE_TAG = b"\x18"  # field 3, varint


class PBLink(NamedTuple):
    """A dag-pb link. ``name`` ``""`` is written (``12 00``, as Kubo does); None omits it."""

    hash: CID
    name: str | None = ""
    tsize: int | None = None


class PBNode(NamedTuple):
    """A dag-pb node: its links and its (UnixFS) data."""

    links: tuple[PBLink, ...]
    data: bytes | None


def encode_pblink(link: PBLink) -> bytes:
    """The PBLink message bytes (without the outer tag and length)."""
    cid = link.hash.bytes
    parts = [_HASH_TAG, encode_varint(len(cid)), cid]
    if link.name is not None:
        name = link.name.encode("utf-8")
        parts += [_NAME_TAG, encode_varint(len(name)), name]
    if link.tsize is not None:
        parts += [_TSIZE_TAG, encode_varint(link.tsize)]
    return b"".join(parts)


def encode_pbnode(links: Iterable[PBLink], data: bytes | None) -> bytes:
    """Canonical dag-pb bytes: every link, then Data if not None."""
    parts: list[bytes] = []
    for link in links:
        body = encode_pblink(link)
        parts += [_LINKS_TAG, encode_varint(len(body)), body]
    if data is not None:
        parts += [_DATA_TAG, encode_varint(len(data)), bytes(data)]
    return b"".join(parts)


def _read_len(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    n, pos = read_varint(buf, pos, f"{what} length")
    if pos + n > len(buf):
        raise DAGError(f"dag-pb {what} overruns the block at byte {pos}")
    return pos, pos + n


def _decode_link(buf: memoryview, start: int, end: int) -> PBLink:
    pos = start
    cid: CID | None = None
    name: str | None = None
    tsize: int | None = None
    last = 0
    while pos < end:
        tag, pos = read_varint(buf[:end], pos, "dag-pb link tag")
        field = tag >> 3
        if field <= last or field > 3:
            raise DAGError(f"dag-pb link: unexpected or out-of-order field {field} at byte {pos}")
        last = field
        if field == 3:
            if tag & 7 != 0:
                raise DAGError(f"dag-pb link Tsize has wire type {tag & 7}, expected varint")
            tsize, pos = read_varint(buf[:end], pos, "dag-pb Tsize")
            continue
        if tag & 7 != 2:
            raise DAGError(f"dag-pb link field {field} has wire type {tag & 7}, expected bytes")
        a, pos = _read_len(buf[:end], pos, "link field")
        if field == 1:
            try:
                cid = CID.from_bytes(buf[a:pos])
            except CIDError as exc:
                raise DAGError(f"dag-pb link hash is not a supported CID: {exc}") from exc
        else:
            try:
                name = bytes(buf[a:pos]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DAGError("dag-pb link name is not UTF-8") from exc
    if cid is None:
        raise DAGError("dag-pb link without a Hash")
    return PBLink(cid, name, tsize)


def decode_pbnode(block: bytes | bytearray | memoryview, *, max_links: int | None = None) -> PBNode:
    """Parse canonical dag-pb bytes; DAGError on anything malformed or non-canonical.

    ``max_links`` is checked while parsing: a hostile node with tens of thousands of
    links is refused at link ``max_links + 1``, before the rest is read.
    """
    buf = memoryview(block).cast("B")
    pos = 0
    links: list[PBLink] = []
    data: bytes | None = None
    while pos < len(buf):
        tag, pos = read_varint(buf, pos, "dag-pb tag")
        if tag == 0x12:
            if data is not None:
                raise DAGError("dag-pb Links after Data (non-canonical)")
            if max_links is not None and len(links) >= max_links:
                raise DAGError(f"dag-pb node has more than {max_links} links")
            a, pos = _read_len(buf, pos, "link")
            links.append(_decode_link(buf, a, pos))
        elif tag == 0x0A:
            if data is not None:
                raise DAGError("dag-pb node has two Data fields")
            a, pos = _read_len(buf, pos, "Data")
            data = bytes(buf[a:pos])
        else:
            raise DAGError(f"dag-pb node: unexpected field tag 0x{tag:x}")
    return PBNode(tuple(links), data)
