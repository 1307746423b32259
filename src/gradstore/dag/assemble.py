"""Verified reassembly of one UnixFS file into one preallocated buffer.

Every block is hashed against its CID before anything is read from it; the
DAG is parsed strictly and every size it declares is checked against the
parent's ``blocksizes`` and the root's ``filesize``, so a wrong or hostile
node yields an error, never a wrong byte. Blocks may come in any order in
which parents precede their children (Kubo's ``dag/export`` pre-order, or
block-by-block fetching driven by ``wanted()``); a CID used at several places
in the file (identical chunks, e.g. zeros) is needed only once.

The buffer is anonymous memory the kernel hands out page by page as it is written (an
``mmap``), so declaring a size costs nothing until bytes arrive (the coordinator reads
only a root to learn a size); under 4 MiB it is a bytearray (``_MAPPED``: the heap's
pages cost no faults), and no NumPy is needed (``view``; ``result`` gives the same
bytes as a NumPy array). Not NumPy's allocator: it asks for huge pages, and where the
kernel must compact memory to find them a fresh 256 MiB buffer took 0.5 s instead of 0.1.
A caller may give the buffer instead (``allocate``: a coordinator's spill writer's).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from ..errors import DAGError, LimitExceededError
from .block import Block
from .cid import CID, DAG_PB, RAW, verify_block
from .dagpb import decode_pbnode
from .profile import MAX_LINKS
from .unixfs import DataType, decode_unixfs

if TYPE_CHECKING:
    import numpy as np

#: Buffers from this size on are mapped; smaller ones are bytearrays. A fresh mapping's
#: every page is a fault when first written (0.8 ms of CPU a MiB here), where the heap
#: hands a bytearray pages it already had: a 1 MiB ``cat`` into a mapping cost 1.8 ms of
#: CPU, into a bytearray 1.0 ms. Up to this size a declared size is held at once.
_MAPPED = 4 << 20

# A balanced 1024-link tree of 1 MiB chunks is 4 levels deep at 1 PiB; 32
# levels leaves room for other layouts (trickle) and bounds the work.
MAX_DEPTH = 32


def anonymous_buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes whose pages the kernel hands out as they are written."""
    return memoryview(mmap.mmap(-1, size) if size >= _MAPPED else bytearray(size))


class _Place(NamedTuple):
    offset: int
    size: int  # bytes this occurrence must cover; -1 for the root (known once it arrives)
    depth: int


class _Node(NamedTuple):
    data: bytes  # the node's own UnixFS Data bytes (empty for the profile's internal nodes)
    children: tuple[tuple[CID, int], ...]  # (cid, blocksize) in file order
    filesize: int


class LeafSpan(NamedTuple):
    """Where one occurrence of a raw leaf sits in the file: ``buffer[offset : offset + size]``."""

    offset: int
    size: int
    cid: CID


class FileAssembler:
    """Rebuild the file under ``root`` from blocks fed to ``add``; bounded by ``max_size`` bytes."""

    def __init__(
        self,
        root: CID | str,
        max_size: int,
        *,
        max_links: int = MAX_LINKS,
        max_depth: int = MAX_DEPTH,
        allocate: Callable[[int], memoryview] = anonymous_buffer,
    ) -> None:
        """``allocate(size)``: the file's buffer, once its root declares ``size`` (a
        writable, byte-formatted view of exactly that many bytes)."""
        self.root = CID.parse(root)
        self._allocate_buffer = allocate
        self.max_size = max_size
        self.max_links = max_links
        self.max_depth = max_depth
        self._pending: dict[CID, list[_Place]] = {self.root: [_Place(0, -1, 0)]}
        self._leaves: dict[CID, tuple[int, int]] = {}  # received raw leaf -> where its bytes sit
        self._nodes: dict[CID, _Node] = {}  # received dag-pb nodes, to place again if reused
        self._buf: memoryview | None = None
        self._budget = 0  # placements left; set from the root's filesize
        self._in_place: dict[CID, int] = {}  # leaf -> places still to verify in the buffer

    def wanted(self) -> set[CID]:
        """CIDs still needed (known from the blocks received so far)."""
        return set(self._pending)

    @property
    def done(self) -> bool:
        """True once every byte of the file has been written."""
        return self._buf is not None and not self._pending

    def result(self) -> np.ndarray:
        """The file's bytes as a NumPy array (uint8, 1-D, no copy). DAGError while blocks
        are missing."""
        import numpy as np

        return np.frombuffer(self.view(), dtype=np.uint8)

    def view(self) -> memoryview:
        """The file's bytes (a writable memoryview, format 'B'). DAGError while blocks are
        missing."""
        if self._buf is None or self._pending:
            missing = next(iter(self._pending))
            raise DAGError(
                f"file {self.root} is incomplete: {len(self._pending)} block(s) missing, "
                f"e.g. {missing}"
            )
        return self._buf

    @property
    def buffer(self) -> memoryview | None:
        """The file's buffer once the root has arrived (bytes not yet placed are undefined)."""
        return self._buf

    def leaf_spans(self) -> list[LeafSpan] | None:
        """Every pending place, in file order, when all of them are raw leaves tiling the file.

        Then the file's bytes may be written into ``buffer`` by other means
        (Kubo's ``cat``) and checked with ``verify_in_place``: every byte lies
        in exactly one leaf span, so hashing the spans verifies the whole file.
        ``None`` while dag-pb nodes are pending, before the root, or when some
        bytes live in the nodes themselves (then feed blocks to ``add``).
        """
        if self._buf is None or any(cid.codec != RAW for cid in self._pending):
            return None
        spans = sorted(
            LeafSpan(place.offset, place.size, cid)
            for cid, places in self._pending.items()
            for place in places
        )
        end = 0
        for span in spans:
            if span.offset != end or span.size < 0:
                return None
            end += span.size
        if end != len(self._buf):
            return None
        self._in_place = {cid: len(places) for cid, places in self._pending.items()}
        return spans

    def verify_in_place(self, span: LeafSpan) -> None:
        """Hash the bytes already at ``span`` against its leaf CID (IntegrityError if they differ).

        Only for spans from ``leaf_spans``; the leaf counts as received once
        each of its places has been verified.
        """
        buf = self._buf
        assert buf is not None and span.cid in self._in_place
        verify_block(span.cid, buf[span.offset : span.offset + span.size])
        left = self._in_place[span.cid] - 1
        self._in_place[span.cid] = left
        if left == 0:
            del self._pending[span.cid]
            self._leaves[span.cid] = (span.offset, span.size)

    def add(self, block: Block) -> None:
        """Verify and place one block. IntegrityError (names the CID) if it does not hash to it."""
        cid = block.cid
        places = self._pending.get(cid)
        if places is None:
            if cid in self._leaves or cid in self._nodes:
                return  # a repeat of a block already placed: nothing more to learn from it
            raise DAGError(f"unexpected block {cid}: not part of file {self.root}")
        verify_block(cid, block.data)
        if cid.codec == RAW:
            self._add_leaf(cid, block.data, places)
        elif cid.codec == DAG_PB:
            self._add_node(cid, block.data, places)
        else:
            raise DAGError(f"block {cid} is {cid.codec_name}, not part of a UnixFS file")

    def _allocate(self, size: int) -> memoryview:
        if size > self.max_size:
            raise LimitExceededError(
                f"file {self.root} declares {size} bytes, over the {self.max_size}-byte limit",
                "max_bytes",  # what every caller bounds a document's file by
            )
        self._budget = 4 * self.max_links + size // 1024
        buf = self._allocate_buffer(size)
        if buf.nbytes != size or buf.readonly or buf.format != "B" or buf.ndim != 1:
            raise ValueError(
                f"allocate({size}) gave a buffer of {buf.nbytes} bytes, or not writable"
            )
        self._buf = buf
        return self._buf

    def _add_leaf(self, cid: CID, data: bytes | memoryview, places: list[_Place]) -> None:
        n = len(data)
        for place in places:
            if place.size not in (-1, n):
                raise DAGError(f"leaf {cid} has {n} bytes, its parent declares {place.size}")
        buf = self._buf if self._buf is not None else self._allocate(n)
        src = memoryview(data).cast("B")
        for place in places:
            buf[place.offset : place.offset + n] = src
        del self._pending[cid]
        self._leaves[cid] = (places[0].offset, n)

    def _add_node(self, cid: CID, data: bytes | memoryview, places: list[_Place]) -> None:
        node = self._parse(cid, data)
        for place in places:
            if place.size not in (-1, node.filesize):
                raise DAGError(
                    f"node {cid} declares filesize {node.filesize}, "
                    f"its parent declares {place.size}"
                )
        if self._buf is None:
            self._allocate(node.filesize)
        del self._pending[cid]
        self._nodes[cid] = node
        for place in places:
            self._place(node, place)

    def _parse(self, cid: CID, data: bytes | memoryview) -> _Node:
        try:
            pb = decode_pbnode(data, max_links=self.max_links)
        except DAGError as exc:
            raise DAGError(f"node {cid}: {exc}") from None
        if pb.data is None:
            raise DAGError(f"node {cid} has no UnixFS data")
        fs = decode_unixfs(pb.data)
        if fs.type not in (DataType.FILE, DataType.RAW):
            kind = DataType(fs.type).name if 0 <= fs.type <= max(DataType) else f"type {fs.type}"
            raise DAGError(f"node {cid} is a UnixFS {kind}, not a File")
        if fs.filesize is None:
            raise DAGError(f"file node {cid} has no filesize")
        if len(fs.blocksizes) != len(pb.links):
            raise DAGError(
                f"node {cid} has {len(pb.links)} links but {len(fs.blocksizes)} blocksizes"
            )
        own = fs.data or b""
        if len(own) + sum(fs.blocksizes) != fs.filesize:
            raise DAGError(
                f"node {cid}: filesize {fs.filesize} != data {len(own)} + sum of blocksizes "
                f"{sum(fs.blocksizes)}"
            )
        for link in pb.links:
            if link.hash.codec not in (RAW, DAG_PB):
                raise DAGError(f"node {cid} links to a {link.hash.codec_name} block {link.hash}")
        children = tuple(
            (link.hash, size) for link, size in zip(pb.links, fs.blocksizes, strict=True)
        )
        return _Node(own, children, fs.filesize)

    def _place(self, node: _Node, place: _Place) -> None:
        """Write ``node`` at ``place`` and register (or directly place) each of its children."""
        buf = self._buf
        assert buf is not None
        stack = [(node, place)]
        while stack:
            node, place = stack.pop()
            off = place.offset
            if node.data:
                buf[off : off + len(node.data)] = node.data
                off += len(node.data)
            depth = place.depth + 1
            if node.children and depth > self.max_depth:
                raise DAGError(f"file {self.root} is deeper than {self.max_depth} levels")
            self._budget -= len(node.children)
            if self._budget < 0:
                raise DAGError(f"file {self.root} has too many blocks for its size")
            for child, size in node.children:
                if child in self._leaves:
                    src, n = self._leaves[child]
                    if n != size:
                        raise DAGError(f"leaf {child} has {n} bytes, its parent declares {size}")
                    buf[off : off + n] = buf[src : src + n]
                elif child in self._nodes:
                    sub = self._nodes[child]
                    if sub.filesize != size:
                        raise DAGError(
                            f"node {child} declares filesize {sub.filesize}, "
                            f"its parent declares {size}"
                        )
                    stack.append((sub, _Place(off, size, depth)))
                else:
                    self._pending.setdefault(child, []).append(_Place(off, size, depth))
                off += size
