"""The narrow ``Node`` interface the store, peer and coordinator use, and its value types.

Two implementations: ``KuboNode`` (Kubo's RPC API over httpx) and ``LocalNode``
(an embedded directory store with in-process pubsub). Everything is async.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from ..dag.cid import CID

if TYPE_CHECKING:
    from typing_extensions import Buffer


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """Who a node is: its libp2p peer id, the multiaddrs it listens on, and its agent string."""

    peer_id: str
    addresses: tuple[str, ...] = ()
    agent_version: str = ""


@dataclass(frozen=True, slots=True)
class PubsubMessage:
    """One message received on a topic; ``data`` is exactly the published bytes."""

    topic: str
    data: bytes
    from_peer: str
    seqno: bytes


@runtime_checkable
class Subscription(Protocol):
    """A live subscription: enter it (``async with``) before publishing, then iterate messages.

    ``__aenter__`` returns once the node itself is subscribed, so a message
    published to this node after that is not lost. (Remote publishers learn
    about the subscription a little later; see ``KuboNode.wait_for_topic_peers``.)
    """

    topic: str

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def __aiter__(self) -> AsyncIterator[PubsubMessage]: ...

    async def __anext__(self) -> PubsubMessage: ...

    async def get(self, timeout: float | None = None) -> PubsubMessage:
        """The next message; ``TimeoutError`` if none arrives within ``timeout`` seconds."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Node(Protocol):
    """What gradstore needs from an IPFS node: blocks, CARs, pins, pubsub and identity."""

    name: str

    async def identity(self) -> NodeIdentity:
        """Peer id, listen addresses and agent version."""
        ...

    async def import_car(
        self,
        body: AsyncIterable[Buffer] | Iterable[Buffer],
        *,
        pin_roots: bool = True,
        complete: bool = False,
    ) -> list[CID]:
        """Store every block of a CAR stream; return the reported roots (pinned by default).

        ``complete=True`` vouches that every block under the roots is in the node
        once the stream is in (e.g. the rest came in an earlier CAR), so the node
        may pin without first checking the DAG.
        """
        ...

    def export_car(self, root: CID) -> AsyncIterator[bytes]:
        """The whole DAG under ``root`` as a CAR v1 byte stream."""
        ...

    async def put_block(self, data: Buffer, codec: int) -> CID:
        """Store one block; return its CIDv1 (sha2-256, ``codec``)."""
        ...

    async def get_block(self, cid: CID) -> bytes:
        """One block's bytes (``BlockNotFoundError`` when the node cannot find it)."""
        ...

    async def has_block(self, cid: CID) -> bool:
        """Whether the block is in the local blockstore (never a network fetch)."""
        ...

    async def pin(self, cid: CID, *, recursive: bool = True) -> None:
        """Pin ``cid`` recursively (its whole DAG must be available), or only its own block.

        A direct pin (``recursive=False``) keeps one block and walks nothing: a round
        record links the previous one, so a recursive pin would walk the whole history.
        """
        ...

    async def pin_many(self, cids: Sequence[CID]) -> None:
        """Pin every one of ``cids`` recursively in one call (their whole DAGs must be
        available); an error if any cannot be pinned, when some others may be."""
        ...

    async def unpin(self, cid: CID) -> None:
        """Remove a recursive pin; unpinning something not pinned is a no-op."""
        ...

    async def pins(self) -> set[CID]:
        """Every recursive pin."""
        ...

    async def publish(self, topic: str, data: bytes) -> None:
        """Publish ``data`` (at most ``MAX_PUBSUB_DATA`` bytes) on ``topic``."""
        ...

    def subscribe(self, topic: str) -> Subscription:
        """A subscription to ``topic``; enter it with ``async with`` before relying on delivery."""
        ...

    async def aclose(self) -> None:
        """Release connections and subscriptions."""
        ...
