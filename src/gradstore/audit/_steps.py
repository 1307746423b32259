"""verify_stepped: audit a stepped round (a round/5 record) step by step, and its model output.

Every step record the round record links is fetched and audited exactly as a round/4
record is (``_checks.rederive``: signatures, which here cover the step's name, codecs,
meta, weights, the output re-derived bit for bit), and besides:

- ``step-owner``: the step record is signed by the step's owner, the coordinator the round
  record names for it (its entry's ``coordinator``, else the record's own): in a round
  split among coordinators (docs/design/multicoord.md), a part signed by a coordinator
  that does not own its step fails here, whatever its signature;
- ``step-link``: the step record is the one the round links for its step, of the same job,
  run and round, with the output the round names for it;
- ``step-tensors``: every input document of a step, and so its output, holds exactly the
  tensors the step's selectors take, and no tensor is in two steps' outputs; a step record
  that lists another step's documents fails here (one announced for another step fails
  ``input-signature``);
- ``model-output``: the round's ``output`` is the model-level document assembled from the
  closed steps' outputs (docs/spec.md, section 9.4), its CID computed without storing it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..dag import CID
from ..errors import (
    AssemblyError,
    AuditError,
    DAGError,
    FormatError,
    IntegrityError,
    LimitExceededError,
    MessageError,
    NodeError,
)
from ..format import DocumentHeader
from ..job import Selector
from ..messages import (
    RecordInput,
    SteppedRoundRecord,
    StepRecord,
    check_step_of,
    record_model_meta,
)
from ..messages.step_record import PATTERN_SUFFIX
from ..store import ByteProgress, GradientStore, model_cid
from ._checks import rederive, where
from ._records import fetch_step_record


@dataclass(frozen=True)
class StepReport:
    """One step of a stepped round whose record, inputs and output were re-checked."""

    record_cid: CID
    record: StepRecord
    inputs: int
    input_bytes: int
    tensors: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class SteppedRoundReport:
    """A stepped round: every closed step re-checked (``steps``, in the record's order) and
    its model-level output re-assembled. ``failed``: (step, reason) of the failed steps."""

    record_cid: CID
    record: SteppedRoundRecord
    steps: tuple[StepReport, ...]
    failed: tuple[tuple[str, str], ...]
    seconds: float

    @property
    def round(self) -> int:
        return self.record.round

    @property
    def inputs(self) -> int:
        return sum(s.inputs for s in self.steps)

    @property
    def input_bytes(self) -> int:
        return sum(s.input_bytes for s in self.steps)


def selectors(record: StepRecord) -> tuple[Selector, ...]:
    """The step's selectors as the job reads them: ``prefix.*`` takes every name starting
    with ``prefix.``, any other selector the one name."""
    return tuple(
        Selector(s[:-1], pattern=True) if s.endswith(PATTERN_SUFFIX) else Selector(s)
        for s in record.tensors
    )


def check_step_tensors(rcid: CID, record: StepRecord, what: str, names: Sequence[str]) -> None:
    """``names`` (a document's tensors) must be exactly what the step's selectors take: each
    name taken by a selector, each selector taking a name. Checks: ``step-tensors``."""
    taken = selectors(record)
    at = f"{where(rcid, record)}: {what}"
    for name in names:
        if not any(s.matches(name) for s in taken):
            raise AuditError(
                "step-tensors",
                f"{at} holds tensor {name!r:.80}, which no selector of the step "
                f"({', '.join(record.tensors)}) takes",
            )
    for selector, text in zip(taken, record.tensors, strict=True):
        if not any(selector.matches(name) for name in names):
            raise AuditError(
                "step-tensors", f"{at} holds no tensor that the step's selector {text!r} takes"
            )


async def verify_step(
    store: GradientStore, rcid: CID, record: StepRecord, *, progress: ByteProgress | None = None
) -> StepReport:
    """Audit one (already fetched) step record: ``rederive``'s checks, and ``step-tensors``
    for every input document and the output."""
    start = time.perf_counter()

    def tensors_of(inp: RecordInput, header: DocumentHeader) -> None:
        names = [t.name for t in header.tensors]
        check_step_tensors(rcid, record, f"the input of {inp.peer} ({inp.gradient})", names)

    done = await rederive(store, rcid, record, on_input=tensors_of, progress=progress)
    check_step_tensors(rcid, record, f"its output {record.output}", done.tensors)
    return StepReport(
        rcid, record, done.inputs, done.input_bytes, done.tensors, time.perf_counter() - start
    )


def check_step_link(rcid: CID, record: SteppedRoundRecord, scid: CID, step: StepRecord) -> None:
    """The step record ``scid`` must be the one ``record`` links for its step, of the same
    job, run and round, signed by the step's owner, with the output the round names.
    Checks: ``step-owner``, ``step-link``."""
    entry = record.step_of(step.step)
    if entry is not None and step.coordinator != record.owner(entry):
        raise AuditError(
            "step-owner",
            f"round {record.round} record {rcid}: step {step.step!r}'s record {scid} is signed "
            f"by {step.coordinator}, but the step's owner is {record.owner(entry)}",
        )
    try:
        check_step_of(record, scid, step)
    except MessageError as exc:
        raise AuditError(
            "step-link", f"round {record.round} record {rcid} links step record {scid}: {exc}"
        ) from exc


async def check_model_output(
    store: GradientStore, rcid: CID, record: SteppedRoundRecord, steps: Sequence[StepReport]
) -> None:
    """The round's ``output`` must be the model-level document of its closed steps' outputs.

    Checks: ``step-tensors`` (a tensor in two steps' outputs), ``model-output`` (the
    assembly's CID differs, or the outputs cannot be assembled), ``output-fetch``,
    ``output-blocks`` (a step output cannot be read back)."""
    owner: dict[str, str] = {}
    for report in steps:
        for name in report.tensors:
            if name in owner:
                raise AuditError(
                    "step-tensors",
                    f"round {record.round} record {rcid}: tensor {name!r:.80} is in the "
                    f"outputs of steps {owner[name]!r} and {report.record.step!r}",
                )
            owner[name] = report.record.step
    outputs = [s.record.output for s in steps]
    try:
        expected = await model_cid(
            store.node, outputs, record_model_meta(record), limits=store.limits
        )
    except (AssemblyError, FormatError, LimitExceededError) as exc:
        raise AuditError(
            "model-output", f"round {record.round}: assembling the steps' outputs: {exc}"
        ) from exc
    except (IntegrityError, DAGError) as exc:
        raise AuditError("output-blocks", f"round {record.round}: a step output: {exc}") from exc
    except NodeError as exc:
        raise AuditError("output-fetch", f"round {record.round}: a step output: {exc}") from exc
    if expected != record.output.to_v1():
        raise AuditError(
            "model-output",
            f"round {record.round} record {rcid} names model-level output {record.output}, "
            f"but its {len(steps)} steps' outputs assemble to {expected}",
        )


async def verify_stepped_record(
    store: GradientStore,
    rcid: CID,
    record: SteppedRoundRecord,
    *,
    progress: ByteProgress | None = None,
) -> SteppedRoundReport:
    """Audit an already checked round/5 record: each closed step's record (fetched, linked,
    re-derived) and the model-level output (see the module docstring)."""
    start = time.perf_counter()
    reports = []
    failed = []
    for entry in record.steps:
        if entry.record is None:
            failed.append((entry.step, entry.failed or ""))
            continue
        scid, step = await fetch_step_record(store.node, entry.record, entry.step)
        check_step_link(rcid, record, scid, step)
        reports.append(await verify_step(store, scid, step, progress=progress))
    await check_model_output(store, rcid, record, reports)
    return SteppedRoundReport(
        rcid, record, tuple(reports), tuple(failed), time.perf_counter() - start
    )
