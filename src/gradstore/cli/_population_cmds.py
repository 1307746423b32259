"""``gradstore audit population``: re-derive a population's decisions, record by record."""

from __future__ import annotations

import argparse

from ..audit import PopulationReport, verify_population
from . import _exit
from ._audit_cmds import _pins, _run
from ._text import printable


def _line(r: PopulationReport) -> str:
    rec = r.record
    copies = ", ".join(f"{c.member[-8:]}<-{c.source[-8:]}" for c in rec.copies) or "none"
    return printable(
        f"ok interval {rec.interval} of job {rec.job}: record {r.record_cid}, "
        f"{len(rec.members)} member reports signed, {len(rec.failed)} failed, "
        f"copies re-derived ({copies})"
    )


def cmd_audit_population(args: argparse.Namespace) -> int:
    """Verify a population record and every one before it; print one line per interval."""
    controller, job = _pins(args)
    reports = _run(
        args,
        f"the population of {args.head}",
        lambda node, store, progress: verify_population(
            node,
            args.head,
            controller=controller,
            job=job,
            on_interval=lambda r: print(_line(r), flush=True),
        ),
        args.head,
    )
    top = reports[0].record
    print(
        printable(
            f"ok population of job {top.job}: {len(reports)} decision(s), interval "
            f"{top.interval} down to 0, all by controller {top.controller}"
        )
    )
    return _exit.SUCCESS
