"""GradientStore: gradients in, CIDs out, and every fetched block verified before use.

put streams the canonical document through the chunker and DAG builder in one
pass (``_put``): leaves go to the node while they are hashed, the dag-pb nodes
follow, and the node must store exactly the locally computed root, pinned. get
verifies every block against its CID while writing leaf data into one preallocated
buffer (``_fetch``), and only then decodes.

The fetching, decoding and encoding modules (NumPy) are imported by the methods that
use them: ``put_document`` of an encoded document needs none, and ``gradstore put``
does not load NumPy for it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..dag import CID, EMPTY_FILE, Block, build_file
from ..errors import IntegrityError, InvalidDocumentError
from ..format import DEFAULT_LIMITS, EncodedDocument, Limits
from ..node import Node
from ._put import ByteProgress, Companion, put_document, put_small_with

if TYPE_CHECKING:
    import numpy as np

    from ..format import CompressedGradient, Gradient
    from ._fetch import Sink


@dataclass(frozen=True)
class VerifyReport:
    """What ``GradientStore.verify`` checked about one CID."""

    cid: CID
    size: int
    blocks: int
    tensors: int
    seconds: float


class GradientStore:
    """Put, get and verify gradstore/1 documents over a ``Node``."""

    def __init__(self, node: Node, *, limits: Limits = DEFAULT_LIMITS) -> None:
        self.node = node
        self.limits = limits

    # -- put ---------------------------------------------------------------
    async def put(
        self,
        gradient: Gradient | CompressedGradient,
        *,
        pin: bool = True,
        progress: ByteProgress | None = None,
    ) -> CID:
        """Store ``gradient`` (dense, or compressed: gradstore/2) on the node, pinned by
        default, and return its CID."""
        from ..format import encode

        return await self.put_document(encode(gradient), pin=pin, progress=progress)

    async def put_document(
        self, doc: EncodedDocument, *, pin: bool = True, progress: ByteProgress | None = None
    ) -> CID:
        """Store an encoded document; the root is computed locally and must match the node's.

        One pass: the leaves are streamed to the node while a worker thread hashes
        them, then the dag-pb nodes and the root (see ``_put``). Do not modify the
        arrays until ``put`` returns.
        """
        return await put_document(self.node, doc, pin=pin, progress=progress)

    async def put_with(self, gradient: Gradient, companion: Companion) -> tuple[CID, Block] | None:
        """Store a small ``gradient`` (pinned) and the block ``companion`` builds from its
        CID (a record naming it, stored unpinned) in one request: its CID and that block;
        None, storing nothing, when the document is too large for one request."""
        from ..format import encode

        return await put_small_with(self.node, encode(gradient), companion)

    # -- get ---------------------------------------------------------------
    async def fetch_document(
        self,
        cid: CID | str,
        *,
        max_bytes: int | None = None,
        progress: ByteProgress | None = None,
        root: bytes | None = None,
        sink: Sink | None = None,
    ) -> np.ndarray:
        """Fetch the file bytes of ``cid``, every block verified, into one buffer, as a
        NumPy array (uint8, 1-D, no copy); how, in ``_fetch.fetch_view``. ``root``: the
        root block's bytes, if the caller has them (verified again, not fetched again);
        ``sink``: gives the buffer and hears of each prefix hashed (a spill file's
        ``SpillWriter``)."""
        import numpy as np

        view = await self.fetch_view(
            cid, max_bytes=max_bytes, progress=progress, root=root, sink=sink
        )
        return np.frombuffer(view, dtype=np.uint8)

    async def fetch_view(
        self,
        cid: CID | str,
        *,
        max_bytes: int | None = None,
        progress: ByteProgress | None = None,
        root: bytes | None = None,
        sink: Sink | None = None,
    ) -> memoryview:
        """:meth:`fetch_document`'s bytes as a memoryview: what a caller that moves bytes
        (``gradstore get`` to an ``.npz``) takes without loading NumPy."""
        from ._fetch import fetch_view

        limit = self.limits.max_bytes if max_bytes is None else max_bytes
        return await fetch_view(self.node, cid, limit, progress, root=root, sink=sink)

    async def get(
        self, cid: CID | str, *, limits: Limits | None = None, progress: ByteProgress | None = None
    ) -> Gradient:
        """Fetch, verify and decode the gradient at ``cid`` (zero-copy views into one buffer).

        A compressed document (gradstore/2) is refused with InvalidDocumentError: use
        :meth:`get_any`.
        """
        from ..format import CompressedGradient

        got = await self.get_any(cid, limits=limits, progress=progress)
        if isinstance(got, CompressedGradient):
            raise InvalidDocumentError(
                f"a compressed document (gradstore/2, codec {got.codec}): fetch it with "
                "get_any(), which returns a CompressedGradient",
                "$.format",
            )
        return got

    async def get_any(
        self, cid: CID | str, *, limits: Limits | None = None, progress: ByteProgress | None = None
    ) -> Gradient | CompressedGradient:
        """:meth:`get` for either format, as ``decode_any``: a ``Gradient``, or a
        ``CompressedGradient`` whose payloads are views into the fetched buffer, nothing
        decompressed until asked (``decompress(max_bytes=...)`` gives the float64 values).
        """
        from ..format import decode_any

        lim = limits or self.limits
        buf = await self.fetch_document(cid, max_bytes=lim.max_bytes, progress=progress)
        return await asyncio.to_thread(decode_any, buf, lim)  # payload checks: off the loop

    async def verify(self, cid: CID | str, *, progress: ByteProgress | None = None) -> VerifyReport:
        """Fetch every block, check its hash, decode strictly and recompute the root CID."""
        from ..format import decode_any, encode

        start = time.perf_counter()
        root = CID.parse(cid)
        buf = await self.fetch_document(root, progress=progress)
        gradient = await asyncio.to_thread(decode_any, buf, self.limits)
        again, blocks = await asyncio.to_thread(_root_and_count, encode(gradient))
        if again != root.to_v1():
            raise IntegrityError(
                root, f"re-encoding {root} gives {again}: not a canonical document"
            )
        return VerifyReport(
            root, int(buf.size), blocks, len(gradient.tensors), time.perf_counter() - start
        )

    async def unpin(self, cid: CID | str) -> None:
        """Drop the recursive pin of ``cid`` (its blocks may then be garbage collected)."""
        await self.node.unpin(CID.parse(cid))


def _root_and_count(doc: EncodedDocument) -> tuple[CID, int]:
    """The root CID of ``doc``'s DAG and how many blocks (places) it has."""
    count = 0
    root = EMPTY_FILE.cid
    for block in build_file(doc, threads=2):
        count += 1
        root = block.cid
    return root, count
