"""Fetching from Kubo never waits on the loop's own thread pool for its hashing thread: a
get whose leaves come by ``cat`` hashes them in a thread of its own, so fetches at once,
however many, do not starve the pool the reads need (a stepped round's coordinator fetches
16 documents at once; the pool of a 2-core machine has 6 threads, and every fetch hung
until its timeout). A pool of one thread is the full pool, deterministically."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from gradstore.format import Gradient
from gradstore.node import KuboDaemon
from gradstore.store import GradientStore

pytestmark = pytest.mark.kubo


def _gradient(seed: int) -> Gradient:
    """4 MiB of float32: several 1 MiB leaves, fetched by ``cat`` into one buffer."""
    rng = np.random.default_rng(seed)
    return Gradient({"w": rng.standard_normal(1 << 20).astype(np.float32)})


def test_a_fetch_completes_when_the_loops_pool_has_a_single_thread(kubo: KuboDaemon) -> None:
    async def go() -> None:
        async with kubo.node() as node:
            assert node.bulk_reads  # the cat path, with its hashing thread
            store = GradientStore(node)
            gradient = _gradient(1)
            cid = await store.put(gradient)
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
            got = await asyncio.wait_for(store.get(cid), 30)
            assert got.tensors["w"].tobytes() == gradient.tensors["w"].tobytes()

    asyncio.run(go())
