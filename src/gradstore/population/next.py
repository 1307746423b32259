"""The controller's signed "next interval" message: which run, which interval to train, and
the decision record that ends the one before (none before interval 0).

Wire form (canonical msgpack), signed by the controller (the job's coordinator)::

    {v: 1, type: "population/next", job, run, interval, record?: "<CIDv1 text>", sent_at, sig}

A member acts only on one signed by the controller it knows (not-coordinator otherwise) and
for its job (wrong-job); it learns the run id from it, like a peer from a status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from ..dag.cid import CID
from ..errors import MessageError, Reason
from ..messages.didkey import verify_signature
from ..messages.envelope import open_envelope, sealed
from ..messages.keys import SigningKey
from ..messages.schema import check_cid, check_job, check_run, check_uint
from ..messages.wire import pack_map

NEXT_TYPE: Final = "population/next"
MAX_NEXT_BYTES: Final = 4096


@dataclass(frozen=True)
class NextInterval:
    """Train ``interval`` of ``run``; ``record`` is the decision that ended the previous one."""

    job: str
    run: str
    interval: int
    record: CID | None
    sent_at: int

    def __post_init__(self) -> None:
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("interval", self.interval)
        check_uint("sent_at", self.sent_at)
        if (self.record is None) != (self.interval == 0):
            raise MessageError(Reason.MALFORMED, "`record` is given exactly after interval 0")


def _pairs(msg: NextInterval) -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = [
        ("v", 1),
        ("type", NEXT_TYPE),
        ("job", msg.job),
        ("run", msg.run),
        ("interval", msg.interval),
    ]
    if msg.record is not None:
        pairs.append(("record", str(msg.record.to_v1())))
    return [*pairs, ("sent_at", msg.sent_at)]


def encode_next(msg: NextInterval, key: SigningKey) -> bytes:
    """The signed wire bytes of ``msg`` (``key``: the controller's)."""
    pairs = _pairs(msg)
    return pack_map([*pairs, ("sig", key.sign(pack_map(pairs)))])


def verify_next(data: bytes, *, job: str, controller: str) -> NextInterval:
    """Decode a next-interval message and accept it only for ``job`` from ``controller``.

    Refusals are ``MessageError``: too-large, malformed, unknown-type, wrong-job,
    not-coordinator.
    """
    pairs, values = open_envelope(data, max_bytes=MAX_NEXT_BYTES, version=1, what="message")
    if values["type"] != NEXT_TYPE:
        raise MessageError(Reason.UNKNOWN_TYPE, f"not a {NEXT_TYPE} (type {values['type']!r:.40})")
    record = values.get("record")
    if record is not None and check_cid("record", record) != record:
        raise MessageError(Reason.MALFORMED, "`record` is not in canonical form (base32 CIDv1)")
    msg = NextInterval(
        job=values.get("job"),  # type: ignore[arg-type]  # checked by the constructor
        run=values.get("run"),  # type: ignore[arg-type]
        interval=values.get("interval"),  # type: ignore[arg-type]
        record=None if record is None else CID.parse(record),
        sent_at=values.get("sent_at"),  # type: ignore[arg-type]
    )
    signed, sig = sealed(pairs, _pairs(msg), what="message")
    if msg.job != job:
        raise MessageError(Reason.WRONG_JOB, f"message is for job {msg.job!r}, not {job!r}")
    if not verify_signature(controller, signed, sig):
        raise MessageError(
            Reason.NOT_COORDINATOR, f"not signed by the controller {controller} (or altered)"
        )
    return msg
