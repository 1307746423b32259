"""The coordinator logs refused messages once per (reason, sender), then sums (issue 23, R8):
every refusal wrote a ~231-byte WARNING line, from anyone (6 GB a day at 311 msg/s). No
network: ``on_message`` is synchronous. A peer's log: tests/peer/test_refusal_log.py;
``messages.refusal_log`` itself is tested in tests/messages/test_refusal_log.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gradstore.coordinator import Coordinator
from gradstore.messages import Announce, SigningKey, encode_message
from gradstore.node import LocalNode

from .harness import make_job

CID = "bafkreiculfwg6gpeo3eevolx277diwuhohklq7guh32jpaqcoyorzl5jvy"


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
