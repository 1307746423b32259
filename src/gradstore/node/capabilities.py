"""Optional capabilities a ``Node`` may have beyond the base protocol.

The store asks ``isinstance(node, SupportsCatInto)`` rather than which class a
node is: any node offering a capability gets the faster path, and the store
never imports a node implementation.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..dag.block import Block
from ..dag.cid import CID

if TYPE_CHECKING:
    from typing_extensions import Buffer


@runtime_checkable
class GuardedImport(Protocol):
    """One new DAG sent over several (concurrent) ``send`` calls, its root pinned without a walk.

    The node may collect unpinned blocks between requests; ``finish`` says
    whether that can have happened, so the caller can send the DAG again.
    """

    async def send(self, blocks: AsyncIterable[Block]) -> None:
        """Store ``blocks`` (nothing pinned yet)."""
        ...

    async def finish(self, root: Block, *, pin: bool) -> bool:
        """Store ``root`` (pinned if asked); False if a block sent before may have been lost."""
        ...

    async def abandon(self) -> None:
        """The caller gives up on this DAG: drop a pin ``finish`` recorded over missing blocks."""
        ...


@runtime_checkable
class SupportsGuardedImport(Protocol):
    """A node that stores a new DAG in parts and pins its root without reading it back."""

    def guarded_import(self) -> GuardedImport:
        """A new ``GuardedImport``, one per DAG."""
        ...


@runtime_checkable
class SupportsCatInto(Protocol):
    """A node that reads a UnixFS file's bytes, or a range of them, straight into a caller's
    buffer (Kubo's ``cat``)."""

    @property
    def bulk_reads(self) -> bool:
        """Whether ``cat_into`` is the fast path here (else a CAR export is as good)."""
        ...

    async def cat_into(
        self,
        cid: CID,
        out: Buffer,
        *,
        offset: int = 0,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Write the file's bytes (unverified; from ``offset``, ``len(out)`` at most) into ``out``.

        Returns how many were written.
        """
        ...


@runtime_checkable
class SupportsSources(Protocol):
    """A node on a network: it can say which peers it is connected to and ask its routing
    who provides a CID (Kubo's ``swarm/peers`` and ``routing/findprovs``)."""

    async def swarm_peers(self) -> list[str]:
        """Peer ids this node is connected to."""
        ...

    async def find_providers(self, cid: CID, *, limit: int = 1, timeout: float = 2.0) -> list[str]:
        """Peer ids the routing names as providers of ``cid`` (at most ``limit``, found within
        ``timeout`` s)."""
        ...
