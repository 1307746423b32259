"""``gradstore demo --mode population``: 8 members, population-based training over one node,
against the same members with their initial hyperparameters fixed."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import _exit
from ._demo_audit import audit_line
from ._text import printable

if TYPE_CHECKING:
    from ..demo._population import IntervalRow


def _hp(hparams: Mapping[str, object]) -> str:
    return ", ".join(
        f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in hparams.items()
    )


def _row(row: IntervalRow) -> str:
    copies = ", ".join(f"{m[-6:]}<-{s[-6:]} ({_hp(h)})" for m, s, h in row.copies) or "none"
    return printable(
        f"interval {row.interval}: best {row.best[-6:]} validation {row.best_score:.2%} "
        f"({_hp(row.best_hparams)}); copies {copies}"
    )


async def population_demo(args: argparse.Namespace) -> int:
    """Run the population demo; stdout gets the node, controller and job lines, a line per
    interval, the comparison with the fixed baseline and the audit command."""
    from ..demo import digits_split, open_demo_node
    from ..demo._population import PopulationDemoConfig, run_population_demo
    from ..messages import SigningKey

    cfg = PopulationDemoConfig(seed=args.seed, hidden=args.hidden)
    data = digits_split(1, cfg.seed)  # fails early without scikit-learn
    auth = args.api_auth or os.environ.get("GRADSTORE_API_AUTH")
    controller = SigningKey.generate()
    async with open_demo_node(args.api, args.local, auth) as demo_node:
        print(f"node: {demo_node.description}", flush=True)
        print(f"coordinator: {controller.did}", flush=True)
        print(
            f"job: population of {cfg.members} mlp members, {cfg.intervals} intervals x "
            f"{cfg.interval_steps} steps (batch {cfg.batch_size}), lr and weight decay "
            "explored; scored on validation rows, reported on held-out rows",
            flush=True,
        )
        result = await run_population_demo(
            cfg,
            demo_node.node,
            data,
            controller_key=controller,
            on_interval=None if args.quiet else lambda r: print(_row(r), flush=True),
        )
        print(
            f"done: population-based training {result.pbt_accuracy:.2%} held-out accuracy "
            f"(best member {result.best[-6:]}, {_hp(result.best_hparams)}) vs "
            f"{result.fixed_median:.2%} for the median of the same {cfg.members} members with "
            f"their initial hyperparameters fixed (best of them {result.fixed_best:.2%}), "
            f"{cfg.budget} steps each; head record {result.head}",
            flush=True,
        )
        line = audit_line(
            result.head, controller.did, demo_node.reach, demo_node.gone, command="population"
        )
        print(line, flush=True)
    return _exit.SUCCESS
