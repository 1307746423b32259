"""Steps due together close concurrently, on real Kubo (issue 19): a step whose close is
held up (its record's pin waits) holds up no other step's aggregate, record or result;
a stop while a close runs lets it end, durably, and leaves no task of the coordinator."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gradstore.coordinator import Coordinator
from gradstore.coordinator.journal import Journal
from gradstore.dag import CID, DAG_CBOR, cbor
from gradstore.messages import STEP_RECORD_TYPE
from gradstore.node import KuboNode

from .harness import World, wait_subscribed, world
from .steps_harness import Heard, announce, listening, run_id, step_gradients, stepped_job
from .test_steps import expected_output

pytestmark = pytest.mark.kubo


class _HeldRecord(KuboNode):
    """Real Kubo, but the pin of ``step``'s step record (stored with its aggregate, then
    pinned directly) waits until ``release`` is set (``held`` is set once it waits): that
    step's close stands still mid-way."""

    def __init__(self, api_url: str, step: str) -> None:
        super().__init__(api_url)
        self.step = step
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def pin(self, cid: CID, *, recursive: bool = True, offline: bool = False) -> None:
        if not recursive and cid.codec == DAG_CBOR and self._is_held(await self.get_block(cid)):
            self.held.set()
            await self.release.wait()
        await super().pin(cid, recursive=recursive, offline=offline)

    def _is_held(self, data: bytes) -> bool:
        node = cbor.decode(data)
        return (
            isinstance(node, dict)
            and node.get("type") == STEP_RECORD_TYPE
            and node.get("step") == self.step
        )


async def _announce_step(
    w: World, heard: Heard, step: str, grads: list[dict[str, Any]], run: str
) -> None:
    samples = [5, 6, 7]
    await asyncio.gather(
        *(announce(w, heard, i, 0, step, grads[i][step], samples[i], run) for i in range(3))
    )


def test_a_step_held_mid_close_does_not_hold_up_the_other_steps_result(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = stepped_job(body={"quorum": 3})
    grads = step_gradients(3, 0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            node = _HeldRecord(daemons[0].api_url, "head")
            coordinator = Coordinator(
                config, coord, node, tmp_path / "state", rebroadcast_s=0.5, linger_s=0
            )
            task = asyncio.create_task(coordinator.run())
            try:
                await wait_subscribed(w)
                async with listening(w, w.peer_nodes[0]) as heard:
                    run = await run_id(coordinator)
                    await _announce_step(w, heard, "head", grads, run)
                    await asyncio.wait_for(node.held.wait(), 30)  # head's close stands still
                    await _announce_step(w, heard, "body", grads, run)
                    # body is due while head's close waits: body closes and publishes anyway
                    body = await heard.result(0, "body", timeout=30)
                    assert heard.results(0, "head") == [] and not node.release.is_set()
                    assert (0, "body") in coordinator.state.done
                    assert not coordinator.state.round_done(0)
                    node.release.set()
                    head = await heard.result(0, "head")
                    whole = await heard.result(0, None)
                    await asyncio.wait_for(task, 30)
            finally:
                node.release.set()
                await asyncio.gather(task, return_exceptions=True)
                await node.aclose()
            # the same bits as steps closed one at a time
            assert head.cid == expected_output(w, run, "head", [0, 1, 2], grads, [5, 6, 7])
            assert body.cid == expected_output(w, run, "body", [0, 1, 2], grads, [5, 6, 7])
            (outcome,) = coordinator.outcomes
            assert str(outcome.record) == whole.record
            # the round's outcome lists its steps in the job's order, not their closing order
            assert [(s.step, s.status) for s in outcome.steps] == [
                ("head", "closed"),
                ("body", "closed"),
            ]

    asyncio.run(go())


def test_a_stop_while_a_step_closes_lets_the_close_end_and_leaves_no_task(
    kubo_factory, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = stepped_job()
    grads = step_gradients(3, 0)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            node = _HeldRecord(daemons[0].api_url, "head")
            stop = asyncio.Event()
            coordinator = Coordinator(
                config, coord, node, tmp_path / "state", rebroadcast_s=0.5, linger_s=0
            )
            task = asyncio.create_task(coordinator.run(stop))
            try:
                await wait_subscribed(w)
                async with listening(w, w.peer_nodes[0]) as heard:
                    run = await run_id(coordinator)
                    await _announce_step(w, heard, "head", grads, run)
                    await asyncio.wait_for(node.held.wait(), 30)
                    stop.set()
                    await asyncio.sleep(0.5)
                    assert not task.done()  # the close under way ends first
                    node.release.set()
                    await asyncio.wait_for(task, 30)
                    head = await heard.result(0, "head")
            finally:
                node.release.set()
                await asyncio.gather(task, return_exceptions=True)
                await node.aclose()
            left = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert left == []
            assert head.cid == expected_output(w, run, "head", [0, 1, 2], grads, [5, 6, 7])
        # the close was journaled and published; the round stays open for a restart
        with Journal(tmp_path / "state" / "journal.sqlite") as journal:
            (row,) = journal.steps(0)
            assert (row.step, row.state, row.record, row.published) == (
                "head",
                "closed",
                head.record,
                True,
            )
            assert [r.state for r in journal.rounds()] == ["open"]

    asyncio.run(go())
