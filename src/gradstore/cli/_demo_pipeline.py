"""``gradstore demo --mode model-parallel``: the demo's MLP in two stages (fc1, then fc2 and
the loss), each held by ``--peers`` replicas, micro-batches flowing between them as
documents; prints each round with the pipeline's bubble, and the audit command."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from . import _exit
from ._demo_audit import audit_line

if TYPE_CHECKING:
    from ..demo._pipeline import PipelineDemoResult, PipelineRow


def _row(row: PipelineRow) -> str:
    return (
        f"round {row.round:3d}: loss {row.loss:.4f}, held-out accuracy {row.accuracy:.2%}, "
        f"{row.seconds:.2f} s, bubble {row.bubble_s:.2f} s ({row.bubble_fraction:.0%} of the "
        "replicas' micro-batch time)"
    )


def _stage_line(result: PipelineDemoResult, reach: str | None) -> str | None:
    """The ``audit stage`` command of the first stage's replica 0, last round, micro-batch 0:
    the CIDs it recorded (no record holds them); None when the node goes with the demo."""
    from ..pipeline.layers import mlp_stages

    body = next((r for r in result.last.values() if r.outputs and 0 in r.outputs), None)
    if reach is None or body is None or body.params is None:
        return None
    return (
        f"audit a stage: gradstore audit stage {body.outputs[0]} --input {body.inputs[0]} "
        f"--params {body.params} --activation {mlp_stages()[0].activation} {reach}"
    )


async def pipeline_demo(args: argparse.Namespace) -> int:
    """Run the model-parallel demo; stdout gets the node, coordinator and job lines, a line
    per round (loss, accuracy, bubble), a closing line and the `audit history` command."""
    from ..demo import digits_split, open_demo_node
    from ..demo._pipeline import STAGES, PipelineDemoConfig, run_pipeline_demo

    cfg = PipelineDemoConfig(
        replicas=args.peers,
        rounds=args.rounds,
        seed=args.seed,
        hidden=args.hidden,
        **({} if args.lr is None else {"lr": args.lr}),
    )
    data = digits_split(cfg.replicas, cfg.seed)  # fails early without scikit-learn
    auth = args.api_auth or os.environ.get("GRADSTORE_API_AUTH")
    from ..messages import SigningKey

    coordinator = SigningKey.generate()
    async with open_demo_node(args.api, args.local, auth) as demo_node:
        print(f"node: {demo_node.description}", flush=True)
        print(f"coordinator: {coordinator.did}", flush=True)
        print(
            f"job: model-parallel mlp, stages {' -> '.join(STAGES)} x {cfg.replicas} replicas "
            f"({2 * cfg.replicas} peers), {len(data.shards[0])} samples per lane in "
            f"{cfg.micro_batches} micro-batches, {len(data.y_test)} held out, {cfg.rounds} "
            f"rounds, lr {cfg.lr}; each stage's gradients one step over its replicas",
            flush=True,
        )
        result = await run_pipeline_demo(
            cfg,
            demo_node.node,
            data,
            coordinator_key=coordinator,
            on_round=None if args.quiet else lambda r: print(_row(r), flush=True),
        )
        last = result.rows[-1]
        print(
            f"done: held-out accuracy {last.accuracy:.2%}, training loss {last.loss:.4f} after "
            f"{len(result.rows)} rounds; pipeline bubble {result.bubble_s:.2f} s "
            f"({result.bubble_fraction:.0%} of the replicas' micro-batch time); "
            f"head record {result.head}",
            flush=True,
        )
        stage = _stage_line(result, demo_node.reach)
        if stage is not None:
            print(stage, flush=True)
        print(audit_line(result.head, coordinator.did, demo_node.reach, demo_node.gone), flush=True)
    return _exit.SUCCESS
