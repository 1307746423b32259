"""Block-by-block traversal of tensors, optionally spread over threads.

Every kernel works on ranges of elements of one tensor at a time, so memory stays
O(model) whatever the number of inputs. Threads get disjoint ranges and every element
is computed by the same operations in the same order, so the result is bit-for-bit the
same with 1 thread or many (NumPy releases the GIL inside its loops).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import numpy as np

from ._checks import Layout

#: Elements a thread takes at a time (kernels then walk it in their own smaller blocks).
CHUNK: Final = 1 << 20

#: Default worker threads: the machine's cores, at most 4 (memory bandwidth saturates).
MAX_DEFAULT_THREADS: Final = 4


def default_threads() -> int:
    """Worker threads used when the caller does not say."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_DEFAULT_THREADS, cores or 1))


def chunks(layout: Layout, size: int = CHUNK) -> list[tuple[str, int, int]]:
    """``(name, start, stop)`` ranges of at most ``size`` elements covering every tensor."""
    return [
        (name, start, min(start + size, layout.size(name)))
        for name in layout.names
        for start in range(0, layout.size(name), size)
    ]


def blocks(start: int, stop: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` sub-ranges of at most ``size`` elements."""
    for lo in range(start, stop, size):
        yield lo, min(lo + size, stop)


def run(
    work: Callable[[str, int, int], None], items: list[tuple[str, int, int]], threads: int
) -> None:
    """Call ``work(name, start, stop)`` for every item, on up to ``threads`` threads.

    NaN/Inf and overflow are detected by the kernels themselves, so NumPy's floating-point
    warnings are silenced inside them (errstate is per thread).
    """

    def call(item: tuple[str, int, int]) -> None:
        with np.errstate(over="ignore", invalid="ignore"):
            work(*item)

    if threads <= 1 or len(items) <= 1:
        for item in items:
            call(item)
        return
    with ThreadPoolExecutor(min(threads, len(items)), thread_name_prefix="aggregate") as pool:
        for _ in pool.map(call, items):
            pass


class Scratch(threading.local):
    """Per-thread reusable buffers, so kernels do not map fresh pages for every block.

    Make one per call: the buffers go away with it.
    """

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, tuple[int, ...], np.dtype[Any]], np.ndarray[Any, Any]] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A buffer of ``shape`` and ``dtype`` for this thread (contents undefined)."""
        slot = (key, shape, dtype)  # the dtype itself: "<V1" would not tell float8 types apart
        buffer = self.buffers.get(slot)
        if buffer is None:
            buffer = self.buffers[slot] = np.empty(shape, dtype)
        return buffer
