"""Pin verified inputs in batches: one ``pin/add`` for every input ready, not one each.

Each verified input is pinned so it stays on the coordinator's node until its step is
aggregated, and before the step's record that cites it is published (a fetch attempt
returns only once its input is pinned). A Kubo call costs about 3 ms of the coordinator's
CPU, and a stepped round of 64 steps x 4 peers made 256 of them; ``Node.pin_many`` takes
many CIDs in one call. Callers queue their CID and wait; one of them pins what is
queued in one call, then what queued meanwhile, and so on, so under load the batches
grow by themselves and alone an input waits for no one (the pinning is done by a waiting
caller, not a task of its own, so nothing outlives the attempts that asked). A batch that fails, or takes
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
    """Pins ``node``'s CIDs recursively in batches; ``pin`` returns once its CID is pinned.

    No task of its own: the first caller to find no batch being pinned pins one (every CID
    queued, its own among them) while the others wait for their outcome or their turn."""

    def __init__(
        self, node: Node, *, max_batch: int = MAX_BATCH, timeout_s: float = PIN_TIMEOUT_S
    ) -> None:
        self.node = node
        self.max_batch = max_batch
        self.timeout_s = timeout_s
        self.calls = 0  # pin calls made to the node, batches and single ones
        self._queue: list[tuple[CID, asyncio.Future[None]]] = []
        self._pinning = False  # a caller is pinning a batch
        self._turn = asyncio.Condition()  # a batch ended: outcomes settled, a turn free

    async def pin(self, cid: CID) -> None:
        """Pin ``cid`` (with whatever else is queued); raises what pinning it alone raises.
        A caller cancelled while it waits takes its CID out of the queue."""
        entry = (cid, asyncio.get_running_loop().create_future())
        future = entry[1]
        self._queue.append(entry)
        try:
            while not future.done():
                if self._pinning:
                    async with self._turn:
                        await self._turn.wait_for(lambda: future.done() or not self._pinning)
                    continue
                if entry not in self._queue:  # never left out: queued again if it was
                    self._queue.append(entry)
                await self._lead()
        finally:
            if not future.done():  # cancelled: nobody waits for it any more
                future.cancel()
                if entry in self._queue:
                    self._queue.remove(entry)
        future.result()

    async def _lead(self) -> None:
        """Pin one batch from the queue's head; whatever happens, the waiters hear of it."""
        self._pinning = True
        batch: list[tuple[CID, asyncio.Future[None]]] = []
        try:
            await asyncio.sleep(0)  # callers ready at the same moment join this batch
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            await self._pin(batch)
        finally:
            # cancelled mid-batch: what it did not settle goes back, first in line
            self._queue[:0] = [e for e in batch if not e[1].done()]
            self._pinning = False
            async with self._turn:
                self._turn.notify_all()

    async def _pin(self, batch: list[tuple[CID, asyncio.Future[None]]]) -> None:
        if not batch:  # its callers were all cancelled meanwhile
            return
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
