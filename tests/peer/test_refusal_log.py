"""A peer logs refused messages on the results topic once per (reason, sender) (issue 23, R8).

No network: the peer hears a LocalNode. The coordinator's log is tested in
tests/coordinator/test_refusal_log.py, ``messages.refusal_log`` in tests/messages/.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

from gradstore.messages import SigningKey, Status, encode_message
from gradstore.node import LocalNode
from gradstore.peer import Peer

from ..coordinator.harness import make_job


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
