"""What the root of a tree round decides (docs/design/multicoord.md, "The tree by peer
groups"): pure, no I/O.

The root takes a group's part on its leaf's signed result only once the partial record it
names is checked (``check_remote_partial``: signed by the group's leaf, of the job, run,
round and group, every input one of the group's peers carrying its signed announcement);
a group whose leaf says it failed fails with the leaf's reason; a group not heard by the
round's deadline plus the close retries fails naming its leaf (``TreeRound.due``). Once
every group is over, the closed groups' partials are combined (``TreeRound.plan``): the
first closed group in the job's order sets the tensors, a group whose partial holds others
fails, and the method (its divisor, its output clipping) is over every input of the round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..aggregate import AggregationParams, Layout, check_partial_tensors, linear_terms
from ..dag import CID
from ..errors import AggregationError, MessageError, Reason, reason_text
from ..format import numpy_dtype
from ..job import GroupConfig, JobConfig
from ..messages import PartialRecord, RecordInput, Result, TreeGroup

__all__ = [
    "GroupPart",
    "TreePlan",
    "TreeRound",
    "check_remote_partial",
    "checked_part",
    "partial_layout",
]


def check_remote_partial(
    result: Result, cid: CID, record: PartialRecord, *, group: GroupConfig, job: str, run: str
) -> None:
    """MessageError unless ``record`` (fetched by ``cid``, the record the leaf's ``result``
    names) is ``group``'s part as its leaf signs it for ``job``, ``run`` and the result's
    round, with the result's output, and every input one of the group's peers that signed
    its announcement."""
    where = f"group {group.name!r}'s partial record {cid}"
    if record.coordinator != group.coordinator:
        raise MessageError(
            Reason.NOT_COORDINATOR,
            f"{where} is signed by {record.coordinator}, not by the group's leaf "
            f"{group.coordinator}",
        )
    said = (job, run, result.round, group.name)
    got = (record.job, record.run, record.round, record.group)
    if got != said:
        raise MessageError(
            Reason.MALFORMED,
            f"{where} is job {got[0]!r} run {got[1]} round {got[2]} group {got[3]!r}, the "
            f"result says job {job!r} run {run} round {result.round} group {group.name!r}",
        )
    if record.output.to_v1() != CID.parse(result.cid).to_v1():
        raise MessageError(
            Reason.MALFORMED, f"{where}'s output is {record.output}, the result says {result.cid}"
        )
    members = set(group.peers)
    for inp in record.inputs:
        if inp.peer not in members:
            raise MessageError(
                Reason.UNKNOWN_PEER, f"{where} lists an input of {inp.peer}, not in the group"
            )
        if not inp.peer_signed(record):
            raise MessageError(
                Reason.BAD_SIGNATURE, f"{where}: the input of {inp.peer} is not what it signed"
            )


def partial_layout(tensors: Mapping[str, np.ndarray[Any, Any]], meta: Mapping[str, Any]) -> Layout:
    """The round's tensors a partial document stands for: each tensor's shape without its
    leading (components) axis, its dtype the ``dtypes`` its meta names (AggregationError:
    missing or unknown)."""
    dtypes = meta.get("dtypes")
    if not isinstance(dtypes, Mapping) or sorted(dtypes) != sorted(tensors):
        raise AggregationError("its meta's `dtypes` does not name each of its tensors")
    specs = []
    for name, array in tensors.items():
        dtype = numpy_dtype(dtypes[name]) if isinstance(dtypes[name], str) else None
        if dtype is None or array.ndim < 1:
            raise AggregationError(f"tensor {name!r}: no dtype or no components axis")
        specs.append((name, dtype, tuple(array.shape[1:])))
    return Layout.of(specs)


@dataclass(frozen=True)
class GroupPart:
    """A group's part of one round, as the root took it: its checked partial record and
    the partial's arrays (checked against ``layout``, the tensors it stands for)."""

    record: PartialRecord
    record_cid: CID
    partial: Mapping[str, np.ndarray[Any, Any]]
    layout: Layout


@dataclass(frozen=True)
class TreePlan:
    """How the root combines a round: the closed groups' parts (job order), the tensors,
    every input (sorted by peer), the method over them (``aggregation``) and the groups
    that failed at the combination (name -> reason)."""

    parts: tuple[tuple[str, GroupPart], ...]
    layout: Layout
    inputs: tuple[RecordInput, ...]
    aggregation: AggregationParams
    failed: dict[str, str]

    @property
    def samples(self) -> list[int]:
        """Every input's sample count, in record order."""
        return [i.num_samples for i in self.inputs]

    @property
    def divisor(self) -> float | None:
        """The method's divisor over every input of the round (fedavg: all their samples)."""
        return linear_terms(self.aggregation, self.samples)[1]

    @property
    def params(self) -> dict[str, Any]:
        """The method's parameters as the tree record states them."""
        return self.aggregation.to_record()


class TreeRound:
    """The root's book of one tree round: each group's part, or why it failed, and when
    the round's clock started (the first word of it heard from any leaf)."""

    def __init__(self, config: JobConfig, round_: int, grace_s: float) -> None:
        self.config = config
        self.round = round_
        self.grace_s = grace_s
        self.started_at: float | None = None
        self.parts: dict[str, GroupPart] = {}
        self.failed: dict[str, str] = {}

    def heard(self, now: float) -> None:
        """A leaf said something of this round: the round's clock starts (once)."""
        if self.started_at is None:
            self.started_at = now

    def wants(self, group: str) -> bool:
        """Whether ``group``'s part is still awaited."""
        return group not in self.parts and group not in self.failed

    def took(self, group: str, part: GroupPart) -> None:
        if self.wants(group):
            self.parts[group] = part

    def fail(self, group: str, reason: str) -> None:
        if self.wants(group):
            self.failed[group] = reason

    @property
    def done(self) -> bool:
        """Whether every group of the job is over (closed or failed)."""
        return all(not self.wants(g.name) for g in self.config.groups)

    def due(self, now: float) -> tuple[list[tuple[str, str]], float | None]:
        """The groups not heard by the round's deadline plus the close retries, each with
        the reason that names its leaf; and when to look again (None: not started)."""
        if self.started_at is None:
            return [], None
        at = self.started_at + self.config.rounds.deadline_s + self.grace_s
        if now < at:
            return [], at
        silent = [
            (
                g.name,
                reason_text(Reason.UNAVAILABLE, f"no result from its coordinator {g.coordinator}"),
            )
            for g in self.config.groups
            if self.wants(g.name)
        ]
        return silent, None

    def entries(self, failed: Mapping[str, str] | None = None) -> tuple[TreeGroup, ...]:
        """The tree record's groups, in the job's order (``failed``: more failures)."""
        out = []
        for g in self.config.groups:
            why = (failed or {}).get(g.name) or self.failed.get(g.name)
            part = self.parts.get(g.name)
            if why is not None or part is None:
                out.append(TreeGroup(g.name, g.coordinator, failed=why or "failed"))
            else:
                out.append(TreeGroup(g.name, g.coordinator, part.record_cid, part.record.output))
        return tuple(out)

    def plan(self) -> TreePlan | None:
        """How to combine the closed groups (None: none closed). A group whose partial holds
        other tensors than the first closed group's (job order) fails at the combination."""
        closed = [(g.name, self.parts[g.name]) for g in self.config.groups if g.name in self.parts]
        if not closed:
            return None
        first_name, first = closed[0]
        failed: dict[str, str] = {}
        kept = []
        for name, part in closed:
            if part.layout != first.layout:
                failed[name] = reason_text(
                    Reason.SCHEMA_MISMATCH,
                    f"its partial's tensors differ from group {first_name!r}'s",
                )
            else:
                kept.append((name, part))
        inputs = tuple(sorted((i for _, p in kept for i in p.record.inputs), key=lambda i: i.peer))
        params = self.config.aggregation.params_for([i.peer for i in inputs])
        return TreePlan(tuple(kept), first.layout, inputs, params, failed)


def checked_part(
    record: PartialRecord,
    record_cid: CID,
    tensors: Mapping[str, np.ndarray[Any, Any]],
    meta: Mapping[str, Any],
) -> GroupPart:
    """A fetched partial document taken as ``record``'s part: its tensors checked
    (``aggregate.check_partial_tensors``: finite, float64, bounded components), AggregationError
    otherwise."""
    layout = partial_layout(tensors, meta)
    check_partial_tensors(tensors, layout, f"group {record.group!r}'s partial {record.output}")
    return GroupPart(record, record_cid, tensors, layout)
