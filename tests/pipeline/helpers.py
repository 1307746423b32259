"""A 2-stage x 2-replica pipeline job for the tests: keys, the job, a message."""

from __future__ import annotations

from typing import Any

from gradstore.dag.cid import CID, RAW
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.pipeline import FORWARD, StageMessage, encode_stage_message

RUN = "pipelinerun01"


def key(i: int) -> SigningKey:
    return SigningKey.from_seed(bytes([i + 1]) * 32)


COORDINATOR = key(100)
KEYS = [key(i) for i in range(5)]
BODY = [KEYS[0].did, KEYS[1].did]  # stage "body" (fc1), replicas 0 and 1
HEAD = [KEYS[2].did, KEYS[3].did]  # stage "head" (fc2)
BY_DID = {k.did: k for k in KEYS}


def job_raw(**pipeline: Any) -> dict[str, Any]:
    return {
        "job": "pipe-test",
        "coordinator": COORDINATOR.did,
        "peers": [k.did for k in KEYS[:4]],
        "stages": [
            {"name": "body", "tensors": ["fc1.*"], "peers": BODY},
            {"name": "head", "tensors": ["fc2.*"], "peers": HEAD},
        ],
        "pipeline": {"micro_batches": 4, **pipeline},
    }


def job(**pipeline: Any) -> JobConfig:
    return parse_job(job_raw(**pipeline))


def message(
    sender: str,
    *,
    type_: Any = FORWARD,
    stage: str = "head",
    replica: int = 0,
    run: str = RUN,
    round_: int = 0,
    micro_batch: int = 0,
    job_name: str = "pipe-test",
) -> bytes:
    msg = StageMessage(
        type_,
        job_name,
        run,
        round_,
        micro_batch,
        stage,
        replica,
        sender,
        CID.hash(RAW, f"{sender} {micro_batch}".encode()),
        1_700_000_000_000,
    )
    return encode_stage_message(msg, BY_DID[sender])
