"""``gradstore audit population`` (re-derive a population's decisions, record by record) and
the population controller ``gradstore coordinator`` runs for a job with ``[population]``."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
from typing import TYPE_CHECKING

from ..audit import PopulationReport, verify_population
from ..messages import SigningKey
from . import _exit
from ._audit_cmds import _pins, _run
from ._nodes import node_from_args
from ._text import printable

if TYPE_CHECKING:
    from ..job import JobConfig
    from ..population.controller import IntervalResult


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


def _interval_line(result: IntervalResult) -> str:
    rec = result.record
    failed = "; ".join(f"{f.member[-8:]} {f.reason}" for f in rec.failed) or "none failed"
    copies = ", ".join(f"{c.member[-8:]}<-{c.source[-8:]}" for c in rec.copies) or "none"
    best = max((m.report for m in rec.members), key=lambda r: r.score, default=None)
    top = f", best {best.member[-8:]} score {best.score:.6g}" if best is not None else ""
    return printable(
        f"interval {rec.interval}: record {result.record_cid}, {len(rec.members)} ranked"
        f"{top}, {failed}, copies {copies}"
        + (f", {len(result.refused)} report(s) refused" if result.refused else "")
    )


def cmd_population_controller(args: argparse.Namespace, config: JobConfig) -> int:
    """``gradstore coordinator`` on a job with ``[population]``: run its every interval as the
    controller; stdout gets a line per interval and the audit command of the last record."""
    from ..population.service import PopulationController

    key = SigningKey.load(args.key)

    async def run() -> PopulationController:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        node = node_from_args(args)
        try:
            controller = PopulationController(
                config, key, node, on_interval=lambda r: print(_interval_line(r), flush=True)
            )
            print(
                f"population controller {key.did} for job {config.job}, run "
                f"{controller.run_id} on {node.name}",
                file=sys.stderr,
                flush=True,
            )
            await controller.run(stop)
            return controller
        finally:
            await node.aclose()

    controller = asyncio.run(run())
    pop = config.population
    assert pop is not None
    if len(controller.results) < pop.intervals:
        return _exit.INTERRUPTED
    print(
        printable(
            f"audit it: gradstore audit population {controller.head} --config "
            f"{shlex.quote(args.config)}"
        ),
        flush=True,
    )
    return _exit.SUCCESS
