"""A member's signed report for one interval: its checkpoint CID, score and hyperparameters.

Wire form (canonical msgpack, ``messages.wire``), signed by the member's did:key over the
map without ``sig``, like an announcement::

    {v: 1, type: "population/report", job, run, interval, member, checkpoint: "<CIDv1 text>",
     score: float64, names: [str, ...], values: [value, ...], sent_at: unix ms, sig}

``names`` are the hyperparameters sorted by name and ``values`` theirs, in the same order.
The signature binds the run and the interval: a report replayed from another run or
interval is refused (wrong-run, stale-round, future-round), as is one from a member that is
not on the job's list (unknown-peer) or signed by another key (bad-signature).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final

from ..dag.cid import CID
from ..errors import MessageError, Reason
from ..messages.didkey import verify_signature
from ..messages.envelope import open_envelope, sealed
from ..messages.keys import SigningKey
from ..messages.schema import check_cid, check_did, check_job, check_run, check_uint
from ..messages.wire import pack_map
from ..pbt.decide import MemberScore
from ..pbt.space import HValue, PopulationParams, check_value

REPORT_VERSION: Final = 1
REPORT_TYPE: Final = "population/report"
MAX_REPORT_BYTES: Final = 16 * 1024
_KEYS: Final = (
    "v",
    "type",
    "job",
    "run",
    "interval",
    "member",
    "checkpoint",
    "score",
    "names",
    "values",
    "sent_at",
    "sig",
)


@dataclass(frozen=True)
class MemberReport:
    """What a member says of one interval; ``encode_report`` signs it with the member's key."""

    job: str
    run: str
    interval: int
    member: str
    checkpoint: CID
    score: float
    hparams: dict[str, HValue]
    sent_at: int  # unix ms

    def __post_init__(self) -> None:
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("interval", self.interval)
        check_did("member", self.member)
        if not isinstance(self.checkpoint, CID):
            raise MessageError(Reason.MALFORMED, "`checkpoint` must be a CID")
        if type(self.score) is not float or not math.isfinite(self.score):
            raise MessageError(
                Reason.MALFORMED, f"`score` must be a finite float, got {self.score!r:.40}"
            )
        try:
            hparams = {k: check_value(k, v) for k, v in sorted(self.hparams.items())}
        except (ValueError, AttributeError) as exc:
            raise MessageError(Reason.MALFORMED, f"`values`: {exc}") from None
        if not all(isinstance(k, str) and k for k in hparams):
            raise MessageError(Reason.MALFORMED, "`names` must be non-empty strings")
        object.__setattr__(self, "hparams", hparams)
        check_uint("sent_at", self.sent_at)

    @property
    def score_entry(self) -> MemberScore:
        """The report as the decision reads it."""
        return MemberScore(self.member, self.checkpoint, self.score, dict(self.hparams))


def _unsigned_pairs(rep: MemberReport) -> list[tuple[str, Any]]:
    return [
        ("v", REPORT_VERSION),
        ("type", REPORT_TYPE),
        ("job", rep.job),
        ("run", rep.run),
        ("interval", rep.interval),
        ("member", rep.member),
        ("checkpoint", str(rep.checkpoint.to_v1())),
        ("score", rep.score),
        ("names", list(rep.hparams)),
        ("values", list(rep.hparams.values())),
        ("sent_at", rep.sent_at),
    ]


def encode_report(rep: MemberReport, key: SigningKey) -> bytes:
    """The signed wire bytes of ``rep``; ``key`` must be the member's."""
    if key.did != rep.member:
        raise MessageError(
            Reason.BAD_SIGNATURE, f"a report of {rep.member} cannot be signed by {key.did}"
        )
    pairs = _unsigned_pairs(rep)
    return pack_map([*pairs, ("sig", key.sign(pack_map(pairs)))])


def report_signed(rep: MemberReport, signature: bytes) -> bool:
    """Whether ``signature`` is the member's over ``rep`` (rebuilt from its fields): how an
    auditor checks a decision record's scores against the members' own word."""
    return verify_signature(rep.member, pack_map(_unsigned_pairs(rep)), signature)


def decode_report(data: bytes, *, max_bytes: int = MAX_REPORT_BYTES) -> tuple[MemberReport, bytes]:
    """Strictly decode a report and check its member's signature; returns it with ``sig``.

    Refusals are ``MessageError``: too-large, malformed, unknown-type, bad-signature.
    """
    pairs, values = open_envelope(data, max_bytes=max_bytes, version=REPORT_VERSION, what="report")
    keys = tuple(k for k, _ in pairs)
    if values["type"] != REPORT_TYPE:
        raise MessageError(
            Reason.UNKNOWN_TYPE, f"not a {REPORT_TYPE} (type {values['type']!r:.40})"
        )
    if keys != _KEYS:
        raise MessageError(Reason.MALFORMED, f"a report has keys {list(_KEYS)}, got {list(keys)}")
    names, vals = values["names"], values["values"]
    if not isinstance(names, list) or not isinstance(vals, list) or len(names) != len(vals):
        raise MessageError(Reason.MALFORMED, "`names` and `values` are arrays of one length")
    if names != sorted(set(names)) or not all(isinstance(n, str) for n in names):
        raise MessageError(Reason.MALFORMED, "`names` must be distinct strings, sorted")
    checkpoint_text = check_cid("checkpoint", values["checkpoint"])
    if checkpoint_text != values["checkpoint"]:
        raise MessageError(Reason.MALFORMED, "`checkpoint` is not in canonical form (base32 CIDv1)")
    rep = MemberReport(
        job=values["job"],
        run=values["run"],
        interval=values["interval"],
        member=values["member"],
        checkpoint=CID.parse(checkpoint_text),
        score=values["score"],
        hparams=dict(zip(names, vals, strict=True)),
        sent_at=values["sent_at"],
    )
    _, sig = sealed(pairs, _unsigned_pairs(rep), what="report")
    if not report_signed(rep, sig):
        raise MessageError(Reason.BAD_SIGNATURE, f"report signature is not {rep.member}'s")
    return rep, sig


def verify_report(
    data: bytes,
    *,
    job: str,
    run: str,
    interval: int,
    members: Collection[str],
    params: PopulationParams | None = None,
    now_ms: int | None = None,
    max_skew_ms: int | None = None,
) -> tuple[MemberReport, bytes]:
    """Decode a report and accept it only for this job, run and interval, from a listed
    member, with hyperparameters that fit ``params`` and (given ``now_ms``) a fresh stamp.

    Refusals are ``MessageError`` with code too-large, malformed, unknown-type, bad-signature,
    wrong-job, unknown-peer, wrong-run, stale-round, future-round or clock-skew.
    """
    rep, sig = decode_report(data)
    if rep.job != job:
        raise MessageError(Reason.WRONG_JOB, f"report is for job {rep.job!r}, not {job!r}")
    if rep.member not in members:
        raise MessageError(Reason.UNKNOWN_PEER, f"{rep.member} is not a member of job {job!r}")
    if rep.run != run:
        raise MessageError(Reason.WRONG_RUN, f"report is for run {rep.run}, not {run}")
    if rep.interval < interval:
        raise MessageError(
            Reason.STALE_ROUND, f"report is for interval {rep.interval}, now {interval}"
        )
    if rep.interval > interval:
        raise MessageError(
            Reason.FUTURE_ROUND, f"report is for interval {rep.interval}, now {interval}"
        )
    if now_ms is not None and max_skew_ms is not None and abs(rep.sent_at - now_ms) > max_skew_ms:
        raise MessageError(
            Reason.CLOCK_SKEW,
            f"stamped {(rep.sent_at - now_ms) / 1000:+.1f} s from the controller's clock",
        )
    if params is not None:
        try:
            params.check_hparams(rep.hparams)
        except ValueError as exc:
            raise MessageError(Reason.MALFORMED, f"`values`: {exc}") from None
    return rep, sig
