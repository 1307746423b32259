"""The signed decision record ``gradstore/population/1``: one interval of a population.

A DAG-CBOR node signed by the controller (the job's coordinator) over the node without
``sig``, like a round record (``messages.record_parts``)::

    {type: "gradstore/population/1", job, run, interval, seed,
     params: {quantile_fraction, resample_probability, perturbation_factors: [f, ...], mode,
              mutations: {name: [value, ...] | {low, high}}},
     members: [{member, checkpoint: <link>, score, hparams: {name: value}, sent_at,
                report_sig}],                                       sorted by member
     failed: [{member, reason, checkpoint?: "<CID text>"}],            sorted by member
     copies: [{member, source, checkpoint: <link>, hparams}],          sorted by member
     prev: <link> | null, controller, sig}

Every member entry carries the member's own signed report (``sent_at``, ``report_sig``), so an
auditor checks each score against the member's word, not the controller's. A failed member's
checkpoint is text, not a link: it is often failed because its blocks cannot be had. ``prev``
links the previous interval's record, so the lineage of every member is a Merkle DAG.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..dag.cid import CID
from ..errors import CIDError, MessageError, Reason
from ..messages.keys import SigningKey
from ..messages.record_parts import (
    MAX_RECORD_BYTES,
    check_link,
    check_signed,
    exact_keys,
    open_node,
    sign_node,
)
from ..messages.schema import check_did, check_job, check_run, check_text, check_uint
from ..pbt.decide import Copy, MemberFailure
from ..pbt.space import Choice, HValue, PopulationParams, Range, check_value
from .report import MemberReport, report_signed

POPULATION_RECORD_TYPE: Final = "gradstore/population/1"
_WHAT: Final = "population record"
_KEYS: Final = frozenset(
    {
        "type",
        "job",
        "run",
        "interval",
        "seed",
        "params",
        "members",
        "failed",
        "copies",
        "prev",
        "controller",
        "sig",
    }
)
_PARAMS_KEYS: Final = frozenset(
    {"quantile_fraction", "resample_probability", "perturbation_factors", "mode", "mutations"}
)
_MEMBER_KEYS: Final = frozenset(
    {"member", "checkpoint", "score", "hparams", "sent_at", "report_sig"}
)
_FAILED_KEYS: Final = frozenset({"member", "reason"})
_COPY_KEYS: Final = frozenset({"member", "source", "checkpoint", "hparams"})


@dataclass(frozen=True)
class RecordMember:
    """A member's report as the record holds it, with the member's signature over it."""

    report: MemberReport
    report_sig: bytes


@dataclass(frozen=True)
class PopulationRecord:
    """The unsigned content of a decision record; ``encode_population_record`` signs it."""

    job: str
    run: str
    interval: int
    seed: int
    params: PopulationParams
    members: tuple[RecordMember, ...]
    failed: tuple[MemberFailure, ...]
    copies: tuple[Copy, ...]
    prev: CID | None
    controller: str

    def __post_init__(self) -> None:
        check_job("job", self.job)
        check_run("run", self.run)
        check_uint("interval", self.interval)
        check_uint("seed", self.seed)
        check_did("controller", self.controller)
        for m in self.members:
            r = m.report
            if (r.job, r.run, r.interval) != (self.job, self.run, self.interval):
                raise MessageError(
                    Reason.MALFORMED, f"{r.member}'s report is not of this job, run and interval"
                )
        for name, items in (
            ("members", [m.report.member for m in self.members]),
            ("failed", [f.member for f in self.failed]),
            ("copies", [c.member for c in self.copies]),
        ):
            if items != sorted(set(items)):
                raise MessageError(
                    Reason.MALFORMED, f"`{name}` must be sorted by member, once each"
                )
        listed = {m.report.member for m in self.members}
        if listed & {f.member for f in self.failed}:
            raise MessageError(Reason.MALFORMED, "a member is both ranked and failed")
        if self.prev is not None:
            check_link("prev", self.prev)

    @property
    def type(self) -> str:
        """The record's ``type``: ``gradstore/population/1``."""
        return POPULATION_RECORD_TYPE

    def hparams_after(self) -> dict[str, dict[str, HValue]]:
        """Every member's hyperparameters for the next interval: its copy's, else its own."""
        out = {m.report.member: dict(m.report.hparams) for m in self.members}
        out.update({c.member: dict(c.hparams) for c in self.copies})
        return out


def params_node(params: PopulationParams) -> dict[str, Any]:
    """The ``params`` map of a record: the knobs and the space, as the decision reads them."""
    mutations: dict[str, Any] = {}
    for name, m in params.mutations.items():
        mutations[name] = (
            list(m.values) if isinstance(m, Choice) else {"low": m.low, "high": m.high}
        )
    return {
        "quantile_fraction": float(params.quantile_fraction),
        "resample_probability": float(params.resample_probability),
        "perturbation_factors": list(params.perturbation_factors),
        "mode": params.mode,
        "mutations": mutations,
    }


def params_from_node(node: object) -> PopulationParams:
    """The ``PopulationParams`` of a record's ``params`` map (MessageError if it is not one)."""
    node = exact_keys("params", node, _PARAMS_KEYS)
    mutations_node = node["mutations"]
    if not isinstance(mutations_node, dict):
        raise MessageError(Reason.MALFORMED, "`params.mutations` must be a map")
    try:
        mutations: dict[str, Choice | Range] = {}
        for name, m in mutations_node.items():
            if isinstance(m, list):
                mutations[name] = Choice(tuple(m))
            else:
                m = exact_keys(f"params.mutations.{name}", m, frozenset({"low", "high"}))
                if not all(type(m[k]) is float for k in ("low", "high")):
                    raise ValueError(f"range {name!r}: bounds are floats")
                mutations[name] = Range(m["low"], m["high"])
        factors = node["perturbation_factors"]
        if not isinstance(factors, list) or not all(type(f) is float for f in factors):
            raise ValueError("`perturbation_factors` must be a list of floats")
        for k in ("quantile_fraction", "resample_probability"):
            if type(node[k]) is not float:
                raise ValueError(f"`{k}` must be a float")
        return PopulationParams(
            mutations,
            quantile_fraction=node["quantile_fraction"],
            resample_probability=node["resample_probability"],
            perturbation_factors=tuple(factors),
            mode=node["mode"],
        )
    except ValueError as exc:
        raise MessageError(Reason.MALFORMED, f"`params`: {exc}") from None


def _hparams_from_node(name: str, node: object) -> dict[str, HValue]:
    if not isinstance(node, dict):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be a map")
    try:
        return {k: check_value(k, v) for k, v in sorted(node.items())}
    except ValueError as exc:
        raise MessageError(Reason.MALFORMED, f"`{name}`: {exc}") from None


def _unsigned_node(rec: PopulationRecord) -> dict[str, Any]:
    return {
        "type": POPULATION_RECORD_TYPE,
        "job": rec.job,
        "run": rec.run,
        "interval": rec.interval,
        "seed": rec.seed,
        "params": params_node(rec.params),
        "members": [
            {
                "member": m.report.member,
                "checkpoint": m.report.checkpoint,
                "score": m.report.score,
                "hparams": dict(m.report.hparams),
                "sent_at": m.report.sent_at,
                "report_sig": m.report_sig,
            }
            for m in rec.members
        ],
        "failed": [
            {"member": f.member, "reason": f.reason}
            | ({} if f.checkpoint is None else {"checkpoint": f.checkpoint})
            for f in rec.failed
        ],
        "copies": [
            {
                "member": c.member,
                "source": c.source,
                "checkpoint": c.checkpoint,
                "hparams": c.hparams,
            }
            for c in rec.copies
        ],
        "prev": rec.prev,
        "controller": rec.controller,
    }


def encode_population_record(rec: PopulationRecord, key: SigningKey) -> tuple[CID, bytes]:
    """The signed DAG-CBOR bytes of ``rec`` and their CID; ``key`` must be the controller's."""
    return sign_node(_unsigned_node(rec), rec.controller, key, _WHAT)


def decode_population_record(
    data: bytes, *, cid: CID | None = None, max_bytes: int = MAX_RECORD_BYTES
) -> PopulationRecord:
    """Check ``data`` against ``cid`` (IntegrityError), its schema and the controller's
    signature (MessageError too-large, malformed or bad-signature). The members' report
    signatures are the auditor's to check (``audit_population``)."""
    node, sig = open_node(data, cid, max_bytes, _KEYS, _WHAT)
    if node["type"] != POPULATION_RECORD_TYPE:
        raise MessageError(
            Reason.MALFORMED, f"not a {POPULATION_RECORD_TYPE} node (type {node['type']!r:.40})"
        )
    job, run, interval = node["job"], node["run"], node["interval"]
    members, failed, copies = [], [], []
    for i, entry in enumerate(_list("members", node["members"])):
        entry = exact_keys(f"members[{i}]", entry, _MEMBER_KEYS)
        rsig = entry["report_sig"]
        if not isinstance(rsig, bytes):
            raise MessageError(Reason.MALFORMED, f"`members[{i}].report_sig` must be bytes")
        report = MemberReport(
            job=job,
            run=run,
            interval=interval,
            member=entry["member"],
            checkpoint=check_link(f"members[{i}].checkpoint", entry["checkpoint"]),
            score=entry["score"],
            hparams=_hparams_from_node(f"members[{i}].hparams", entry["hparams"]),
            sent_at=entry["sent_at"],
        )
        members.append(RecordMember(report, rsig))
    for i, entry in enumerate(_list("failed", node["failed"])):
        entry = exact_keys(f"failed[{i}]", entry, _FAILED_KEYS, frozenset({"checkpoint"}))
        text = entry.get("checkpoint")
        if text is not None:
            try:
                CID.parse(check_text(f"failed[{i}].checkpoint", text))
            except CIDError as exc:
                raise MessageError(Reason.MALFORMED, f"`failed[{i}].checkpoint`: {exc}") from None
        failed.append(
            MemberFailure(
                check_did(f"failed[{i}].member", entry["member"]),
                check_text(f"failed[{i}].reason", entry["reason"]),
                text,
            )
        )
    for i, entry in enumerate(_list("copies", node["copies"])):
        entry = exact_keys(f"copies[{i}]", entry, _COPY_KEYS)
        copies.append(
            Copy(
                check_did(f"copies[{i}].member", entry["member"]),
                check_did(f"copies[{i}].source", entry["source"]),
                check_link(f"copies[{i}].checkpoint", entry["checkpoint"]),
                _hparams_from_node(f"copies[{i}].hparams", entry["hparams"]),
            )
        )
    prev = node["prev"]
    rec = PopulationRecord(
        job=job,
        run=run,
        interval=interval,
        seed=node["seed"],
        params=params_from_node(node["params"]),
        members=tuple(members),
        failed=tuple(failed),
        copies=tuple(copies),
        prev=None if prev is None else check_link("prev", prev),
        controller=node["controller"],
    )
    check_signed(node, _unsigned_node(rec), rec.controller, sig, _WHAT)
    return rec


def _list(name: str, value: object) -> list[Any]:
    if not isinstance(value, list):
        raise MessageError(Reason.MALFORMED, f"`{name}` must be an array")
    return value


def member_reports_signed(rec: PopulationRecord) -> list[str]:
    """The members whose report signature in ``rec`` is not theirs (empty when all are)."""
    return [m.report.member for m in rec.members if not report_signed(m.report, m.report_sig)]


def as_hparams(value: Mapping[str, HValue]) -> dict[str, HValue]:
    """A plain dict of hyperparameters sorted by name (the order records and reports use)."""
    return dict(sorted(value.items()))
