"""Who could send a node a CID it does not have: its peers, and the providers its routing
finds. What a command says when a fetch does not start, instead of waiting in silence.

Kubo waits for a block nobody serves for as long as it is asked to; a node without peers,
or a CID that no provider announces, is the usual reason (issue 24). The embedded node has
no network: it answers a missing block at once, so there is nothing to ask it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ..dag.cid import CID
from ..errors import NodeError
from .base import Node
from .capabilities import SupportsSources


@dataclass(frozen=True)
class Sources:
    """A node's peers and the providers of one CID its routing found (None: it could not
    say, e.g. an ``API.Authorizations`` that does not allow ``routing/findprovs``)."""

    peers: int
    providers: int | None

    def blocked(self) -> str | None:
        """Why the CID may never arrive, or None when nothing says so."""
        if self.peers == 0:
            return "the node has no peers, so no other node can send it this CID"
        if self.providers == 0:
            return (
                f"the node's routing found no provider of this CID; its {self.peers} "
                "connected peer(s) are asked too"
            )
        return None


async def find_sources(node: Node, cid: CID, *, timeout: float = 2.0) -> Sources | None:
    """``node``'s peers and the providers of ``cid`` it finds within ``timeout`` s; None for
    a node that has no network (the embedded one) or that refuses to say."""
    if not isinstance(node, SupportsSources):
        return None
    try:
        peers = len(await node.swarm_peers())
    except NodeError:
        return None
    if peers == 0:
        return Sources(0, 0)
    providers: int | None = None
    with contextlib.suppress(NodeError):
        providers = len(await node.find_providers(cid, limit=1, timeout=timeout))
    return Sources(peers, providers)
