"""Which coordinator messages wake which waiting peer (``peer._news``): a peer waiting on one
step's verdict sleeps through the other steps' messages, and still hears its own step's, the
round's own (a failure) and a new run's. On the embedded local node: the rule is the
listener's, the transport plays no part (its Kubo runs are in test_steps.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from gradstore.node.local import LocalNode
from gradstore.peer._listen import CoordinatorListener
from gradstore.peer._news import EVERY, News

from .scripted import ScriptedCoordinator, bare_status, stepped_job

CONFIG, COORD, KEYS = stepped_job()


def test_a_waiter_wakes_for_its_key_and_for_everyone_only() -> None:
    asyncio.run(_wakes_for_its_key())


async def _wakes_for_its_key() -> None:
    news = News()
    head = asyncio.create_task(news.wait("head"))
    every = asyncio.create_task(news.wait(EVERY))
    await asyncio.sleep(0)
    news.about("embed", everyone=False)
    await asyncio.sleep(0)
    assert not head.done() and every.done()  # another step's message: every-waiters only
    news.about("head", everyone=False)
    await asyncio.sleep(0)
    assert head.done()
    body = asyncio.create_task(news.wait("body"))
    await asyncio.sleep(0)
    news.about(None, everyone=True)
    await asyncio.sleep(0)
    assert body.done()
    assert not news._waiters  # nothing left behind


class _Counting:
    """A condition that is never met, counting how often it is checked."""

    def __init__(self) -> None:
        self.checks = 0

    def __call__(self) -> bool:
        self.checks += 1
        return False


async def _checks_after(listener: CoordinatorListener, send: object, about: str) -> int:
    ready = _Counting()
    wait = asyncio.create_task(listener._wait(ready, 10.0, None, about))
    await asyncio.sleep(0.05)
    before = ready.checks
    await send  # type: ignore[misc]
    await asyncio.sleep(0.2)
    wait.cancel()
    await asyncio.gather(wait, return_exceptions=True)
    return ready.checks - before


def test_a_step_waiter_sleeps_through_other_steps_but_hears_its_own_and_the_round(
    tmp_path: Path,
) -> None:
    asyncio.run(_sleeps_through_other_steps(tmp_path))


async def _sleeps_through_other_steps(tmp_path: Path) -> None:
    node = LocalNode(tmp_path)
    coordinator = ScriptedCoordinator(CONFIG, COORD, node)  # type: ignore[arg-type]
    async with coordinator.running(), CoordinatorListener(CONFIG, node) as listener:
        await coordinator.send(bare_status(CONFIG, "head"))  # the run is known
        await asyncio.sleep(0.1)
        assert listener.run is not None
        a = KEYS[0].did
        other = coordinator.send(bare_status(CONFIG, "embed"))
        assert await _checks_after(listener, other, "head") == 0
        own = coordinator.send(
            replace(bare_status(CONFIG, "head"), received=CONFIG.roster.bitmap([a]))
        )
        assert await _checks_after(listener, own, "head") >= 1
        failed = coordinator.send(bare_status(CONFIG, None, failed="stopped"))
        assert await _checks_after(listener, failed, "head") >= 1
        # a waiter on every message (a whole round's result) hears the other steps too
        ready = _Counting()
        wait = asyncio.create_task(listener._wait(ready, 10.0, None))
        await asyncio.sleep(0.05)
        before = ready.checks
        await coordinator.send(bare_status(CONFIG, "embed"))
        await asyncio.sleep(0.2)
        wait.cancel()
        await asyncio.gather(wait, return_exceptions=True)
        assert ready.checks > before


@pytest.mark.parametrize("step", ["head", None])
def test_a_new_run_wakes_every_waiter(tmp_path: Path, step: str | None) -> None:
    asyncio.run(_new_run(tmp_path, step))


async def _new_run(tmp_path: Path, step: str | None) -> None:
    node = LocalNode(tmp_path)
    coordinator = ScriptedCoordinator(CONFIG, COORD, node)  # type: ignore[arg-type]
    async with coordinator.running(), CoordinatorListener(CONFIG, node) as listener:
        await coordinator.send(bare_status(CONFIG, "head"))
        await asyncio.sleep(0.1)
        restarted = replace(bare_status(CONFIG, "embed"), run="restarted000000000000run1")
        woken = await _checks_after(listener, coordinator.send(restarted), step or "body")
        assert woken >= 1
        assert listener.run == "restarted000000000000run1"
