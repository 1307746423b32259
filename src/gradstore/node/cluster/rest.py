"""IPFS Cluster's REST API over httpx: pin, pin status, unpin, peers. One call each, no
waiting: ``pins.ClusterPins`` decides when a pin is good enough."""

from __future__ import annotations

import json
from typing import Any

import httpx

from ...dag import CID
from ...errors import ClusterError, NodeUnreachableError, ReplicationError
from ..kubo.settings import DEFAULT_TIMEOUTS, Timeouts
from .status import PinStatus, error_message, not_enough_peers, parse_peers, parse_pin_status


class ClusterClient:
    """The REST API at ``url`` (``http://127.0.0.1:9094``); create it in the loop using it."""

    def __init__(
        self,
        url: str,
        *,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.url, timeout=timeouts.to_httpx(), transport=transport
        )

    def __repr__(self) -> str:
        return f"ClusterClient({self.url!r})"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, params: dict[str, Any] | None = None) -> str:
        try:
            response = await self._client.request(method, path, params=params)
        except httpx.TransportError as exc:
            raise NodeUnreachableError(f"cluster API {self.url} unreachable: {exc!r}") from exc
        if response.status_code >= 400:
            message = error_message(response.status_code, response.text)
            if not_enough_peers(message):
                raise ReplicationError(message)
            raise ClusterError(f"{method} {path}: {message}", response.status_code)
        return response.text

    async def pin(
        self,
        cid: CID,
        *,
        replication_min: int,
        replication_max: int,
        name: str = "",
        recursive: bool = True,
    ) -> None:
        """``POST /pins/{cid}``: allocate ``cid`` to between min and max peers (their Kubos
        fetch it); ``ReplicationError`` when the cluster has too few peers for the minimum.

        A direct pin goes to ``/pins/ipfs/{cid}``: IPFS Cluster (v1.1.6) pins whatever
        ``/pins/{cid}`` is asked recursively, ``mode=direct`` or not, so a record pinned
        there had every cluster peer fetch and keep the whole round it links (its inputs
        too), and a later direct pin of it was refused as already recursive."""
        params: dict[str, Any] = {
            "replication-min": replication_min,
            "replication-max": replication_max,
            "mode": "recursive" if recursive else "direct",
        }
        if name:
            params["name"] = name
        await self._call("POST", f"/pins/{cid}" if recursive else f"/pins/ipfs/{cid}", params)

    async def status(self, cid: CID) -> PinStatus:
        """``GET /pins/{cid}``: its status on every peer."""

        return parse_pin_status(json.loads(await self._call("GET", f"/pins/{cid}")))

    async def unpin(self, cid: CID) -> None:
        """``DELETE /pins/{cid}``; a CID the cluster does not pin is left as is."""
        try:
            await self._call("DELETE", f"/pins/{cid}")
        except ClusterError as exc:
            if exc.status != 404:
                raise

    async def peers(self) -> list[str]:
        """``GET /peers``: the id of every peer this one sees (itself included)."""
        return [str(p.get("id", "")) for p in parse_peers(await self._call("GET", "/peers"))]
