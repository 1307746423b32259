"""The coordinator's SQLite journal: what a restart relies on."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from gradstore.coordinator import Coordinator, Journal
from gradstore.errors import CoordinatorError, RoundFailedError
from gradstore.messages import Announce, decode_record, encode_message
from gradstore.node import LocalNode
from gradstore.peer import Peer
from gradstore.store import GradientStore

from .harness import gradients, make_job


def test_accept_is_once_per_peer_and_round(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.sqlite") as j:
        j.accept(0, "did:a", "bafkreia", 10, b"msg")
        j.accept(0, "did:a", "bafkreib", 99, b"other")  # the first announcement wins
        j.accept(1, "did:a", "bafkreib", 99, b"other")
        assert j.inputs(0) == [] and j.pending == 3  # queued, not yet committed
        assert j.flush() == 3 and j.pending == 0
        (row,) = j.inputs(0)
        assert (row.cid, row.num_samples, row.state) == ("bafkreia", 10, "received")
        assert [r.cid for r in j.inputs_from(0)] == ["bafkreia", "bafkreib"]


def test_writes_queued_at_close_are_committed(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with Journal(path) as j:
        j.accept(0, "did:a", "bafkreia", 10, b"msg")
    with Journal(path) as again:
        assert [r.cid for r in again.inputs(0)] == ["bafkreia"]


def test_a_run_id_is_drawn_once_per_state_folder(tmp_path: Path) -> None:
    with Journal(tmp_path / "a.sqlite") as j:
        run = j.bind("job", "did:coord")
        assert len(run) == 26 and run.isalnum() and run == run.lower()
    with Journal(tmp_path / "a.sqlite") as j:
        assert j.bind("job", "did:coord") == run  # a restart resumes the same run
    with Journal(tmp_path / "b.sqlite") as j:
        assert j.bind("job", "did:coord") != run  # another folder is another run


def test_state_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.bind("job", "did:coord")
    opened = j.open_round(0, opened_at=123.0)
    j.accept(0, "did:a", "bafkreia", 1, b"m")
    j.set_input_state(0, "did:a", "failed", "non-finite: tensor 'w' holds NaN or Inf")
    j.close()

    again = Journal(path)
    again.bind("job", "did:coord")
    again.flush()
    assert again.open_round(0, opened_at=999.0).opened_at == opened.opened_at == 123.0  # idempotent
    assert again.input(0, "did:a").reason.startswith("non-finite")  # type: ignore[union-attr]
    again.close_round(0, "bafkreiout", "bafyreirec")
    again.set_stats(0, {"verified": 3, "bytes_fetched": 10})
    again.flush()
    (row,) = again.rounds()
    assert (row.state, row.output, row.record, row.published) == (
        "closed",
        "bafkreiout",
        "bafyreirec",
        False,
    )
    again.mark_published(0)
    again.flush()
    assert again.rounds()[0].published and again.stats(0) == {"verified": 3, "bytes_fetched": 10}
    again.close()


def test_a_state_dir_belongs_to_one_job(tmp_path: Path) -> None:
    with Journal(tmp_path / "j.sqlite") as j:
        j.bind("job-a", "did:coord")
        with pytest.raises(CoordinatorError, match="belongs to job 'job-a'"):
            j.bind("job-b", "did:coord")
        with pytest.raises(CoordinatorError, match="coordinator"):
            j.bind("job-a", "did:other")


def test_a_restarted_coordinator_still_tells_late_peers_why_a_round_failed(tmp_path: Path) -> None:
    # Round 0 fails (one of the two peers it needs announces); the coordinator exits.
    # Restarted on the same journal with the job already done, it re-broadcasts that failure.
    config, coord, peers = make_job(2, rounds=1, quorum=2, deadline_s=0.5)
    state, blocks = tmp_path / "state", tmp_path / "node"

    async def go() -> None:
        first = Coordinator(config, coord, LocalNode(blocks), state, linger_s=0)
        running = asyncio.create_task(first.run())
        async with Peer(config, LocalNode(blocks), peers[0]) as peer:
            await peer.publish(gradients(1, 0)[0], 0, num_samples=1, timeout=20)
        (outcome,) = await running
        assert outcome.status == "failed"
        node = LocalNode(blocks)
        async with Peer(config, node) as late:
            again = Coordinator(config, coord, node, state, rebroadcast_s=0.1, linger_s=2)
            rerun = asyncio.create_task(again.run())
            with pytest.raises(RoundFailedError, match="quorum not met: 1 verified of 2") as info:
                await late.await_result(0, timeout=10)
            assert info.value.reason == outcome.reason
            assert await rerun == []  # nothing left to run

    asyncio.run(go())


def test_a_restarted_coordinator_re_broadcasts_the_last_result(tmp_path: Path) -> None:
    config, coord, peers = make_job(1, method="mean", rounds=1, quorum=1, deadline_s=30)
    state, blocks = tmp_path / "state", tmp_path / "node"
    (grad,) = gradients(1, 0)

    async def go() -> None:
        node = LocalNode(blocks)
        first = Coordinator(config, coord, node, state, linger_s=0)
        running = asyncio.create_task(first.run())
        async with Peer(config, node, peers[0]) as peer:
            await peer.publish(grad, 0, num_samples=1, timeout=20)
        (outcome,) = await running
        assert outcome.status == "closed"
        async with Peer(config, LocalNode(blocks)) as late:
            again = Coordinator(config, coord, LocalNode(blocks), state, rebroadcast_s=0.1)
            rerun = asyncio.create_task(again.run())
            result = await late.await_result(0, timeout=10)
            assert (result.cid, result.record) == (outcome.output, outcome.record)
            assert await rerun == []

    asyncio.run(go())


#: The journal's tables before steps (issue 19): inputs had no step.
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE rounds (
    round INTEGER PRIMARY KEY, opened_at REAL NOT NULL, state TEXT NOT NULL,
    output TEXT, record TEXT, reason TEXT, published INTEGER NOT NULL DEFAULT 0, stats TEXT
);
CREATE TABLE inputs (
    round INTEGER NOT NULL, peer TEXT NOT NULL, cid TEXT NOT NULL,
    num_samples INTEGER NOT NULL, message BLOB NOT NULL,
    state TEXT NOT NULL, reason TEXT, accepted_at REAL NOT NULL,
    PRIMARY KEY (round, peer)
);
"""


def test_a_journal_from_before_steps_is_migrated_and_its_open_round_resumes(
    tmp_path: Path,
) -> None:
    config, coord, peers = make_job(2, method="mean", rounds=1, quorum=2, deadline_s=30)
    state, blocks = tmp_path / "state", tmp_path / "node"
    grads = gradients(2, 0)
    run = "b" * 26

    async def go() -> None:
        cid = await GradientStore(LocalNode(blocks)).put(grads[0])
        ann = Announce(
            job=config.job,
            run=run,
            round=0,
            peer=peers[0].did,
            cid=str(cid),
            num_samples=3,
            sent_at=int(time.time() * 1000),
        )
        state.mkdir()
        with closing(sqlite3.connect(state / "journal.sqlite")) as db, db:  # by the old coordinator
            db.executescript(V1_SCHEMA)
            meta = {"job": config.job, "coordinator": config.coordinator, "run": run}
            db.executemany(
                "INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()]
            )
            db.execute(
                "INSERT INTO rounds (round, opened_at, state) VALUES (0, ?, 'open')", (time.time(),)
            )
            db.execute(
                "INSERT INTO inputs VALUES (0, ?, ?, 3, ?, 'verified', NULL, ?)",
                (peers[0].did, str(cid), encode_message(ann, peers[0]), time.time()),
            )
        with Journal(state / "journal.sqlite") as journal:
            (row,) = journal.inputs(0)
            assert (row.peer, row.cid, row.step) == (peers[0].did, str(cid), None)
        node = LocalNode(blocks)
        coordinator = Coordinator(config, coord, node, state, linger_s=0)
        running = asyncio.create_task(coordinator.run())
        async with Peer(config, LocalNode(blocks), peers[1]) as peer:
            await peer.publish(grads[1], 0, num_samples=4, timeout=20)
        (outcome,) = await running
        assert outcome.status == "closed" and outcome.peers == tuple(p.did for p in peers)
        record = decode_record(await node.get_block(outcome.record), cid=outcome.record)
        assert record.run == run and [i.num_samples for i in record.inputs] == [3, 4]

    asyncio.run(go())
    with closing(sqlite3.connect(state / "journal.sqlite")) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 2
