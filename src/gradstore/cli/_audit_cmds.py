"""``gradstore audit cid|round|history|stage``: the audit layer's checks as commands.

Each prints ``ok ...`` lines on stdout when every check holds; a failed check is an
``AuditError`` ("check NAME failed: ...") on the one ``error:`` line, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..audit import (
    AnyRoundReport,
    RoundReport,
    SteppedRoundReport,
    StepReport,
    TreeRoundReport,
    verify_cid,
    verify_history,
    verify_round,
)
from ..dag import CID
from ..errors import CIDError
from ..job import load_job
from ..messages import public_key_from_did
from ..node import Node
from ..store import GradientStore
from . import _exit
from ._documents import command_limits
from ._exit import UsageError
from ._nodes import node_from_args
from ._patience import Patience
from ._sources import StallReport
from ._text import printable

T = TypeVar("T")
Work = Callable[[Node, GradientStore, Callable[[int, int], None]], Awaitable[T]]


def _run(args: argparse.Namespace, what: str, work: Work[T], first: str) -> T:
    """``work(node, store, progress)`` on the chosen node, patiently (``--timeout``); a
    stall on ``first`` (the CID fetched first, as given) says why it lasts."""
    limits = command_limits(args)
    try:
        cid: CID | None = CID.parse(first)
    except CIDError:
        cid = None  # the audit's own check says so

    async def go() -> T:
        node = node_from_args(args, wait_s=args.timeout)
        try:
            stall = None if cid is None else (cid, StallReport(node))
            patience = Patience(f"{what} from {node.name}", args.timeout, fetching=stall)
            store = GradientStore(node, limits=limits)
            return await patience.run(work(node, store, patience.progress))
        finally:
            await node.aclose()

    return asyncio.run(go())


def _pins(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The coordinator (and job) the records must be: ``--coordinator``, or ``--config``'s."""
    if args.config:
        config = load_job(args.config)
        return config.coordinator, config.job
    if args.coordinator:
        try:
            public_key_from_did(args.coordinator)
        except ValueError as exc:
            raise UsageError(f"--coordinator: {exc}") from exc
        return args.coordinator, None
    return None, None


def _signed(coordinator: str | None) -> str:
    if coordinator is None:
        return "signed by the coordinator it names (not pinned: see --coordinator, --config)"
    return "signed by the expected coordinator"


def _round_line(r: RoundReport, coordinator: str | None) -> str:
    """One verified round; a record's job name is any text its signer chose: escaped."""
    rec = r.record
    return printable(
        f"ok round {rec.round} of job {rec.job}: record {r.record_cid} {_signed(coordinator)}, "
        f"{r.inputs} inputs re-fetched and verified ({r.input_bytes} tensor bytes), "
        f"{rec.method} recomputed, weights and output {rec.output} match" + _unsupported(r)
    )


def _step_line(r: StepReport) -> str:
    """One verified step of a stepped round (its job and step names escaped)."""
    rec = r.record
    return printable(
        f"ok step {rec.step} of round {rec.round} of job {rec.job}: step record {r.record_cid} "
        f"linked, {r.inputs} inputs re-fetched and verified ({r.input_bytes} tensor bytes), "
        f"{len(r.tensors)} tensor(s) as its selectors take, {rec.method} recomputed, weights and "
        f"output {rec.output} match"
    )


def _stepped_lines(r: SteppedRoundReport, coordinator: str | None) -> list[str]:
    """A verified stepped round: a line per closed step, one per failed step, the round's."""
    rec = r.record
    lines = [_step_line(s) for s in r.steps]
    lines += [
        printable(
            f"note: step {step} of round {rec.round} failed ({why}): it has no step record, "
            "and no tensor in the model-level output"
        )
        for step, why in r.failed
    ]
    lines.append(
        printable(
            f"ok round {rec.round} of job {rec.job}: record {r.record_cid} ({rec.type}) "
            f"{_signed(coordinator)}, {len(r.steps)} step(s) audited"
            f"{f' and {len(r.failed)} failed' if r.failed else ''}, model-level output "
            f"{rec.output} re-assembled from their outputs and matches"
        )
    )
    return lines


def _tree_lines(r: TreeRoundReport, coordinator: str | None) -> list[str]:
    """A verified tree round: a line per closed group, one per failed group, the round's."""
    rec = r.record
    lines = [
        printable(
            f"ok group {g.record.group} of round {rec.round} of job {rec.job}: partial record "
            f"{g.record_cid} signed by its leaf {g.record.coordinator}, {g.inputs} inputs "
            f"re-fetched and verified ({g.input_bytes} tensor bytes), exact partial sums "
            f"recomputed and partial {g.record.output} matches"
        )
        for g in r.groups
    ]
    lines += [
        printable(f"note: group {group} of round {rec.round} failed ({why}): not in the output")
        for group, why in r.failed
    ]
    lines.append(
        printable(
            f"ok round {rec.round} of job {rec.job}: record {r.record_cid} ({rec.type}) "
            f"{_signed(coordinator)}, {len(r.groups)} group(s) audited"
            f"{f' and {len(r.failed)} failed' if r.failed else ''}, their partials combined "
            f"({rec.method}) and output {rec.output} matches"
        )
    )
    return lines


def _lines(r: AnyRoundReport, coordinator: str | None) -> list[str]:
    if isinstance(r, SteppedRoundReport):
        return _stepped_lines(r, coordinator)
    if isinstance(r, TreeRoundReport):
        return _tree_lines(r, coordinator)
    return [_round_line(r, coordinator)]


def _unsupported(r: RoundReport) -> str:
    """What an older record cannot support, said on its line rather than passed over."""
    if not r.unsupported:
        return ""
    return (
        f" (a {r.record.type} record: no {', '.join(r.unsupported)} check; sample counts are "
        "checked against the input documents' meta only)"
    )


def cmd_audit_cid(args: argparse.Namespace) -> int:
    r = _run(
        args,
        f"CID {args.cid}",
        lambda node, store, progress: verify_cid(store, args.cid, progress=progress),
        args.cid,
    )
    print(
        f"ok {r.cid}: {r.size} bytes in {r.blocks} block(s), {r.tensors} tensor(s)"
        f"{f', kind {r.kind}' if r.kind else ''}; canonical {r.format}, CID re-derived"
    )
    return _exit.SUCCESS


def cmd_audit_round(args: argparse.Namespace) -> int:
    coordinator, job = _pins(args)
    report = _run(
        args,
        f"round record {args.record} and its inputs",
        lambda node, store, progress: verify_round(
            node, args.record, store, coordinator=coordinator, job=job, progress=progress
        ),
        args.record,
    )
    print("\n".join(_lines(report, coordinator)))
    return _exit.SUCCESS


def cmd_audit_history(args: argparse.Namespace) -> int:
    coordinator, job = _pins(args)
    reports = _run(
        args,
        f"the history of {args.head}",
        lambda node, store, progress: verify_history(
            node,
            args.head,
            allow_gaps=args.allow_gaps,
            store=store,
            on_round=lambda r: print("\n".join(_lines(r, coordinator)), flush=True),
            coordinator=coordinator,
            job=job,
            progress=progress,
        ),
        args.head,
    )
    top, bottom = reports[0].record, reports[-1].record
    print(
        printable(
            f"ok history of job {top.job}: {len(reports)} round(s), {top.round} down to "
            f"{bottom.round}, all by coordinator {top.coordinator}"
        )
    )
    return _exit.SUCCESS


def cmd_audit_stage(args: argparse.Namespace) -> int:
    """Re-execute a pipeline stage's forward pass; one ``ok`` line when it gives the output."""
    from ..pipeline.audit import verify_stage

    config = load_job(args.config) if args.config else None
    if args.tolerance is not None and not args.tolerance >= 0:
        raise UsageError(f"--tolerance must be >= 0, got {args.tolerance}")
    r = _run(
        args,
        f"stage output {args.output}, its input and parameters",
        lambda node, store, progress: verify_stage(
            store,
            args.activation,
            output_cid=CID.parse(args.output),
            input_cid=CID.parse(args.input),
            params_cid=CID.parse(args.params),
            config=config,
            tolerance=args.tolerance,
        ),
        args.output,
    )
    how = (
        "bit for bit"
        if r.audit.matches
        else f"within tolerance {args.tolerance:g} (activations differ by up to "
        f"{r.audit.max_abs_diff:.3g}; the CID re-derived is {r.audit.recomputed})"
    )
    source = "the job's rows" if r.first_stage else "the stage before's activation"
    print(
        printable(
            f"ok stage {r.stage} of round {r.round} of job {r.job}, micro-batch "
            f"{r.micro_batch}, peer {r.peer}: input {args.input} ({source}, {r.rows} rows) "
            f"and parameters {args.params} ({r.layer.layer}, {args.activation}) re-executed, "
            f"output {args.output} matches {how}"
            + ("" if config is not None else " (not pinned to a job file: see --config)")
        )
    )
    return _exit.SUCCESS
