"""Why a fetch makes no progress, asked of the node once it has stalled for a moment, so that
a command's "waiting for" line can say it: the node has no peers, or no provider of the CID.

A CID that nobody serves used to wait its whole ``--timeout`` (60 s) with nothing but
"waiting for CID ..." (issue 24). The node is asked (``node.find_sources``: ``swarm/peers``,
then ``routing/findprovs`` for a short while) 2 s before the "waiting for" line is due (3 s
in: ``_patience.NOTICE_S``), so the answer is there when the line is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Hashable

from ..dag import CID
from ..node import Node, Sources, find_sources

#: How long the node's routing is asked for a provider.
FIND_S = 1.5

#: Seconds a fetch has not moved before the node is asked.
PROBE_AFTER_S = 1.0


class StallReport:
    """Watches one fetch (``watch`` on every tick, with what marks its progress) and asks the
    node who could send the CID once it has not moved for ``probe_after`` s."""

    def __init__(
        self, node: Node, *, probe_after: float = PROBE_AFTER_S, find_s: float = FIND_S
    ) -> None:
        self.node = node
        self.probe_after = probe_after
        self.find_s = find_s
        self._marker: Hashable = None
        self._cid: CID | None = None
        self._since = time.monotonic()
        self._task: asyncio.Task[Sources | None] | None = None

    def watch(self, cid: CID, moved: Hashable) -> None:
        """The fetch of ``cid`` stands at ``moved`` (bytes, a count of progress calls): a new
        value starts the clock again; one unchanged long enough sends the question."""
        marker = (cid, moved)
        now = time.monotonic()
        if marker != self._marker:
            self._marker, self._cid, self._since = marker, cid, now
            self.cancel()
        elif self._task is None and now - self._since >= self.probe_after:
            self._task = asyncio.ensure_future(find_sources(self.node, cid, timeout=self.find_s))

    def reason(self) -> str | None:
        """Why the CID may never come, once the node answered (None: not yet, or no reason)."""
        task = self._task
        if task is None or not task.done() or task.cancelled() or task.exception() is not None:
            return None
        found = task.result()
        return None if found is None else found.blocked()

    def cancel(self) -> None:
        """Drop a question still out (the fetch moved, or the wait is over)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    async def aclose(self) -> None:
        """``cancel``, and wait for the question to end."""
        task = self._task
        self.cancel()
        if task is not None:
            with contextlib.suppress(BaseException):
                await task
