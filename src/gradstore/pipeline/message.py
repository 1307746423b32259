"""A stage's signed activation message: the CID of a gradstore/1 document holding the
activations it sends forward (``pipeline/activation``) or their gradients it sends back
(``pipeline/activation-grad``).

Wire form (canonical msgpack, ``messages.wire``), signed by the sender's did:key over the
map without ``sig``, like an announcement::

    {v: 1, type, job, run, round, micro_batch, stage: <receiving stage>, replica, sender,
     cid: "<CIDv1 text>", sent_at: unix ms, sig}

The receiving stage accepts one only from its lane's replica of the stage before it
(forward) or after it (backward), for its own run, round and micro-batches: a replay or a
forgery is refused with a typed reason (``verify_stage_message``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from ..dag.cid import CID
from ..errors import MessageError, Reason
from ..job import PipelineConfig
from ..messages.didkey import verify_signature
from ..messages.envelope import open_envelope, sealed
from ..messages.keys import SigningKey
from ..messages.schema import check_cid, check_did, check_job, check_run, check_step, check_uint
from ..messages.wire import pack_map

MESSAGE_VERSION: Final = 1
FORWARD: Final = "pipeline/activation"
BACKWARD: Final = "pipeline/activation-grad"
Direction = Literal["pipeline/activation", "pipeline/activation-grad"]
MAX_MESSAGE_BYTES: Final = 4 * 1024
_KEYS: Final = (
    "v",
    "type",
    "job",
    "run",
    "round",
    "micro_batch",
    "stage",
    "replica",
    "sender",
    "cid",
    "sent_at",
    "sig",
)


def pipeline_topic(job: str) -> str:
    """The pubsub topic a job's stages send their activation messages on."""
    return f"gradstore/v1/{job}/pipeline"


@dataclass(frozen=True)
class StageMessage:
    """An activation (``FORWARD``) or activation-gradient (``BACKWARD``) message for replica
    ``replica`` of stage ``stage``; ``encode_stage_message`` signs it with ``sender``'s key."""

    type: Direction
    job: str
    run: str
    round: int
    micro_batch: int
    stage: str
    replica: int
    sender: str
    cid: CID
    sent_at: int  # unix ms

    def __post_init__(self) -> None:
        if self.type not in (FORWARD, BACKWARD):
            raise MessageError(Reason.UNKNOWN_TYPE, f"not a stage message: {self.type!r:.40}")
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("round", self.round)
        check_uint("micro_batch", self.micro_batch)
        check_step("stage", self.stage)
        check_uint("replica", self.replica)
        check_did("sender", self.sender)
        if not isinstance(self.cid, CID):
            raise MessageError(Reason.MALFORMED, "`cid` must be a CID")
        check_uint("sent_at", self.sent_at)


def _unsigned_pairs(msg: StageMessage) -> list[tuple[str, Any]]:
    return [
        ("v", MESSAGE_VERSION),
        ("type", msg.type),
        ("job", msg.job),
        ("run", msg.run),
        ("round", msg.round),
        ("micro_batch", msg.micro_batch),
        ("stage", msg.stage),
        ("replica", msg.replica),
        ("sender", msg.sender),
        ("cid", str(msg.cid.to_v1())),
        ("sent_at", msg.sent_at),
    ]


def encode_stage_message(msg: StageMessage, key: SigningKey) -> bytes:
    """The signed wire bytes of ``msg``; ``key`` must be the sender's."""
    if key.did != msg.sender:
        raise MessageError(
            Reason.BAD_SIGNATURE, f"a message of {msg.sender} cannot be signed by {key.did}"
        )
    pairs = _unsigned_pairs(msg)
    return pack_map([*pairs, ("sig", key.sign(pack_map(pairs)))])


def decode_stage_message(data: bytes) -> StageMessage:
    """Strictly decode a stage message and check its sender's signature.

    Refusals are ``MessageError``: too-large, malformed, unknown-type, bad-signature.
    """
    pairs, values = open_envelope(
        data, max_bytes=MAX_MESSAGE_BYTES, version=MESSAGE_VERSION, what="stage message"
    )
    keys = tuple(k for k, _ in pairs)
    if values["type"] not in (FORWARD, BACKWARD):
        raise MessageError(Reason.UNKNOWN_TYPE, f"not a stage message: {values['type']!r:.40}")
    if keys != _KEYS:
        raise MessageError(Reason.MALFORMED, f"a stage message has keys {list(_KEYS)}")
    text = check_cid("cid", values["cid"])
    if text != values["cid"]:
        raise MessageError(Reason.MALFORMED, "`cid` is not in canonical form (base32 CIDv1)")
    msg = StageMessage(
        type=values["type"],
        job=values["job"],
        run=values["run"],
        round=values["round"],
        micro_batch=values["micro_batch"],
        stage=values["stage"],
        replica=values["replica"],
        sender=values["sender"],
        cid=CID.parse(text),
        sent_at=values["sent_at"],
    )
    signed, sig = sealed(pairs, _unsigned_pairs(msg), what="stage message")
    if not verify_signature(msg.sender, signed, sig):
        raise MessageError(Reason.BAD_SIGNATURE, f"signature is not {msg.sender}'s")
    return msg


def expected_sender(pipeline: PipelineConfig, stage: str, replica: int, direction: str) -> str:
    """The one peer a replica takes ``direction`` messages from: its lane's replica of the
    stage before (forward) or after (backward). ``MessageError`` unexpected-type if there is
    no such stage (the first stage gets no activations, the last no gradients)."""
    at = pipeline.index(stage)
    source = at - 1 if direction == FORWARD else at + 1
    if not 0 <= source < len(pipeline.stages):
        raise MessageError(Reason.UNEXPECTED_TYPE, f"stage {stage!r} takes no {direction} messages")
    return pipeline.stages[source].replicas[replica]


def verify_stage_message(
    data: bytes,
    *,
    job: str,
    run: str,
    round_: int,
    stage: str,
    replica: int,
    direction: Direction,
    pipeline: PipelineConfig,
) -> StageMessage:
    """Decode a stage message and accept it only as ``direction`` for this job, run, round,
    stage and replica, from the lane's replica of the stage before (forward) or after
    (backward), for a micro-batch the round has.

    Refusals are ``MessageError`` with code too-large, malformed, unknown-type,
    bad-signature, wrong-job, unexpected-type, unknown-step (another stage's), not-in-step
    (a sender not in the neighbouring stage), wrong-peer (another lane's replica),
    wrong-run, stale-round, future-round or out-of-range (a micro-batch the round has not).
    """
    msg = decode_stage_message(data)
    if msg.job != job:
        raise MessageError(Reason.WRONG_JOB, f"message is for job {msg.job!r}, not {job!r}")
    if msg.type != direction:
        raise MessageError(Reason.UNEXPECTED_TYPE, f"a {msg.type} where {direction} is due")
    if msg.stage != stage or msg.replica != replica:
        raise MessageError(
            Reason.UNKNOWN_STEP,
            f"message is for stage {msg.stage!r} replica {msg.replica}, "
            f"not {stage!r} replica {replica}",
        )
    source = expected_sender(pipeline, stage, replica, direction)
    neighbour = pipeline.stages[pipeline.index(stage) + (-1 if direction == FORWARD else 1)]
    if msg.sender not in neighbour.replicas:
        raise MessageError(
            Reason.NOT_IN_STEP,
            f"{msg.sender} is not a replica of stage {neighbour.name!r}, which sends "
            f"{stage!r} its {'activations' if direction == FORWARD else 'activation gradients'}",
        )
    if msg.sender != source:
        raise MessageError(
            Reason.WRONG_PEER, f"{msg.sender} is not replica {replica} of {neighbour.name!r}"
        )
    if msg.run != run:
        raise MessageError(Reason.WRONG_RUN, f"message is for run {msg.run}, not {run}")
    if msg.round < round_:
        raise MessageError(Reason.STALE_ROUND, f"message is for round {msg.round}, now {round_}")
    if msg.round > round_:
        raise MessageError(Reason.FUTURE_ROUND, f"message is for round {msg.round}, now {round_}")
    if msg.micro_batch >= pipeline.micro_batches:
        raise MessageError(
            Reason.OUT_OF_RANGE,
            f"micro-batch {msg.micro_batch}: a round has {pipeline.micro_batches}",
        )
    return msg
