"""A node and a store on a private event loop, for Flower's synchronous callbacks.

Flower calls strategies and ClientApps synchronously; gradstore's node is asyncio and its
HTTP client belongs to the loop that made it. ``NodeLoop`` runs one ``LoopThread`` (the
project's one sync-over-async bridge), makes the node there on first use, and ``run``
blocks on one coroutine, so it works whether or not the caller has an event loop of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .._sync import LoopThread
from ..format import DEFAULT_LIMITS, Limits
from ..node import Node, connect
from ..store import GradientStore

T = TypeVar("T")

NodeSource = str | Callable[[], Node]


def node_factory(node: NodeSource) -> Callable[[], Node]:
    """A Kubo RPC URL (``gradstore.node.connect``), or a function that makes a Node (called on
    the private loop)."""
    if isinstance(node, str):
        url = node
        return lambda: connect(url)
    return node


class NodeLoop:
    """A daemon-thread event loop holding one node and a ``GradientStore`` over it."""

    def __init__(self, node: NodeSource, *, limits: Limits = DEFAULT_LIMITS, name: str) -> None:
        self._make = node_factory(node)
        self._limits = limits
        self._loop = LoopThread(name)
        self._store: GradientStore | None = None
        self._lock = threading.Lock()

    def run(self, step: Callable[[GradientStore], Coroutine[Any, Any, T]]) -> T:
        """``await step(store)`` on the private loop and return its result (blocking)."""

        async def call() -> T:
            if self._store is None:
                self._store = GradientStore(self._make(), limits=self._limits)
            return await step(self._store)

        return self._loop.run(call())

    def close(self) -> None:
        """Close the node's connections and stop the loop (a later ``run`` starts again)."""
        with self._lock:
            store, self._store = self._store, None
        try:
            if store is not None:
                self._loop.run(store.node.aclose())
        finally:
            self._loop.close()
