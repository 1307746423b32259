"""Refused messages are logged once per (reason, sender), then summed up (issue 23, R8).

Every refusal wrote a ~231-byte WARNING line, from anyone: 6 GB a day at 311 msg/s.
``RefusalLog`` is tested with its clock in hand; the coordinator's wiring without a network
(``on_message`` is synchronous and a refusal needs no node).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gradstore.coordinator import Coordinator
from gradstore.coordinator.refusal_log import RefusalLog
from gradstore.messages import Announce, SigningKey, encode_message
from gradstore.node import LocalNode

from .harness import make_job

CID = "bafkreiculfwg6gpeo3eevolx277diwuhohklq7guh32jpaqcoyorzl5jvy"
PEER = "did:key:z6MkpTHR8VNsBxYAAWHut2Geadd9jSwuBV8xRoAnwWsdvktH"


# -- the decision, with the clock in hand -------------------------------------------------------
def test_the_first_refusal_per_reason_and_sender_is_logged_the_rest_summed_up() -> None:
    rl = RefusalLog(every_s=60)
    assert rl.refused("malformed", None, 0.0)
    assert rl.refused("bad-signature", None, 0.1)
    assert rl.refused("stale-round", PEER, 0.2)
    assert not any(rl.refused("malformed", None, 1 + i / 100) for i in range(1200))
    assert not rl.refused("stale-round", PEER, 2.0)
    assert not any(rl.refused("bad-signature", None, 3 + i / 100) for i in range(34))
    assert rl.summary(50.0) is None  # not yet: 60 s from the first one it counts
    assert rl.summary(61.0) == (
        "refused 1235 more messages in the last 60 s: malformed 1200, bad-signature 34, "
        "stale-round 1"
    )
    assert rl.summary(200.0) is None  # counted from zero again, and nothing since
    assert not rl.refused("malformed", None, 300.0)
    assert rl.summary(330.0) is None
    assert rl.summary(360.0) == "refused 1 more message in the last 60 s: malformed 1"


def test_nothing_to_sum_up_is_no_line() -> None:
    rl = RefusalLog(every_s=10)
    assert rl.refused("malformed", None, 0.0) and rl.refused("malformed", PEER, 0.0)
    assert rl.summary(1000.0) is None  # each was logged in full


def test_forged_senders_cannot_grow_the_pairs_or_the_lines() -> None:
    rl = RefusalLog(every_s=60, max_pairs=64)
    logged = sum(rl.refused("stale-round", f"did:key:z{i}", i / 1000) for i in range(100_000))
    assert logged == 64 and rl.remembered == 64
    line = rl.summary(100.0)
    assert line is not None and line.startswith("refused 99936 more messages")


def test_a_refusal_that_goes_on_is_logged_in_full_again_after_it_is_forgotten() -> None:
    rl = RefusalLog(every_s=60, max_pairs=2, remember_s=600)
    assert rl.refused("clock-skew", PEER, 0.0)
    assert rl.refused("malformed", None, 10.0)
    assert not rl.refused("wrong-run", PEER, 20.0)  # full: counted, not remembered
    assert not rl.refused("clock-skew", PEER, 599.0)
    assert rl.refused("clock-skew", PEER, 600.0)  # forgotten: logged again, remembered anew
    assert rl.refused("wrong-run", PEER, 611.0)  # the malformed pair expired: room again
    assert rl.remembered == 2


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RefusalLog(every_s=0)
    with pytest.raises(ValueError):
        RefusalLog(max_pairs=0)


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
