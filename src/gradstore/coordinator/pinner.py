"""Pin verified inputs in batches: one ``pin/add`` for every input ready, not one each.

Each verified input is pinned so it stays on the coordinator's node until its step is
aggregated, and before the step's record that cites it is published (a fetch attempt
returns only once its input is pinned). A Kubo call costs about 3 ms of the coordinator's
CPU, and a stepped round of 64 steps x 4 peers made 256 of them; ``Node.pin_many`` takes
many CIDs in one call. Callers queue their CID and wait; one drain task pins what is
queued in one call, then what queued meanwhile, and so on, so under load the batches
grow by themselves and alone an input waits for no one. A batch that fails, or takes
longer than ``timeout_s`` (a DAG whose blocks the node must look for), is pinned again
one CID at a time, each within ``timeout_s``, so each caller hears its own outcome and
one bad CID holds up the others once, for one timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from ..dag import CID
from ..node import Node

log = logging.getLogger("gradstore.coordinator")

#: CIDs in one ``pin/add`` at most (each is an ``arg`` of the request's URL).
MAX_BATCH: Final = 64

#: How long one pin call (a batch, or one CID) may take.
PIN_TIMEOUT_S: Final = 60.0


class BatchPinner:
    """Pins ``node``'s CIDs recursively in batches; ``pin`` returns once its CID is pinned."""

    def __init__(
        self, node: Node, *, max_batch: int = MAX_BATCH, timeout_s: float = PIN_TIMEOUT_S
    ) -> None:
        self.node = node
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.calls = 0  # pin calls made to the node, batches and single ones
        self._queue: list[tuple[CID, asyncio.Future[None]]] = []
        self._drain: asyncio.Task[None] | None = None

    async def pin(self, cid: CID) -> None:
        """Pin ``cid`` (with whatever else is queued); raises what pinning it alone raises.
        A caller that is cancelled leaves the CID queued: it is pinned all the same."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((cid, future))
        if self._drain is None or self._drain.done():
            self._drain = asyncio.create_task(self._drain_queue(), name="coordinator-pins")
        await future

    async def aclose(self) -> None:
        """Stop pinning: the CIDs still queued are not pinned (their callers are cancelled)."""
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)
        for _, future in self._queue:
            future.cancel()
        self._queue.clear()

    async def _drain_queue(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            try:
                await self._pin(batch)
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise

    async def _pin(self, batch: list[tuple[CID, asyncio.Future[None]]]) -> None:
        cids = list(dict.fromkeys(cid for cid, _ in batch))  # one CID may be queued twice
        try:
            self.calls += 1
            await asyncio.wait_for(self.node.pin_many(cids), self.timeout_s)
        except Exception as exc:  # which CID? pin each alone: each caller hears its own
            if len(cids) == 1:
                for _, future in batch:
                    _settle(future, exc)
                return
            log.info("pinning %d inputs in one call failed (%r): one by one", len(cids), exc)
            for cid, future in batch:
                try:
                    self.calls += 1
                    await asyncio.wait_for(self.node.pin(cid), self.timeout_s)
                except Exception as alone:
                    _settle(future, alone)
                else:
                    _settle(future, None)
        else:
            for _, future in batch:
                _settle(future, None)


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    """``future``'s outcome, unless its caller gave up on it."""
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc)
    with contextlib.suppress(asyncio.CancelledError, Exception):
        future.exception()  # retrieved: a caller that gave up leaves no "never retrieved"
