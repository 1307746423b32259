"""The coordinator and a peer log refused messages once per (reason, sender), then sums
(issue 23, R8): every refusal wrote a ~231-byte WARNING line, from anyone (6 GB a day at
311 msg/s). No network: ``on_message`` is synchronous, and a peer hears a LocalNode.
``messages.refusal_log`` itself is tested in tests/messages/test_refusal_log.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from gradstore.coordinator import Coordinator
from gradstore.messages import Announce, SigningKey, Status, encode_message
from gradstore.node import LocalNode
from gradstore.peer import Peer

from .harness import make_job

CID = "bafkreiculfwg6gpeo3eevolx277diwuhohklq7guh32jpaqcoyorzl5jvy"


# -- the coordinator: one line per (reason, sender), then summaries ----------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_junk_and_forged_announcements_logs_a_line_per_reason_not_per_message(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, coord, peers = make_job(2)
    clock = _Clock()
    coordinator = Coordinator(config, coord, LocalNode(tmp_path / "n"), tmp_path / "s", clock=clock)
    forgers = [SigningKey.from_seed(i.to_bytes(4, "big") * 8) for i in range(300)]
    sent = 0
    with caplog.at_level(logging.WARNING, logger="gradstore.coordinator"):
        for minute in range(3):
            for i, forger in enumerate(forgers):  # a did of their own each: not a job's peer
                ann = Announce(config.job, "r" * 26, 0, forger.did, CID, i + 1, minute)
                coordinator.on_message(encode_message(ann, forger))
                # a job's peer named, someone else's signature
                forged = Announce(config.job, "r" * 26, 0, peers[0].did, CID, i + 1, minute)
                data = bytearray(encode_message(forged, peers[0]))
                data[-1] ^= 1
                coordinator.on_message(bytes(data))
                coordinator.on_message(b"\xc1junk" + i.to_bytes(4, "big") + bytes([minute]))
                sent += 3
                clock.now += 0.1
            clock.now += 30.0
        # a job's own peer, its signature good, for another run: a sender of its own
        for i in range(50):
            ann = Announce(config.job, "x" * 26, 0, peers[1].did, CID, i + 1, 1)
            coordinator.on_message(encode_message(ann, peers[1]))
            sent += 1
        clock.now += 61.0
        coordinator.on_message(b"\xc1 the last one")  # the summary is due: out it goes
        sent += 1
    lines = [r.getMessage() for r in caplog.records if r.name == "gradstore.coordinator"]
    assert coordinator.refusals == {
        "unknown-peer": 900,
        "bad-signature": 900,
        "malformed": 901,
        "wrong-run": 50,
    }
    full = [line for line in lines if line.startswith("refused announcement")]
    summaries = [line for line in lines if line.startswith("refused ") and " more " in line]
    assert len(full) == 4, full  # one per reason: junk has no sender to tell apart
    assert [line.split(": ")[1] for line in full] == [
        "unknown-peer",
        "bad-signature",
        "malformed",
        "wrong-run",
    ]
    assert len(lines) == len(full) + len(summaries) and 2 <= len(summaries) <= 4, lines
    # every refusal is in a line of its own or in a summary
    assert sum(int(line.split()[1]) for line in summaries) == sent - len(full) == 2747
    assert coordinator.refusal_log.remembered == 4


# -- a peer: junk on the results topic ---------------------------------------------------------
def test_a_peer_logs_junk_on_the_results_topic_once_per_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, coord, _ = make_job(2)
    impostor = SigningKey.from_seed(b"\x07" * 32)
    none = config.roster.bitmap([])

    def status(signer: SigningKey, round_: int) -> bytes:
        msg = Status(config.job, "r" * 26, round_, none, none, none, (), int(time.time() * 1000))
        return encode_message(msg, signer)

    async def go() -> None:
        node = LocalNode(tmp_path / "n")
        async with Peer(config, node) as peer:
            for i in range(500):
                await node.publish(config.results_topic, b"\xc1" + i.to_bytes(2, "big"))
                await node.publish(config.results_topic, status(impostor, i))
            await node.publish(config.results_topic, status(coord, 0))  # after all the junk
            while peer.view.current is None:
                await asyncio.sleep(0.01)

    with caplog.at_level(logging.WARNING, logger="gradstore.peer"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "gradstore.peer"]
    assert len(lines) == 2, lines[:5]
    assert "malformed" in lines[0] and "not-coordinator" in lines[1]
