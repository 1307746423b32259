"""The balanced UnixFS file DAG of the unixfs-v1-2025 profile, built while streaming.

Same tree as boxo's ``importer/balanced`` (Kubo ``ipfs add``): the first leaf
is the root; while data remains, a new root takes the old one as its first
child and is filled to the current depth, so depth grows only when the tree is
full. A node is filled with leaves (depth 1) or recursively filled children
until it has ``max_links`` children or the data ends. Single-child nodes are
kept (never collapsed). Blocks come out in post-order: each leaf once hashed,
each internal node right after its last child, the root last.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

from .block import Block
from .chunker import chunks
from .cid import CID, DAG_PB, RAW
from .dagpb import PBLink, encode_pbnode
from .profile import CHUNK_SIZE, MAX_LINKS
from .unixfs import encode_unixfs_file

if TYPE_CHECKING:
    from typing_extensions import Buffer

EMPTY_FILE = Block(CID.hash(RAW, b""), b"")  # what Kubo stores for an empty file with raw leaves


class _Child(NamedTuple):
    cid: CID
    filesize: int  # payload bytes under this child (its blocksizes entry in the parent)
    tsize: int  # cumulative block bytes (the link's Tsize)


class _Lookahead:
    """One-leaf lookahead: the layout needs to know whether data remains (boxo's ``Done()``)."""

    def __init__(self, leaves: Iterator[Block]) -> None:
        self._leaves = leaves
        self._next: Block | None = None

    @property
    def done(self) -> bool:
        if self._next is None:
            self._next = next(self._leaves, None)
        return self._next is None

    def take(self) -> Block:
        if self.done:  # pragma: no cover - callers check done first
            raise StopIteration
        leaf, self._next = self._next, None
        assert leaf is not None
        return leaf


def _leaves_inline(data_chunks: Iterable[memoryview]) -> Iterator[Block]:
    for chunk in data_chunks:
        yield Block(CID(RAW, hashlib.sha256(chunk).digest()), chunk)


def _digest(chunk: memoryview) -> bytes:
    return hashlib.sha256(chunk).digest()  # releases the GIL on big buffers


def _leaves_threaded(data_chunks: Iterable[memoryview], threads: int) -> Iterator[Block]:
    """Raw leaves in input order, hashed by ``threads`` workers with a bounded window in flight."""
    window: deque[tuple[memoryview, Future[bytes]]] = deque()
    with ThreadPoolExecutor(threads, thread_name_prefix="gradstore-hash") as pool:
        for chunk in data_chunks:
            window.append((chunk, pool.submit(_digest, chunk)))
            if len(window) > 2 * threads:
                done, fut = window.popleft()
                yield Block(CID(RAW, fut.result()), done)
        while window:
            done, fut = window.popleft()
            yield Block(CID(RAW, fut.result()), done)


def _node(children: list[_Child]) -> tuple[Block, _Child]:
    filesize = sum(c.filesize for c in children)
    data = encode_unixfs_file(filesize, (c.filesize for c in children))
    encoded = encode_pbnode((PBLink(c.cid, "", c.tsize) for c in children), data)
    cid = CID.hash(DAG_PB, encoded)
    tsize = len(encoded) + sum(c.tsize for c in children)
    return Block(cid, encoded), _Child(cid, filesize, tsize)


def _fill(
    src: _Lookahead, children: list[_Child], depth: int, max_links: int
) -> Generator[Block, None, _Child]:
    """boxo's ``fillNodeRec``: fill one node of ``depth`` (1 = its children are leaves)."""
    while len(children) < max_links and not src.done:
        if depth == 1:
            leaf = src.take()
            yield leaf
            children.append(_Child(leaf.cid, len(leaf.data), len(leaf.data)))
        else:
            children.append((yield from _fill(src, [], depth - 1, max_links)))
    block, child = _node(children)
    yield block
    return child


def layout(leaves: Iterator[Block], max_links: int = MAX_LINKS) -> Iterator[Block]:
    """Arrange raw ``leaves`` (file order) into the balanced DAG: leaves and nodes, root last."""
    if max_links < 2:
        raise ValueError(f"max_links must be at least 2, got {max_links}")
    src = _Lookahead(leaves)
    if src.done:
        yield EMPTY_FILE
        return
    first = src.take()
    yield first
    root = _Child(first.cid, len(first.data), len(first.data))
    depth = 1
    while not src.done:
        root = yield from _fill(src, [root], depth, max_links)
        depth += 1


def build_file(
    pieces: Iterable[Buffer], *, chunk_size: int = CHUNK_SIZE, threads: int = 1
) -> Iterator[Block]:
    """Stream the UnixFS file DAG of the concatenated ``pieces``; the last block is the root.

    Leaves are zero-copy slices of ``pieces`` where possible: keep the pieces
    alive and unchanged while the blocks are used. ``threads`` > 1 hashes
    leaves in a thread pool (sha256 releases the GIL).
    """
    data_chunks = chunks(pieces, chunk_size)
    leaves = _leaves_threaded(data_chunks, threads) if threads > 1 else _leaves_inline(data_chunks)
    return layout(leaves)


def file_cid(pieces: Iterable[Buffer], threads: int = 2) -> CID:
    """The root CID of ``pieces`` (what ``ipfs add --only-hash`` prints); keeps no blocks."""
    root = EMPTY_FILE
    for block in build_file(pieces, threads=threads):
        root = block
    return root.cid
