"""IPFS Cluster's pin status, read without I/O: which peers hold a CID, and why the others
do not (``GET /pins/{cid}``'s ``peer_map``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ...errors import ClusterError

PINNED: Final = "pinned"
#: Statuses that will not become ``pinned`` without the cluster doing something new.
FAILED: Final = frozenset({"pin_error", "cluster_error", "unexpectedly_unpinned"})


@dataclass(frozen=True, slots=True)
class PinStatus:
    """One CID's status on every cluster peer: ``peers`` maps a peer id to its status
    (``pinned``, ``pinning``, ``pin_queued``, ``remote``, ``pin_error``, ...), ``errors``
    the error text of the peers that have one."""

    cid: str
    allocations: tuple[str, ...]
    peers: Mapping[str, str]
    errors: Mapping[str, str]

    @property
    def pinned(self) -> int:
        """How many peers hold the CID pinned."""
        return sum(status == PINNED for status in self.peers.values())

    def describe(self) -> str:
        """One line for an error: each peer's status (and error), allocated peers first."""
        order = [*self.allocations, *(p for p in sorted(self.peers) if p not in self.allocations)]
        parts = []
        for peer in order:
            status = self.peers.get(peer, "unknown")
            error = self.errors.get(peer)
            parts.append(f"{peer[-8:]}: {status}" + (f" ({error})" if error else ""))
        return ", ".join(parts) or "no peer answered"


def parse_pin_status(body: Any) -> PinStatus:
    """``GET /pins/{cid}``'s answer -> ``PinStatus``; ``ClusterError`` if it is not one."""
    if not isinstance(body, Mapping) or not isinstance(body.get("peer_map"), Mapping):
        raise ClusterError(f"pin status without a peer_map: {str(body)[:200]}")
    peers: dict[str, str] = {}
    errors: dict[str, str] = {}
    for peer, info in body["peer_map"].items():
        if not isinstance(info, Mapping):
            raise ClusterError(f"pin status of peer {peer} is not an object")
        peers[str(peer)] = str(info.get("status", ""))
        if info.get("error"):
            errors[str(peer)] = str(info["error"])
    allocations = tuple(str(a) for a in body.get("allocations") or ())
    return PinStatus(str(body.get("cid", "")), allocations, peers, errors)


def parse_peers(lines: str) -> list[Mapping[str, Any]]:
    """``GET /peers``'s answer (one JSON object a line) -> each peer's ``/id`` object."""

    found: list[Mapping[str, Any]] = []
    for line in lines.splitlines():
        if line.strip():
            item = json.loads(line)
            if not isinstance(item, Mapping):
                raise ClusterError(f"/peers: a line that is not an object: {line[:200]}")
            found.append(item)
    return found


def error_message(status: int, text: str) -> str:
    """The ``message`` of the cluster's ``{"code","message"}`` error body, else the text."""

    try:
        body = json.loads(text)
    except ValueError:
        return text.strip() or f"HTTP {status}"
    if isinstance(body, Mapping) and body.get("message"):
        return str(body["message"])
    return text.strip()


def not_enough_peers(message: str) -> bool:
    """Whether the cluster refused a pin for lack of peers to allocate it to."""
    return "not enough peers to allocate" in message
