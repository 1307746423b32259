"""One IPFS block (CID + bytes) and the CIDs it links to."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import DAGError
from . import cbor
from .cid import CID, DAG_CBOR, DAG_PB, RAW
from .dagpb import decode_pbnode


class Block(NamedTuple):
    """One IPFS block: its CID and its bytes (a memoryview when it slices a bigger buffer)."""

    cid: CID
    data: bytes | memoryview


def block_links(block: Block) -> list[CID]:
    """The CIDs a block links to, in order: dag-pb links, dag-cbor links, [] for raw."""
    if block.cid.codec == RAW:
        return []
    if block.cid.codec == DAG_PB:
        return [link.hash for link in decode_pbnode(block.data).links]
    if block.cid.codec == DAG_CBOR:
        return _cbor_links(block)
    raise DAGError(f"cannot list links of a {block.cid.codec_name} block")  # pragma: no cover


def _cbor_links(block: Block) -> list[CID]:
    try:
        value = cbor.decode(block.data)
    except DAGError as exc:
        raise DAGError(f"dag-cbor block {block.cid} is {exc}") from None
    found: list[CID] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, CID):
            found.append(item)
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return found
