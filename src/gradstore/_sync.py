"""The one bridge from synchronous code to gradstore's asyncio API.

A training loop, Flower's callbacks or a notebook call gradstore without an event loop of
their own, or inside one they do not control (Jupyter's). ``LoopThread`` runs a private
loop in a daemon thread and blocks the caller on one coroutine at a time there, so the
objects bound to a loop (a node's HTTP client) are made and used on that one loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop in a daemon thread named ``name``, started on first use.

    ``run`` blocks until its coroutine is done; ``close`` finishes and stops the loop and
    joins the thread, and a later ``run`` starts a new one. ``run`` may be called from
    several threads at once.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LoopThread({self.name!r}, {'running' if self.running else 'stopped'})"

    @property
    def running(self) -> bool:
        """Whether the loop's thread has been started and not closed since."""
        return self._loop is not None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``await coro`` on the private loop and return its result (or raise its exception).

        An exception in the caller while it waits (``KeyboardInterrupt``) cancels the coroutine.
        From the loop's own thread it raises ``RuntimeError`` (waiting there never ends).
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"{self!r}: run() from inside its own loop would wait for ever")
        future = asyncio.run_coroutine_threadsafe(coro, self._start())
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name=self.name, daemon=True
                )
                self._thread.start()
            return self._loop

    def close(self) -> None:
        """Finish the loop as ``asyncio.run`` does (cancel what still runs, close async
        generators, join the default executor), stop it and join its thread."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{self!r}: close() from inside its own loop would wait for ever")
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(_finish(loop), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


async def _finish(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await loop.shutdown_asyncgens()
    await loop.shutdown_default_executor()
