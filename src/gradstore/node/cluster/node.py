"""A Kubo node whose pins IPFS Cluster also keeps: blocks move through Kubo as ever (cluster's
own ``add`` would build other CIDs), and every pin is then asked of the cluster.

``ClusterNode(kubo, pins)`` is a ``Node`` (and has the Kubo node's capabilities) where
``pin``, ``pin_many``, ``import_car``'s root pins, a guarded import's root and ``unpin``
also go to the cluster. A single pin (an aggregate, a record) returns once it is at
``replication_min``; a batch of inputs (``pin_many``) is only submitted, so a degraded
cluster holds up no peer's input: the close waits for what it keeps.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ...dag.block import Block
from ...dag.cid import CID
from ...errors import ConfigError, NodeError
from ..base import NodeIdentity, Subscription
from ..capabilities import GuardedImport
from ..kubo.node import KuboNode
from .pins import ClusterPins, Replication
from .rest import ClusterClient

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = logging.getLogger("gradstore.node.cluster")


class ClusterNode:
    """``kubo``'s blocks and pubsub, with its pins also kept by ``pins``' cluster."""

    def __init__(self, kubo: KuboNode, pins: ClusterPins) -> None:
        self.kubo = kubo
        self.pins_ = pins
        self.name = f"{kubo.name} + cluster {pins.client.url}"

    def __repr__(self) -> str:
        return f"ClusterNode({self.kubo!r}, {self.pins_.client!r})"

    def __getattr__(self, name: str) -> Any:  # Kubo's own calls (swarm_connect, ...)
        return getattr(self.kubo, name)

    # -- pins: Kubo's, then the cluster's ---------------------------------------------------
    async def pin(self, cid: CID, *, recursive: bool = True) -> None:
        """Pin on Kubo, then through the cluster, waiting for ``replication_min``."""
        await self.kubo.pin(cid, recursive=recursive)
        await self.pins_.pin(cid, recursive=recursive)

    async def pin_many(self, cids: Sequence[CID]) -> None:
        """Pin every CID on Kubo in one call, then submit each to the cluster (no wait; a
        cluster that refuses is logged: inputs are not refused for it, the close waits)."""
        await self.kubo.pin_many(cids)
        for cid in cids:
            try:
                await self.pins_.pin(cid, wait=False)
            except NodeError as exc:
                log.warning("cluster did not take the pin of %s: %s", cid, exc)

    async def unpin(self, cid: CID) -> None:
        """Drop the cluster's pin, then Kubo's."""
        await self.pins_.unpin(cid)
        await self.kubo.unpin(cid)

    async def import_car(
        self,
        body: AsyncIterable[Buffer] | Iterable[Buffer],
        *,
        pin_roots: bool = True,
        complete: bool = False,
    ) -> list[CID]:
        """Kubo's ``import_car``; pinned roots are then pinned through the cluster too."""
        roots = await self.kubo.import_car(body, pin_roots=pin_roots, complete=complete)
        if pin_roots:
            for root in roots:
                await self.pins_.pin(root)
        return roots

    def guarded_import(self) -> GuardedImport:
        """Kubo's guarded import, its pinned root then pinned through the cluster."""
        return _ClusterGuardedImport(self.kubo.guarded_import(), self.pins_)

    # -- the rest: Kubo's ---------------------------------------------------------------------
    async def identity(self) -> NodeIdentity:
        return await self.kubo.identity()

    def export_car(self, root: CID) -> AsyncIterator[bytes]:
        return self.kubo.export_car(root)

    async def put_block(self, data: Buffer, codec: int) -> CID:
        return await self.kubo.put_block(data, codec)

    async def get_block(self, cid: CID) -> bytes:
        return await self.kubo.get_block(cid)

    async def has_block(self, cid: CID) -> bool:
        return await self.kubo.has_block(cid)

    async def pins(self) -> set[CID]:
        return await self.kubo.pins()

    async def publish(self, topic: str, data: bytes) -> None:
        await self.kubo.publish(topic, data)

    def subscribe(self, topic: str) -> Subscription:
        return self.kubo.subscribe(topic)

    @property
    def bulk_reads(self) -> bool:
        return self.kubo.bulk_reads

    async def cat_into(
        self,
        cid: CID,
        out: Buffer,
        *,
        offset: int = 0,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        return await self.kubo.cat_into(cid, out, offset=offset, progress=progress)

    async def swarm_peers(self) -> list[str]:
        return await self.kubo.swarm_peers()

    async def find_providers(self, cid: CID, *, limit: int = 1, timeout: float = 2.0) -> list[str]:
        return await self.kubo.find_providers(cid, limit=limit, timeout=timeout)

    async def aclose(self) -> None:
        """Close the cluster client and the Kubo node."""
        await self.pins_.aclose()
        await self.kubo.aclose()


class _ClusterGuardedImport:
    """A guarded import whose root, once pinned on Kubo, is pinned through the cluster."""

    def __init__(self, inner: GuardedImport, pins: ClusterPins) -> None:
        self.inner = inner
        self.pins = pins

    async def send(self, blocks: AsyncIterable[Block]) -> None:
        await self.inner.send(blocks)

    async def finish(self, root: Block, *, pin: bool) -> bool:
        complete = await self.inner.finish(root, pin=pin)
        if complete and pin:
            await self.pins.pin(root.cid)
        return complete

    async def abandon(self) -> None:
        await self.inner.abandon()


def with_cluster(node: Any, url: str, replication: Replication) -> ClusterNode:
    """``node`` (a ``KuboNode``) with its pins kept by the cluster whose REST API is ``url``;
    ``ConfigError`` for another node (the cluster pins through Kubo)."""
    if not isinstance(node, KuboNode):
        raise ConfigError(
            f"[pinning] needs a Kubo node (the cluster pins through it), not {node!r}"
        )
    return ClusterNode(node, ClusterPins(ClusterClient(url), replication))
