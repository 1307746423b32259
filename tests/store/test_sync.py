"""The one sync-over-async bridge (``gradstore._sync.LoopThread``) and the blocking store on it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from gradstore._sync import LoopThread
from gradstore.format import Gradient
from gradstore.node import LocalNode
from gradstore.store import SyncGradientStore


def test_the_blocking_store_works_under_a_running_loop(tmp_path: Path) -> None:
    """As in a notebook, whose own event loop is running while its cells call blocking code."""
    g = Gradient({"w": np.arange(12, dtype=np.float32).reshape(3, 4)})

    async def cell() -> Gradient:
        with SyncGradientStore(LocalNode(tmp_path)) as store:
            return store.get(store.put(g))

    assert asyncio.run(cell()) == g


def test_run_returns_raises_and_runs_on_one_named_thread() -> None:
    bridge = LoopThread("gradstore-test-bridge")

    async def where() -> str:
        return threading.current_thread().name

    async def fail() -> None:
        raise KeyError("inside")

    try:
        assert not bridge.running
        assert bridge.run(where()) == "gradstore-test-bridge"
        assert bridge.running
        with pytest.raises(KeyError, match="inside"):
            bridge.run(fail())
        assert bridge.run(where()) == "gradstore-test-bridge"  # a failure leaves it usable
    finally:
        bridge.close()
    assert not bridge.running
    assert bridge.run(where()) == "gradstore-test-bridge"  # a closed bridge starts again
    bridge.close()
    bridge.close()  # closing twice is harmless


def test_close_cancels_what_still_runs_and_finishes_async_generators() -> None:
    bridge = LoopThread("gradstore-test-close")
    finished: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            finished.append("task")

    async def numbers():  # type: ignore[no-untyped-def]
        try:
            yield 1
            yield 2
        finally:
            finished.append("generator")

    async def start() -> None:
        asyncio.get_running_loop().create_task(forever())
        await asyncio.sleep(0)
        gen = numbers()
        await anext(gen)  # left suspended: only the loop's shutdown closes it
        started.append(gen)

    started: list[object] = []
    bridge.run(start())
    bridge.close()
    assert sorted(finished) == ["generator", "task"]


def test_run_from_inside_its_own_loop_is_refused_not_a_deadlock() -> None:
    bridge = LoopThread("gradstore-test-inside")

    async def noop() -> int:
        return 1

    async def nested() -> None:
        with pytest.raises(RuntimeError, match="would wait for ever"):
            bridge.run(noop())
        with pytest.raises(RuntimeError, match="would wait for ever"):
            bridge.close()

    try:
        bridge.run(nested())
    finally:
        bridge.close()
