"""Auditing a tree round (docs/design/multicoord.md, "The tree by peer groups"): every
group's partial record re-derived on its own, then the root's combination.

A ``gradstore/partial/1`` record gets a round/4 record's input checks (the peers' signed
announcements, each input fetched with every block verified, its codec and meta), and
``partial-output``: the group's exact partial sums of its inputs (docs/spec.md, section
9.5), encoded with the meta the leaf writes, must have the CID the record names. A leaf
that signed a partial that is not its inputs' sums fails there, named by its group.

A ``gradstore/tree/1`` record is audited group by group, and besides:

- ``group-owner``: each partial record is signed by the leaf the tree record names for
  its group; ``group-link``: it is that group's, of the same job, run, round and method,
  with the partial output the tree names;
- ``group-inputs``: no peer's input is in two groups;
- ``params``: the record's parameters are its method's over every input (weights, one per
  input, are the partial records' ones);
- ``output-cid``: the closed groups' partials combined (the divisor the method's over every
  input of the round, the output clipped by the record's bound) give the output the record
  names: the flat exact round's output.

With ``clip_input_norm`` a partial's inputs are clipped by their own norms (taken from the
fetched values, as the flat audit does) before they are summed: the leaf's arithmetic.

Memory: a partial is re-derived from its group's inputs held whole (O(group x model)).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..aggregate import (
    AggregationParams,
    InMemory,
    InputSource,
    Layout,
    Partial,
    aggregate_partials,
    compressed_source,
    global_norm,
    input_scales,
    linear_terms,
    partial_sums,
)
from ..dag import CID, file_cid
from ..errors import AggregationError, AuditError, MessageError, Reason
from ..format import CompressedGradient, Gradient, encode
from ..messages import (
    PartialRecord,
    TreeRecord,
    aggregate_meta,
    check_partial_of,
    decode_partial_record,
    record_partial_meta,
)
from ..store import ByteProgress, GradientStore
from ._checks import check_document_meta, check_signatures
from ._cid import fetch_with_header
from ._records import fetch_with


@dataclass(frozen=True)
class PartialReport:
    """A group's partial record re-derived: its inputs, their bytes, the partial sums
    recomputed (what the root combines) and the tensors they stand for."""

    record_cid: CID
    record: PartialRecord
    inputs: int
    input_bytes: int
    partial: Partial
    layout: Layout
    seconds: float


@dataclass(frozen=True)
class TreeRoundReport:
    """A tree round: every closed group's partial re-derived (job order) and their
    combination compared with the output. ``failed``: (group, reason) of the failed ones."""

    record_cid: CID
    record: TreeRecord
    groups: tuple[PartialReport, ...]
    failed: tuple[tuple[str, str], ...]
    seconds: float

    @property
    def round(self) -> int:
        return self.record.round

    @property
    def inputs(self) -> int:
        return sum(g.inputs for g in self.groups)

    @property
    def input_bytes(self) -> int:
        return sum(g.input_bytes for g in self.groups)


def _where(rcid: CID, record: PartialRecord) -> str:
    return f"group {record.group!r} of round {record.round} (partial record {rcid})"


def _params(method: str, params: dict[str, Any], round_: int) -> AggregationParams:
    try:
        return AggregationParams.from_record(method, params, "sequential", "float64")
    except (AggregationError, TypeError) as exc:
        raise AuditError("params", f"round {round_}: recorded parameters: {exc}") from exc


async def _flat(gradient: Gradient | CompressedGradient, layout: Layout) -> dict[str, Any]:
    source: InputSource = (
        compressed_source(gradient)
        if isinstance(gradient, CompressedGradient)
        else InMemory(gradient.tensors)
    )
    return {name: np.array(await source.read(name, 0, layout.size(name))) for name in layout.names}


async def verify_partial(
    store: GradientStore,
    rcid: CID,
    record: PartialRecord,
    *,
    progress: ByteProgress | None = None,
) -> PartialReport:
    """Re-derive an already checked partial record (see the module docstring). Checks:
    ``params``, ``aggregate``, ``input-signature``, ``input-fetch``, ``input-blocks``,
    ``input-decode``, ``input-codec``, ``input-samples``, ``input-meta``, ``input-weight``,
    ``partial-output``."""
    start = time.perf_counter()
    params = _params(record.method, record.params, record.round)
    samples = [i.num_samples for i in record.inputs]
    try:
        coefs, _ = linear_terms(params, samples)
    except AggregationError as exc:
        raise AuditError("aggregate", f"{_where(rcid, record)}: {exc}") from exc
    check_signatures(rcid, record)
    flats = []
    layout: Layout | None = None
    dtypes: dict[str, str] = {}
    nbytes = 0
    for inp in record.inputs:
        what = f"input of {inp.peer}"
        gradient, header = await fetch_with_header(
            store, inp.gradient, what, prefix="input-", progress=progress
        )
        if inp.codec != header.codec:
            raise AuditError(
                "input-codec", f"{_where(rcid, record)}: the codec of {what} is not the record's"
            )
        check_document_meta(rcid, record, inp, gradient.meta)
        this = Layout.of((t.name, t.array_dtype, t.shape) for t in header.tensors)
        if layout is None:
            layout, dtypes = this, {t.name: t.dtype for t in header.tensors}
        elif this != layout:
            raise AuditError("aggregate", f"{_where(rcid, record)}: the inputs' tensors differ")
        flats.append(await _flat(gradient, layout))
        nbytes += gradient.nbytes
        del gradient
    assert layout is not None  # a partial record lists at least one input
    weights = [1.0] * len(samples) if coefs is None else list(coefs)
    for inp, want in zip(record.inputs, weights, strict=True):
        if inp.weight != want:
            raise AuditError(
                "input-weight",
                f"{_where(rcid, record)}: the input of {inp.peer} is recorded with weight "
                f"{inp.weight!r}, its coefficient is {want!r}",
            )
    try:
        if params.clip_input_norm is not None:  # each input by its own norm, as the leaf
            norms = [global_norm(flat, params.norm_sum) for flat in flats]
            scales = input_scales(norms, params.clip_input_norm)
            coefs, _ = linear_terms(params, samples, scales)
        partial = partial_sums(flats, layout, coefs)
    except AggregationError as exc:
        raise AuditError("aggregate", f"{_where(rcid, record)}: {exc}") from exc
    del flats
    expected = file_cid(encode(Gradient(partial, record_partial_meta(record, dtypes))))
    if expected != record.output.to_v1():
        raise AuditError(
            "partial-output",
            f"{_where(rcid, record)}, signed by {record.coordinator}, names partial "
            f"{record.output}, but the exact partial sums of its {len(record.inputs)} inputs "
            f"give {expected}",
        )
    return PartialReport(
        rcid, record, len(record.inputs), nbytes, partial, layout, time.perf_counter() - start
    )


async def fetch_partial_record(
    store: GradientStore, cid: CID, group: str
) -> tuple[CID, PartialRecord]:
    """Fetch the partial record a tree record links for ``group`` (the record-* checks)."""
    return await fetch_with(
        store.node,
        cid,
        f"partial record of group {group!r}",
        lambda data, c: decode_partial_record(data, cid=c),
    )


async def verify_tree_record(
    store: GradientStore,
    rcid: CID,
    record: TreeRecord,
    *,
    progress: ByteProgress | None = None,
) -> TreeRoundReport:
    """Audit an already checked tree record: each closed group's partial record (fetched,
    linked, re-derived) and the combined output (see the module docstring)."""
    start = time.perf_counter()
    reports: list[PartialReport] = []
    failed = []
    seen: dict[str, str] = {}
    for entry in record.groups:
        if entry.record is None:
            failed.append((entry.group, entry.failed or ""))
            continue
        pcid, partial = await fetch_partial_record(store, entry.record, entry.group)
        try:
            check_partial_of(record, entry, pcid, partial)
        except MessageError as exc:
            check = "group-owner" if exc.code is Reason.NOT_COORDINATOR else "group-link"
            raise AuditError(check, f"round {record.round} record {rcid}: {exc}") from exc
        if partial.method != record.method:
            raise AuditError(
                "group-link",
                f"round {record.round} record {rcid}: group {entry.group!r} aggregated with "
                f"{partial.method}, the round with {record.method}",
            )
        for inp in partial.inputs:
            if inp.peer in seen:
                raise AuditError(
                    "group-inputs",
                    f"round {record.round} record {rcid}: {inp.peer}'s input is in groups "
                    f"{seen[inp.peer]!r} and {entry.group!r}",
                )
            seen[inp.peer] = entry.group
        reports.append(await verify_partial(store, pcid, partial, progress=progress))
    if any(r.layout != reports[0].layout for r in reports):
        raise AuditError("aggregate", f"round {record.round}: the groups' tensors differ")
    inputs = sorted((i for r in reports for i in r.record.inputs), key=lambda i: i.peer)
    params = _params(record.method, record.params, record.round)
    try:
        coefs, _ = linear_terms(params, [i.num_samples for i in inputs])
    except AggregationError as exc:
        raise AuditError("params", f"round {record.round} record {rcid}: {exc}") from exc
    if coefs is not None and list(coefs) != [i.weight for i in inputs]:
        raise AuditError(
            "params",
            f"round {record.round} record {rcid}: its parameters' coefficients are not the "
            "groups' inputs' weights",
        )
    try:
        tensors, _ = aggregate_partials(
            [r.partial for r in reports], reports[0].layout, params, [i.num_samples for i in inputs]
        )
    except AggregationError as exc:
        raise AuditError("aggregate", f"round {record.round}: combining: {exc}") from exc
    meta = aggregate_meta(
        record.job, record.round, record.method, [i.gradient for i in inputs], run=record.run
    )
    expected = file_cid(encode(Gradient(tensors, meta)))
    if expected != record.output.to_v1():
        raise AuditError(
            "output-cid",
            f"round {record.round} record {rcid} names output {record.output}, but its "
            f"{len(reports)} groups' partials combine to {expected}",
        )
    return TreeRoundReport(rcid, record, tuple(reports), tuple(failed), time.perf_counter() - start)
