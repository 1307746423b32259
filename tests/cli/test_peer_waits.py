"""``peer publish`` and ``peer await`` never wait in silence (issue 24, item 2): 3 s in, a line
on stderr says what they wait for. With no coordinator, that; with one, the round's progress
from its signed statuses (verified of expected, quorum, the deadline it signed); once the
round closed, the aggregate being fetched, and why it does not come (no peers, no provider).

Real Kubo daemons (no routing, as the suite's); the coordinator is the scripted one of
tests/peer (the job's own key publishing signed statuses and results as a test says).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from gradstore.dag import CID, file_cid
from gradstore.errors import CoordinatorError
from gradstore.format import Gradient, encode
from gradstore.job import JobConfig
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon, KuboNode
from gradstore.peer import Peer

from ..coordinator.harness import make_job, write_job_toml
from ..peer.scripted import ScriptedCoordinator, record_cid

pytestmark = pytest.mark.kubo

Daemons = Callable[..., list[KuboDaemon]]


class Stamped(io.StringIO):
    """A stream that keeps every line written with the monotonic time it came."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        now = time.monotonic()
        self.lines += [(now, line) for line in text.splitlines()]
        return super().write(text)

    def first(self, pattern: str) -> tuple[float, str]:
        """The first line matching ``pattern`` (a regex), with when it came."""
        found = [(t, line) for t, line in self.lines if re.search(pattern, line)]
        assert found, f"no line matches {pattern!r}: {self.getvalue()!r}"
        return found[0]


def _unserved() -> CID:
    """The CID of a gradient nobody has."""
    data = encode(Gradient({"w": np.arange(5, dtype=np.float32)}, {"kind": "aggregate"}))
    return file_cid(data)


def _deadline_in(line: str) -> int:
    found = re.search(r"deadline in (\d+) s\)", line)
    assert found, line
    return int(found.group(1))


async def _until(stream: Stamped, pattern: str, timeout: float = 15.0) -> tuple[float, str]:
    end = time.monotonic() + timeout
    while not any(re.search(pattern, line) for _, line in stream.lines):
        assert time.monotonic() < end, f"no line matches {pattern!r}: {stream.getvalue()!r}"
        await asyncio.sleep(0.05)
    return stream.first(pattern)


@contextlib.asynccontextmanager
async def _scripted(
    coord_daemon: KuboDaemon, peer_daemon: KuboDaemon, config: JobConfig, coord: SigningKey
) -> AsyncIterator[tuple[ScriptedCoordinator, KuboNode]]:
    coord_node = coord_daemon.node()
    peer_node = coord_node if peer_daemon is coord_daemon else peer_daemon.node()
    try:
        async with ScriptedCoordinator(config, coord, coord_node).running() as c:
            yield c, peer_node
    finally:
        await coord_node.aclose()
        if peer_node is not coord_node:
            await peer_node.aclose()


def test_waiting_peers_show_the_round_as_the_coordinators_signed_statuses_say(
    kubo_factory: Daemons,
) -> None:
    """``peer await`` and ``peer publish``, 3 s in: verified of expected, received, the
    quorum, and the deadline the coordinator signed; then, the round closed, the aggregate
    being fetched and why it does not come (its node has a peer, but no provider)."""
    from gradstore.cli._peer_wait import PeerWaitLines

    daemons = kubo_factory(2, connect=True)
    config, coord, keys = make_job(2, method="mean", quorum=2, deadline_s=30)
    p0, p1 = (k.did for k in keys)
    gradient = Gradient({"w": np.ones(3, np.float32)})
    aggregate = _unserved()

    async def go() -> None:
        async with _scripted(daemons[0], daemons[1], config, coord) as (c, node):
            deadline = int(time.time() * 1000) + 30_000
            await c.status(0, None, verified=[p1], deadline=deadline)
            async with Peer(config, node) as listener, Peer(config, node, keys[0]) as peer:
                await node.wait_for_topic_peers(config.gradients_topic, 1, timeout=15)
                awaited, published = Stamped(), Stamped()
                started = time.monotonic()
                awaiting = asyncio.create_task(
                    PeerWaitLines(listener, 0, None, publishing=False, stream=awaited).run(
                        listener.await_result(0, timeout=60)
                    )
                )
                publishing = asyncio.create_task(
                    PeerWaitLines(peer, 0, None, publishing=True, stream=published).run(
                        peer.publish(gradient, 0, 1, timeout=60)
                    )
                )
                await c.announcement(lambda a: a.peer == p0)
                await c.status(0, None, received=[p0], verified=[p1], deadline=deadline)
                at, line = await _until(awaited, "waiting for its result")
                assert 2.9 <= at - started < 6, (at - started, line)
                assert line.startswith("round 0: waiting for its result (1/2 verified, ")
                assert "quorum 2, deadline in " in line and 20 <= _deadline_in(line) <= 30
                at, line = await _until(published, "to verify this peer's input")
                assert 2.9 <= at - started < 6, (at - started, line)
                assert "(1/2 verified, 2 received, quorum 2, deadline in " in line, line
                # the round closes on an aggregate nobody serves
                await c.result(0, None, aggregate, [p0, p1], record_cid("round 0"))
                closed = time.monotonic()
                await asyncio.wait_for(publishing, 15)  # verified: the peer is done
                at, line = await _until(awaited, "closed: fetching its aggregate")
                assert at - closed < 6, (at - closed, line)
                assert line == (
                    f"round 0 closed: fetching its aggregate {aggregate} from {node.name} "
                    "(the node's routing found no provider of this CID; its 1 connected "
                    "peer(s) are asked too)"
                )
                assert not awaiting.done()
                awaiting.cancel()
                await asyncio.gather(awaiting, return_exceptions=True)

    asyncio.run(go())


def test_an_aggregate_on_a_node_without_peers_says_so_within_3_s(kubo_factory: Daemons) -> None:
    """The coordinator's result names an aggregate the peer's node cannot get: a node
    without peers (the scripted coordinator speaks through that same node)."""
    from gradstore.cli._peer_wait import PeerWaitLines

    (daemon,) = kubo_factory(1)
    config, coord, keys = make_job(2, method="mean", quorum=2, deadline_s=30)
    aggregate = _unserved()

    async def go() -> None:
        async with (
            _scripted(daemon, daemon, config, coord) as (c, node),
            Peer(config, node) as listener,
        ):
            out = Stamped()
            awaiting = asyncio.create_task(
                PeerWaitLines(listener, 0, None, publishing=False, stream=out).run(
                    listener.await_result(0, timeout=60)
                )
            )
            await asyncio.sleep(0.5)
            await c.result(0, None, aggregate, [k.did for k in keys], record_cid("r"))
            sent = time.monotonic()
            at, line = await _until(out, "closed: fetching")
            assert at - sent < 4.5, at - sent
            assert line.endswith(
                f"fetching its aggregate {aggregate} from {node.name} (the node has no "
                "peers, so no other node can send it this CID)"
            )
            awaiting.cancel()
            await asyncio.gather(awaiting, return_exceptions=True)

    asyncio.run(go())


@pytest.mark.parametrize("publishing", [False, True], ids=["await", "publish"])
def test_with_no_coordinator_a_waiting_peer_says_so_after_3_s(
    kubo_factory: Daemons, publishing: bool
) -> None:
    from gradstore.cli._peer_wait import PeerWaitLines

    (daemon,) = kubo_factory(1)
    config, _, keys = make_job(2, method="mean")
    gradient = Gradient({"w": np.ones(3, np.float32)})

    async def go() -> None:
        node = daemon.node()
        key = keys[0] if publishing else None
        try:
            async with Peer(config, node, key, coordinator_timeout_s=7) as peer:
                out = Stamped()
                work = peer.publish(gradient, 0, 1) if publishing else peer.await_result(0)
                started = time.monotonic()
                with pytest.raises(CoordinatorError):
                    await PeerWaitLines(peer, 0, None, publishing=publishing, stream=out).run(work)
                ended = time.monotonic()
        finally:
            await node.aclose()
        (at, line), *_ = out.lines
        assert 2.9 <= at - started < 4 and ended - at > 2, (at - started, ended - started)
        assert line == (
            f"waiting for the coordinator of job {config.job}: it has not been heard for 3 s "
            f"on {config.results_topic} (is `gradstore coordinator` running, and connected "
            "to this node? gives up after 7 s of silence)"
        )

    asyncio.run(go())


def test_the_commands_say_it_while_they_wait(kubo_factory: Daemons, tmp_path: Path) -> None:
    """As processes, as the walkthrough run twice had them (the coordinator had said the job
    was complete and exited): each says it waits for the coordinator long before it gives up,
    where before it was silent for 15 s."""
    (daemon,) = kubo_factory(1)
    config, _, keys = make_job(2, method="mean")
    job = write_job_toml(config, tmp_path / "job.toml")
    key = tmp_path / "alice.key"
    keys[0].save(key)
    np.savez(tmp_path / "alice.npz", w=np.ones(3, np.float32))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADSTORE_API", "IPFS_"))}
    env["GRADSTORE_API"] = daemon.api_url
    base = [sys.executable, "-m", "gradstore", "peer"]
    commands: Sequence[list[str]] = [
        [*base, "await", "--config", str(job), "--round", "0", "-o", str(tmp_path / "a.npz")],
        [*base, "publish", "--config", str(job), "--key", str(key), "--round", "0",
         str(tmp_path / "alice.npz")],
    ]  # fmt: skip
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True
        )
        for argv in commands
    ]
    heard: list[list[tuple[float, str]]] = [[] for _ in procs]

    def read(proc: subprocess.Popen[str], lines: list[tuple[float, str]]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic() - started, line.rstrip("\n")))

    readers = [
        threading.Thread(target=read, args=(proc, lines), daemon=True)
        for proc, lines in zip(procs, heard, strict=True)
    ]
    try:
        for reader in readers:
            reader.start()
        codes = [proc.wait(timeout=90) for proc in procs]
        for reader in readers:
            reader.join(10)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            assert proc.stderr is not None
            proc.stderr.close()
    for code, lines in zip(codes, heard, strict=True):
        assert code == 1 and len(lines) >= 2, lines
        (seen, first), (ended, error) = lines[0], lines[-1]
        assert first.startswith(f"waiting for the coordinator of job {config.job}: "), lines
        assert error.startswith("error: the coordinator of job"), lines
        assert ended - seen >= 8, lines  # 3 s in, of the 15 s it waits
