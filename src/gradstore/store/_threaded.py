"""Run a blocking iterator in a worker thread and consume it asynchronously.

Hashing (sha256 releases the GIL) and chunking stay off the event loop, while
the loop streams what the worker produced to the node.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


async def iterate_in_thread(make: Callable[[], Iterator[T]], *, depth: int = 8) -> AsyncIterator[T]:
    """Yield the items of ``make()``, produced in a thread, at most ``depth`` ahead of the consumer."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: object) -> None:
        fut = asyncio.run_coroutine_threadsafe(queue.put(item), loop)
        while not stop.is_set():
            try:
                fut.result(timeout=0.5)
                return
            except TimeoutError:
                continue
        fut.cancel()

    def work() -> None:
        try:
            for item in make():
                if stop.is_set():
                    return
                put(item)
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, re-raised there
            put(exc)

    worker = threading.Thread(target=work, name="gradstore-producer", daemon=True)
    worker.start()
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while not queue.empty():  # unblock a producer waiting on a full queue
            queue.get_nowait()
        await asyncio.to_thread(worker.join)
