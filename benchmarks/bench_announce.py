#!/usr/bin/env python3
"""How many announcements per second can one coordinator process admit?

A job of --peers peers; one pre-signed announcement per peer (round 0), then the same
number of exact replays and of re-signed duplicates. Each message goes through what the
coordinator's reader does with it (``Coordinator.on_message``: replay filter, strict
decode, Ed25519 signature check, admission, journal queue), and the journal is committed
in batches of --batch (one SQLite transaction, synchronous=FULL, each), as the journal
writer does. Side by side, in the same run: the Ed25519 verification alone over the same
messages (the floor: no coordinator can admit faster than it checks signatures).

    .venv/bin/python -m benchmarks announce [--peers 4000] [--batch 256] [--json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from benchmarks._common import dump_json, machine, table
from gradstore.coordinator import Coordinator, Verdict
from gradstore.coordinator.journal import Journal
from gradstore.dag import CID
from gradstore.dag.cid import RAW
from gradstore.job import parse_job
from gradstore.messages import (
    Announce,
    SigningKey,
    decode_message,
    encode_message,
    public_key_from_did,
)
from gradstore.messages.schema import unsigned_pairs
from gradstore.messages.wire import pack_map
from gradstore.node import LocalNode


def build(n: int, tmp: Path) -> tuple[Coordinator, list[SigningKey]]:
    coord = SigningKey.from_seed(b"\xc0" * 32)
    keys = [SigningKey.from_seed(i.to_bytes(32, "big")) for i in range(1, n + 1)]
    config = parse_job(
        {
            "job": "bench-announce",
            "coordinator": coord.did,
            "peers": [k.did for k in keys],
            "rounds": {"count": 1, "quorum": 1, "deadline_s": 600.0},
        }
    )
    return Coordinator(config, coord, LocalNode(tmp / "node"), tmp / "state"), keys


def announcements(coordinator: Coordinator, keys: list[SigningKey]) -> list[bytes]:
    now = int(time.time() * 1000)
    return [
        encode_message(
            Announce(
                job=coordinator.config.job,
                run=coordinator.run_id,
                round=0,
                peer=k.did,
                cid=str(CID.hash(RAW, k.did.encode())),
                num_samples=1,
                sent_at=now,
            ),
            k,
        )
        for k in keys
    ]


def admit_all(
    coordinator: Coordinator, msgs: list[bytes], batch: int
) -> tuple[float, dict[str, int]]:
    verdicts: dict[str, int] = {}
    start = time.perf_counter()
    for i, data in enumerate(msgs, 1):
        verdict = coordinator.on_message(data)
        verdicts[verdict.value] = verdicts.get(verdict.value, 0) + 1
        if i % batch == 0:
            coordinator.journal.flush()
    coordinator.journal.flush()
    return time.perf_counter() - start, verdicts


def verify_only(msgs: list[bytes], keys: list[SigningKey]) -> float:
    """Ed25519 verification of each message's signature over its body, nothing else."""
    pubs = [Ed25519PublicKey.from_public_bytes(public_key_from_did(k.did)) for k in keys]
    bodies = [pack_map(unsigned_pairs(decode_message(data))) for data in msgs]
    pairs = [(pubs[i], bodies[i], data[-64:]) for i, data in enumerate(msgs)]
    start = time.perf_counter()
    for pub, body, sig in pairs:
        pub.verify(sig, body)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--peers", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gradstore-bench-announce-") as tmp:
        coordinator, keys = build(args.peers, Path(tmp))
        with Journal(Path(tmp) / "state" / "journal.sqlite") as journal:
            coordinator._journal = journal  # what run() does, without a node or a loop
            coordinator.state.run_id = journal.bind(
                coordinator.config.job, coordinator.config.coordinator
            )
            fresh = announcements(coordinator, keys)
            resigned = announcements(coordinator, keys)  # same CIDs, new stamps: duplicates
            t_fresh, v_fresh = admit_all(coordinator, fresh, args.batch)
            t_replay, v_replay = admit_all(coordinator, fresh, args.batch)
            t_dup, v_dup = admit_all(coordinator, resigned, args.batch)
            assert v_fresh == {Verdict.ACCEPT.value: args.peers}, v_fresh
            assert v_replay == v_dup == {Verdict.DUPLICATE.value: args.peers}, (v_replay, v_dup)
            assert len(journal.inputs(0)) == args.peers
        t_verify = verify_only(fresh, keys)
    n = args.peers
    data: dict[str, Any] = {
        "peers": n,
        "batch": args.batch,
        "machine": machine(),
        "per_second": {
            "accepted (decode, verify, admit, journal)": n / t_fresh,
            "exact replays": n / t_replay,
            "re-signed duplicates": n / t_dup,
            "Ed25519 verify alone (reference)": n / t_verify,
        },
    }
    if args.json:
        dump_json(data)
        return
    ref = n / t_verify
    rows = [
        [what, f"{rate:,.0f}", f"{rate / ref:.2f}"] for what, rate in data["per_second"].items()
    ]
    print(
        f"{n} announcements, journal committed every {args.batch}, load {data['machine']['loadavg']}\n"
    )
    print(table(["path", "messages/s", "vs verify alone"], rows))


if __name__ == "__main__":
    main()
