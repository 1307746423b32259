"""Import a new DAG into Kubo and pin its root without Kubo's pin walk, safely against GC.

Kubo pins an imported root (``dag/import --pin-roots``, ``pin/add``) by reading
every block of the DAG back (about 0.1 s per 256 MiB here); ``ipfs add`` and
``dag/put --pin`` record the pin without that walk. Recording a pin without the
walk is only right if every block is still there, and between two requests a
GC (``ipfs repo gc``, or the daemon's ``--enable-gc``) deletes unpinned blocks.
So:

1. every ``send`` is a ``dag/import`` with ``pin-roots=true``: Kubo holds its
   GC lock for the whole request. Its CAR header names a ``guard`` CID that is
   never stored, so Kubo has nothing to pin (it reports the guard as
   unpinnable, which is expected) and walks nothing;
2. each request's first block is a fresh random 32-byte *canary*;
3. ``finish`` stores the root with ``dag/put --pin`` (no walk), then checks the
   canaries. A GC can only run between requests, and it deletes every unpinned
   block, so it would have taken the canary of every request before it. All
   canaries present means no block sent here was collected; then they are
   removed. A missing canary makes ``finish`` return False and the caller
   sends the DAG again the slow, walking way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING

from ..dag.block import Block
from ..dag.car import write_car_async
from ..dag.cid import CID, RAW
from ..errors import IntegrityError, NodeError
from . import kubo_rpc as rpc

if TYPE_CHECKING:
    from .kubo import KuboNode

log = logging.getLogger("gradstore.node")


def _canary() -> Block:
    data = os.urandom(32)
    return Block(CID.hash(RAW, data), data)


class GuardedImport:
    """One new DAG sent to a ``KuboNode`` over one or more (concurrent) ``send`` calls."""

    def __init__(self, node: KuboNode) -> None:
        self.node = node
        self.guard = CID.hash(RAW, os.urandom(32))  # hashed from bytes that are never stored
        self.canaries: list[CID] = []

    async def send(self, blocks: AsyncIterable[Block]) -> None:
        """Import ``blocks`` in one request that holds Kubo's GC lock; nothing is pinned yet."""
        canary = _canary()
        self.canaries.append(canary.cid)

        async def canary_first() -> AsyncIterator[Block]:
            yield canary
            async for block in blocks:
                yield block

        car = write_car_async([self.guard], canary_first())
        answer = await self.node._upload(
            "dag/import", rpc.guarded_import_params(), car, retry=False, filename="import.car"
        )
        rpc.parse_guarded_import(rpc.parse_ndjson("dag/import", answer), self.guard)

    async def finish(self, root: Block, *, pin: bool) -> bool:
        """Store ``root`` (pinned recursively if ``pin``) once every ``send`` has returned.

        True when no block sent before could have been garbage-collected on the
        way; False when one may have been (the root is stored all the same).
        """
        boundary = rpc.new_boundary()
        answer = await self.node._call(
            "dag/put",
            rpc.dag_put_params(root.cid.codec, pin=pin),
            body=lambda: rpc.multipart_stream([root.data], boundary, filename="root"),
            boundary=boundary,
            retry=True,  # storing and pinning the same block again is harmless
        )
        items = rpc.parse_ndjson("dag/put", answer)  # an error after the CID line raises here
        stored = rpc.parse_dag_put(items[0] if len(items) == 1 else items)
        if stored != root.cid:
            raise IntegrityError(root.cid, f"kubo dag/put stored {stored}, expected {root.cid}")
        intact = True
        for canary in self.canaries:
            intact = intact and await self.node.has_block(canary)
        try:
            if self.canaries:
                await self.node._call("block/rm", rpc.block_rm_params(self.canaries))
        except NodeError as exc:  # an unpinned 32-byte block left over is harmless
            log.debug("could not remove put canaries %s: %s", self.canaries, exc)
        return intact
