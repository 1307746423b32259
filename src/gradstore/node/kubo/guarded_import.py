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
   canaries present means no block sent here was collected. A missing canary
   makes ``finish`` return False and the caller sends the DAG again the slow,
   walking way (and ``abandon`` drops the pin if that fails too).
4. the canaries stay, unpinned (32 bytes each, one per request), for the
   node's next GC. Removing them at once (``block/rm``) makes Kubo check each
   against every pinned DAG, walking them all: on a node that keeps many rounds
   that cost grows without bound, where the walk avoided above is bounded.

``CanaryGuardedImport`` needs only the few public calls of ``GuardedTarget``
(``KuboNode`` has them), so this module and ``node`` do not import each other.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from ...dag.block import Block
from ...dag.car import write_car_async
from ...dag.cid import CID, RAW
from ...errors import BlockNotFoundError, IntegrityError, NodeError

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("gradstore.node")


class GuardedTarget(Protocol):
    """The node calls a ``CanaryGuardedImport`` makes (``KuboNode``'s)."""

    async def import_car_gc_locked(self, car: AsyncIterable[Buffer], *, guard: CID) -> None:
        """Import ``car`` (whose only root is ``guard``) holding the node's GC lock throughout."""
        ...

    async def dag_put(self, block: Block, *, pin: bool) -> CID:
        """Store one block as it is (pinned recursively without a walk if asked)."""
        ...

    async def has_block(self, cid: CID) -> bool: ...

    async def dag_stat(self, cid: CID, *, offline: bool = False) -> dict[str, Any]: ...

    async def unpin(self, cid: CID) -> None: ...


def _canary() -> Block:
    data = os.urandom(32)
    return Block(CID.hash(RAW, data), data)


class CanaryGuardedImport:
    """One new DAG sent to a node over one or more (concurrent) ``send`` calls (a ``GuardedImport``)."""

    def __init__(self, node: GuardedTarget) -> None:
        self.node = node
        self.guard = CID.hash(RAW, os.urandom(32))  # hashed from bytes that are never stored
        self.canaries: list[CID] = []
        self._pinned: CID | None = None

    async def send(self, blocks: AsyncIterable[Block]) -> None:
        """Import ``blocks`` in one request that holds Kubo's GC lock; nothing is pinned yet."""
        canary = _canary()
        self.canaries.append(canary.cid)

        async def canary_first() -> AsyncIterator[Block]:
            yield canary
            async for block in blocks:
                yield block

        await self.node.import_car_gc_locked(
            write_car_async([self.guard], canary_first()), guard=self.guard
        )

    async def finish(self, root: Block, *, pin: bool) -> bool:
        """Store ``root`` (pinned recursively if ``pin``) once every ``send`` has returned.

        True when no block sent before could have been garbage-collected on the
        way; False when one may have been (the root is stored all the same).
        """
        stored = await self.node.dag_put(root, pin=pin)
        if stored != root.cid:
            raise IntegrityError(root.cid, f"kubo dag/put stored {stored}, expected {root.cid}")
        if pin:
            self._pinned = root.cid
        intact = True
        for canary in self.canaries:  # left for the node's GC: see the module docstring
            intact = intact and await self.node.has_block(canary)
        return intact

    async def abandon(self) -> None:
        """Unpin the root ``finish`` pinned if blocks of its DAG are missing (best effort).

        Such a pin protects nothing and would hide the loss. A root whose DAG is
        complete keeps its pin: it may be the user's own from before.
        """
        root, self._pinned = self._pinned, None
        if root is None:
            return
        try:
            await self.node.dag_stat(root, offline=True)
        except BlockNotFoundError:
            try:
                await self.node.unpin(root)
                log.warning("put %s: unpinned the root, whose DAG is incomplete", root)
            except NodeError as exc:
                log.warning("put %s: its DAG is incomplete but unpinning failed: %s", root, exc)
        except NodeError as exc:
            log.warning("put %s: could not check the DAG after a failed re-send: %s", root, exc)
