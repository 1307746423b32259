"""Whether a document belongs to the announcement that names it: pure decisions, no I/O.

An announcement is signed by its peer, but the CID it names is anyone's: every CID is
visible on the gradients topic, so without more a peer could announce another peer's
document (and be aggregated with its work), or last round's document again. The
documents ``Peer.publish`` stores name their own peer, round, job and sample count in
their meta (Flower's clients add the run), and CIDs are hashes, so that meta cannot be
changed without changing the CID. ``check_binding`` compares what the meta names with what
the announcement claims; a key the meta lacks is not checked, unless the job requires
bound meta. ``duplicates`` finds the announcements that repeat a CID already announced in
the round: the first one keeps it.

Every reason starts with its code (an ``errors.Reason``): ``wrong-peer``, ``wrong-round``,
``wrong-job``, ``wrong-run``, ``wrong-kind``, ``samples-mismatch``, ``unbound``,
``duplicate-cid``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..dag import CID
from ..errors import CIDError, Reason, reason_text

#: Meta keys a bound document must have (``require_meta``): whose, which round, which job.
BOUND_KEYS: Final = ("peer", "round", "job")

#: Kinds of documents that are not a peer's update: the coordinator's aggregate, Flower's
#: global model, an error-feedback residual. Announcing one is taking someone else's work.
NOT_AN_UPDATE: Final = frozenset({"aggregate", "model", "residual"})


@dataclass(frozen=True)
class Claim:
    """What an announcement says of the document it names, and whether meta is required."""

    peer: str
    round: int
    job: str
    num_samples: int
    run: str | None = None  # None: the run is not checked
    require_meta: bool = False


def check_binding(meta: Mapping[str, Any], claim: Claim) -> str | None:
    """Why the document whose meta is ``meta`` cannot be ``claim``'s (None: it can).

    Every key the meta has must agree with the claim; with ``claim.require_meta`` it
    must also name the peer, the round and the job (``unbound`` otherwise).
    """
    kind = meta.get("kind")
    if isinstance(kind, str) and kind in NOT_AN_UPDATE:
        return reason_text(
            Reason.WRONG_KIND, f"the document is of kind {kind!r}, not a peer's update"
        )
    if "job" in meta and meta["job"] != claim.job:
        return reason_text(
            Reason.WRONG_JOB, f"the document names job {_text(meta['job'])}, this is {claim.job!r}"
        )
    if claim.run is not None and "run" in meta and meta["run"] != claim.run:
        return reason_text(
            Reason.WRONG_RUN, f"the document names run {_text(meta['run'])}, this is {claim.run!r}"
        )
    if "round" in meta and not _same_int(meta["round"], claim.round):
        return reason_text(
            Reason.WRONG_ROUND,
            f"the document names round {_text(meta['round'])}, announced for round {claim.round}",
        )
    if "peer" in meta and meta["peer"] != claim.peer:
        return reason_text(
            Reason.WRONG_PEER,
            f"the document names peer {_text(meta['peer'])}, announced by {claim.peer}",
        )
    if "num_samples" in meta and not _same_int(meta["num_samples"], claim.num_samples):
        return reason_text(
            Reason.SAMPLES_MISMATCH,
            f"the document names {_text(meta['num_samples'])} samples, "
            f"the announcement {claim.num_samples}",
        )
    if claim.require_meta:
        missing = [k for k in BOUND_KEYS if k not in meta]
        if missing:
            return reason_text(
                Reason.UNBOUND,
                "the job requires documents whose meta names their peer, round "
                f"and job; this one lacks {', '.join(missing)}",
            )
    return None


def duplicates(announced: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``{peer: reason}`` for each announcement that repeats an earlier one's CID.

    ``announced`` is ``(peer, cid)`` in announcement order; the first announcement of a
    CID keeps it. CIDs are compared as CIDv1, so a CIDv0 of the same document is the same.
    """
    first: dict[str, str] = {}
    out: dict[str, str] = {}
    for peer, cid in announced:
        key = _cid_key(cid)
        owner = first.setdefault(key, peer)
        if owner != peer:
            out[peer] = reason_text(Reason.DUPLICATE_CID, f"{cid} was announced first by {owner}")
    return out


def _cid_key(cid: str) -> str:
    try:
        return str(CID.parse(cid).to_v1())
    except CIDError:
        return cid


def _same_int(value: Any, expected: int) -> bool:
    return type(value) is int and value == expected


def _text(value: Any, limit: int = 80) -> str:
    """A meta value in a reason: its repr (escaped), cut (a document's meta can hold anything)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
