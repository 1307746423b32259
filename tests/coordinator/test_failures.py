"""What goes wrong in a round: stragglers, Byzantine and NaN inputs, forged or replayed messages,
lying nodes. Real Kubo daemons; fakes only sit in front of them. A peer's lost announcement,
sent again: tests/peer/test_waits.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from gradstore.coordinator import Coordinator
from gradstore.errors import RoundFailedError
from gradstore.format import Gradient
from gradstore.messages import Announce, decode_record, encode_message
from gradstore.node import KuboNode
from gradstore.peer import Peer
from gradstore.store import GradientStore

from .harness import (
    SEED,
    World,
    gradients,
    key,
    make_job,
    publish_all,
    start_coordinator,
    wait_subscribed,
    world,
)

pytestmark = pytest.mark.kubo


def _mean64(arrays: list[np.ndarray]) -> np.ndarray:
    return np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)


async def _listen_result(w: World, round_: int, timeout: float = 30) -> Any:
    async with Peer(w.config, w.peer_nodes[0]) as listener:
        return await listener.await_result(round_, timeout=timeout)


def test_straggler_round_closes_at_deadline_with_quorum(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="mean", quorum=3, deadline_s=4)
    grads: list[Gradient | None] = list(gradients(4, 0))
    grads[2] = None  # this peer never announces

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path)
            await wait_subscribed(w)
            await publish_all(w, 0, grads, [1, 1, 1, 1])
            (outcome,) = await asyncio.wait_for(task, 30)
            assert outcome.status == "closed"
            assert outcome.stats["open_s"] >= 4  # waited for the deadline
            assert set(outcome.peers) == {peers[i].did for i in (0, 1, 3)}
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            assert [(e.peer, e.reason) for e in record.excluded] == [
                (peers[2].did, "absent: never announced")
            ]
            honest = [g for g in grads if g is not None]
            result = await GradientStore(w.coord_node).get(outcome.output)
            np.testing.assert_allclose(
                result.tensors["w"], _mean64([g.tensors["w"] for g in honest]), rtol=1e-6
            )

    asyncio.run(go())


def test_round_without_quorum_fails_and_the_next_one_opens(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="mean", quorum=4, deadline_s=3, rounds=2)

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path)
            await wait_subscribed(w)
            async with Peer(w.config, w.peer_nodes[0]) as listener:
                first: list[Gradient | None] = list(gradients(4, 0))
                first[1] = None
                await publish_all(w, 0, first, [1] * 4)
                await publish_all(w, 1, gradients(4, 1), [1] * 4)  # buffered while 0 waits
                # a peer awaiting the failed round hears why from the coordinator's signed
                # status, long before its own timeout
                started = time.monotonic()
                with pytest.raises(RoundFailedError, match="quorum not met") as info:
                    await listener.await_result(0, timeout=60)
                assert info.value.round == 0 and time.monotonic() - started < 30
                assert (await listener.await_result(1, timeout=30)).round == 1
            failed, closed = await asyncio.wait_for(task, 30)
            assert failed.status == "failed" and "quorum not met: 3 verified of 4 needed" in (
                failed.reason or ""
            )
            assert info.value.reason == failed.reason
            assert failed.record is None and failed.output is None
            assert closed.status == "closed" and closed.round == 1 and len(closed.peers) == 4
            record = decode_record(await w.coord_node.get_block(closed.record), cid=closed.record)
            assert record.prev is None  # the failed round left no record behind

    asyncio.run(go())


@pytest.mark.parametrize(
    ("method", "agg", "n"),
    [
        ("median", {}, 4),
        ("trimmed_mean", {"trim_ratio": 0.25}, 4),
        ("krum", {"byzantine": 1}, 5),
    ],
)
def test_byzantine_huge_norm_stays_in_the_honest_range(
    kubo_factory, tmp_path: Path, method: str, agg: dict[str, Any], n: int
) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(n, method=method, **agg)
    grads = gradients(n, 0)
    bad = 1
    grads[bad] = Gradient(
        {name: (arr * 1e6).astype(arr.dtype) for name, arr in grads[bad].tensors.items()}
    )
    honest = [g for i, g in enumerate(grads) if i != bad]

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path)
            await wait_subscribed(w)
            await publish_all(w, 0, grads, [1] * n)
            (outcome,) = await asyncio.wait_for(task, 30)
            result = await GradientStore(w.coord_node).get(outcome.output)
            for name in result.tensors:
                stack = np.stack([g.tensors[name] for g in honest])
                out = result.tensors[name]
                assert np.all(out >= stack.min(axis=0) - 1e-6) and np.all(
                    out <= stack.max(axis=0) + 1e-6
                ), f"{method}: {name} left the honest range (seed {SEED})"

    asyncio.run(go())


def test_nan_input_is_excluded_with_its_reason(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="mean", quorum=3)
    grads = gradients(4, 0)
    w_nan = grads[3].tensors["w"].copy()
    w_nan[5, 7] = np.nan
    grads[3] = Gradient({"w": w_nan, "b": grads[3].tensors["b"]})

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            _, task = start_coordinator(w, tmp_path)
            await wait_subscribed(w)
            # the NaN peer hears why, from the coordinator's signed status (`peer publish`
            # exits 1 with it), instead of being acknowledged and then silently excluded
            told = await publish_all(w, 0, grads, [1] * 4, refused=[3])
            assert told[3].startswith("non-finite: tensor 'w'")
            (outcome,) = await asyncio.wait_for(task, 30)
            assert outcome.status == "closed" and peers[3].did not in outcome.peers
            assert outcome.stats["open_s"] < 20  # settled early: a failed input is final
            record = decode_record(await w.coord_node.get_block(outcome.record), cid=outcome.record)
            (excl,) = record.excluded
            assert (
                excl.peer == peers[3].did
                and excl.reason.startswith("non-finite")
                and excl.cid is not None
            )

    asyncio.run(go())


class _FlipExport(httpx.AsyncBaseTransport):
    """In front of the coordinator's real Kubo: one CID's block/get and dag/export come back
    with a byte flipped."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.target: str | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not (
            request.url.path.endswith(("/dag/export", "/block/get"))
            and self.target
            and request.url.params.get("arg") == self.target
        ):
            return response
        body = await response.aread()
        await response.aclose()
        flipped = bytearray(body)
        flipped[-100] ^= 0x01  # inside the block data, after the CAR framing
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "transfer-encoding", "trailer")
        }
        return httpx.Response(response.status_code, headers=headers, content=bytes(flipped))

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_refusals_leave_the_round_unaffected(kubo_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    daemons = kubo_factory(3, connect=True)
    config, coord, peers = make_job(4, method="mean", quorum=3, rounds=2, deadline_s=20)
    liar = _FlipExport()

    async def go() -> None:
        async with world(daemons, config, coord, peers) as w:
            coord_node = KuboNode(daemons[0].api_url, transport=liar)
            coordinator = Coordinator(
                config, coord, coord_node, tmp_path, rebroadcast_s=0.5, linger_s=0
            )
            task = asyncio.create_task(coordinator.run())
            await wait_subscribed(w)
            grads = gradients(4, 0)
            pnode = w.peer_nodes[0]
            corrupt_cid = await GradientStore(w.peer_nodes[3]).put(grads[3])
            liar.target = str(corrupt_cid)

            def announce(k: Any, **changes: Any) -> Announce:
                base = Announce(
                    job=config.job,
                    run=coordinator.run_id,
                    round=0,
                    peer=k.did,
                    cid=str(corrupt_cid),
                    num_samples=1,
                    sent_at=int(time.time() * 1000),
                )
                return dataclasses.replace(base, **changes)

            good = encode_message(announce(peers[3]), peers[3])
            forged = bytearray(good)
            forged[-5] ^= 0xFF
            outsider = key(77)
            other_job = dataclasses.replace(config, job="other-job")
            sends = [
                bytes(forged),  # bad signature
                encode_message(announce(outsider), outsider),  # unknown did
                encode_message(
                    dataclasses.replace(announce(peers[0]), job=other_job.job), peers[0]
                ),  # wrong job
                good,  # blocks that don't match
                good,  # duplicate
            ]
            for data in sends:
                await pnode.publish(config.gradients_topic, data)
                await asyncio.sleep(0.1)
            await publish_all(w, 0, [grads[0], grads[1], grads[2], None], [1] * 4)
            # round 0 closes with the three honest peers; then a replay of round 0 arrives in round 1
            async with Peer(config, pnode) as listener:
                first = await listener.await_result(0, timeout=30)
            await pnode.publish(config.gradients_topic, good)  # an exact replay
            late = announce(peers[3], sent_at=int(time.time() * 1000))  # signed anew, too late
            await pnode.publish(config.gradients_topic, encode_message(late, peers[3]))
            await asyncio.sleep(0.5)
            await publish_all(w, 1, gradients(4, 1), [1] * 4)
            outcomes = await asyncio.wait_for(task, 40)
            await coord_node.aclose()

            reasons = list(coordinator.refusals)
            for expected in (
                "bad-signature",
                "unknown-peer",
                "wrong-job",
                "duplicate",
                "stale-round",
            ):
                assert expected in reasons, f"{expected} not refused: {coordinator.refusals}"
            assert outcomes[0].status == "closed" and set(first.peers) == {p.did for p in peers[:3]}
            excluded = dict(outcomes[0].excluded)
            assert (
                excluded[peers[3].did].startswith("integrity") and str(corrupt_cid) not in excluded
            )
            np.testing.assert_allclose(
                first.gradient.tensors["w"], _mean64([g.tensors["w"] for g in grads[:3]]), rtol=1e-6
            )

    asyncio.run(go())
