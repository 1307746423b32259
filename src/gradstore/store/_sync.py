"""A blocking face for GradientStore, for scripts and notebooks."""

from __future__ import annotations

import numpy as np

from .._sync import LoopThread
from ..dag import CID
from ..format import CompressedGradient, Gradient, Limits
from ..node import Closing, Node
from ._put import ByteProgress
from ._store import GradientStore, VerifyReport


class SyncGradientStore(Closing):
    """GradientStore with blocking methods; owns a private event loop until ``close()``.

    The loop runs in a thread of its own (``LoopThread``), so the methods work in a notebook
    whose own loop is already running.
    """

    def __init__(self, node: Node, *, limits: Limits | None = None) -> None:
        self._loop = LoopThread("gradstore-sync-store")
        self.store = GradientStore(node) if limits is None else GradientStore(node, limits=limits)

    def put(
        self,
        gradient: Gradient | CompressedGradient,
        *,
        pin: bool = True,
        progress: ByteProgress | None = None,
    ) -> CID:
        return self._loop.run(self.store.put(gradient, pin=pin, progress=progress))

    def get(
        self, cid: CID | str, *, limits: Limits | None = None, progress: ByteProgress | None = None
    ) -> Gradient:
        return self._loop.run(self.store.get(cid, limits=limits, progress=progress))

    def get_any(
        self, cid: CID | str, *, limits: Limits | None = None, progress: ByteProgress | None = None
    ) -> Gradient | CompressedGradient:
        return self._loop.run(self.store.get_any(cid, limits=limits, progress=progress))

    def fetch_document(self, cid: CID | str, *, progress: ByteProgress | None = None) -> np.ndarray:
        return self._loop.run(self.store.fetch_document(cid, progress=progress))

    def verify(self, cid: CID | str) -> VerifyReport:
        return self._loop.run(self.store.verify(cid))

    def unpin(self, cid: CID | str) -> None:
        self._loop.run(self.store.unpin(cid))

    def close(self) -> None:
        """Close the node's connections and the private loop."""
        try:
            self._loop.run(self.store.node.aclose())
        finally:
            self._loop.close()
