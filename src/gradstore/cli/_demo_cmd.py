"""``gradstore demo``: train a digits classifier with N peers and a coordinator over one node."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Final

from . import _exit
from ._demo_audit import audit_line
from ._help import examples
from ._method_args import add_method_options
from ._nodes import add_node_options


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="train a digits classifier with N peers and a coordinator through the real store",
        description=(
            "Federated training on scikit-learn's digits data set: one coordinator and N peers "
            "over one node (the Kubo at --api if it answers, else one started from "
            "scripts/install-kubo.sh, else the embedded local node), every gradient stored, "
            "announced, verified and aggregated for real (--method: any job file method). It "
            "prints the coordinator's did and, at the end, the `gradstore audit history` "
            "command that re-derives every round. Needs the demo extra: "
            "pip install 'gradstore[demo]'."
        ),
        epilog=examples(
            "gradstore demo                                   # 4 peers, 20 rounds, federated",
            "gradstore demo --local demo-node --steps --compress topk:0.027,values=2bit",
            "gradstore demo --mode data-parallel --method median --plot demo.png",
        ),
    )
    p.add_argument("--peers", type=_positive_int, default=4, help="number of peers (default 4)")
    p.add_argument("--rounds", type=_positive_int, default=20, help="rounds to run (default 20)")
    p.add_argument(
        "--mode",
        choices=("federated", "data-parallel", "population", "model-parallel"),
        default="federated",
        help="federated: peers train locally and average model states (FedAvg); "
        "data-parallel: peers send gradients, one SGD step per round; population: 8 members "
        "explore lr and weight decay by population-based training, against the same members "
        "with fixed ones (takes --seed, --hidden and the node options); model-parallel: the "
        "mlp in two stages (fc1; fc2 and the loss), each held by --peers replicas, "
        "micro-batches flowing between them as documents, one SGD step per round (takes "
        "--peers, --rounds, --seed, --hidden, --lr and the node options) (default federated)",
    )
    p.add_argument(
        "--steps",
        action="store_true",
        help="make each round two steps, output layer first: head (the last layer, trained "
        "and sent by the first half of the peers) and body (the other layers, by every peer); "
        "the coordinator closes each on its own and a line per step shows it closing "
        "(mlp or cnn)",
    )
    p.add_argument(
        "--framework",
        choices=("numpy", "torch"),
        default="numpy",
        help="numpy: models written in NumPy; torch: a PyTorch CNN, its tensors converted "
        "with gradstore.torch (needs pip install 'gradstore[torch,demo]') (default numpy)",
    )
    p.add_argument(
        "--model",
        choices=("softmax", "mlp", "cnn"),
        default=None,
        help="numpy: mlp (default) or softmax; torch: cnn (default)",
    )
    p.add_argument(
        "--hidden",
        type=_positive_int,
        default=None,
        help="mlp: hidden units (default 64)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="data shuffle, initialisation and local SGD (default 0)"
    )
    p.add_argument(
        "--lr",
        type=_positive_float,
        default=None,
        help="learning rate (default 0.1 federated, 0.5 data-parallel)",
    )
    p.add_argument(
        "--local-epochs",
        type=_positive_int,
        default=2,
        help="federated: local epochs per round (default 2)",
    )
    p.add_argument(
        "--compress",
        metavar="SPEC",
        default=None,
        help="peers send compressed updates with error feedback: federated peers their model "
        "delta, data-parallel peers their gradient (e.g. topk:0.027,values=2bit, int8, bf16)",
    )
    add_method_options(
        p.add_argument_group("aggregation"),
        note="; every round aggregates every peer's input (weighted: weight 1 each), and a "
        "method that cannot work with --peers, or a parameter it does not take, is refused",
    )
    add_node_options(p, api_help="Kubo RPC endpoint to use if it answers")
    out = p.add_argument_group("output")
    out.add_argument("--plot", metavar="PNG", default=None, help="save loss and accuracy per round")
    out.add_argument("--summary-json", metavar="PATH", default=None, help="write a JSON summary")
    out.add_argument("--quiet", action="store_true", help="no per-round table or progress")
    p.set_defaults(run=cmd_demo)


#: The options a mode may ignore, with the values that mean "not given".
_UNSET: Final = {
    "peers": 4,
    "rounds": 20,
    "steps": False,
    "framework": "numpy",
    "model": None,
    "hidden": None,
    "lr": None,
    "local_epochs": 2,
    "compress": None,
    "method": "fedavg",
    "trim_ratio": None,
    "byzantine": None,
    "select": None,
    "clip_input_norm": None,
    "clip_output_norm": None,
    "plot": None,
    "summary_json": None,
}
_AGGREGATION: Final = ("method", "trim_ratio", "byzantine", "select")
_CLIPPING: Final = ("clip_input_norm", "clip_output_norm")
#: Per mode: the options it ignores (a silently ignored option would mislead), and what it
#: runs instead, for the refusal.
IGNORED_BY_MODE: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "population": (
        (
            "peers",
            "rounds",
            "steps",
            "framework",
            "model",
            "lr",
            "local_epochs",
            "compress",
            *_AGGREGATION,
            *_CLIPPING,
            "plot",
            "summary_json",
        ),
        "it runs 8 members for 8 intervals; it takes --seed, --hidden, --quiet and the node "
        "options",
    ),
    "model-parallel": (
        (
            "steps",
            "framework",
            "model",
            "local_epochs",
            "compress",
            *_AGGREGATION,
            *_CLIPPING,
            "plot",
            "summary_json",
        ),
        "it trains the mlp in two stages, each stage a step aggregated by fedavg over its "
        "replicas; it takes --peers, --rounds, --seed, --hidden, --lr, --quiet and the node "
        "options",
    ),
}


def mode_misuse(args: argparse.Namespace) -> list[str]:
    """The options given that ``args.mode`` would ignore (``IGNORED_BY_MODE``), as flags."""
    ignored, _ = IGNORED_BY_MODE.get(args.mode, ((), ""))
    return [
        "--" + name.replace("_", "-")
        for name in ignored
        if getattr(args, name, _UNSET[name]) != _UNSET[name]
    ]


def check_population_extras() -> None:
    """The population and model-parallel demos need the demo extra (scikit-learn) only."""
    from ..demo import check_demo_extras

    check_demo_extras("numpy", plot=False)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the demo; stdout gets the node, coordinator and job lines, the per-round table,
    a closing line and the audit command (exit 2 for a method the peers cannot run)."""
    import asyncio  # here: every command's start registers this parser, few run the demo

    if ignored := mode_misuse(args):
        print(
            f"error: --mode {args.mode} does not take {', '.join(ignored)} "
            f"({IGNORED_BY_MODE[args.mode][1]})",
            file=sys.stderr,
        )
        return _exit.USAGE
    if args.mode == "population":
        from ._demo_population import population_demo

        check_population_extras()
        return asyncio.run(population_demo(args))
    if args.mode == "model-parallel":
        from ._demo_pipeline import pipeline_demo

        check_population_extras()
        return asyncio.run(pipeline_demo(args))
    from ..demo import DemoConfig, check_demo_extras

    try:
        config = DemoConfig(
            peers=args.peers,
            rounds=args.rounds,
            mode=args.mode,
            model=args.model or ("cnn" if args.framework == "torch" else "mlp"),
            framework=args.framework,
            seed=args.seed,
            lr=args.lr,
            local_epochs=args.local_epochs,
            compress=args.compress,
            hidden=args.hidden,
            method=args.method,
            trim_ratio=args.trim_ratio,
            byzantine=args.byzantine,
            select=args.select,
            clip_input_norm=args.clip_input_norm,
            clip_output_norm=args.clip_output_norm,
            steps=args.steps,
        )
    except ValueError as exc:  # AggregationError too: a method the peers cannot run
        print(f"error: {exc}", file=sys.stderr)
        return _exit.USAGE
    check_demo_extras(config.framework, plot=args.plot is not None)  # every extra, named now
    return asyncio.run(_demo(args, config))


async def _demo(args: argparse.Namespace, config: Any) -> int:
    from ..demo import (
        DemoProgressBar,
        RoundRow,
        StepRow,
        digits_split,
        format_row,
        format_step,
        open_demo_node,
        plan_steps,
        run_demo,
        table_header,
        write_plot,
        write_summary,
    )
    from ..messages import SigningKey

    data = digits_split(config.peers, config.seed)  # fails early without scikit-learn
    quiet = bool(args.quiet)
    auth = args.api_auth or os.environ.get("GRADSTORE_API_AUTH")
    coordinator = SigningKey.generate()
    async with open_demo_node(args.api, args.local, auth) as demo_node:
        print(f"node: {demo_node.description}", flush=True)
        print(f"coordinator: {coordinator.did}", flush=True)
        shard = len(data.shards[0])
        print(
            f"job: {config.mode} {config.model}, {config.peers} peers x {shard} samples, "
            f"{len(data.y_test)} held out, {config.rounds} rounds, lr {config.learning_rate}, "
            f"aggregated with {config.method_text}"
            + (f", compressed with {config.compress}" if config.compress else ""),
            flush=True,
        )
        if config.steps:
            steps = "; ".join(s.describe() for s in plan_steps(config, data))
            print(f"steps: {steps} (each closes on its own)", flush=True)
        progress = DemoProgressBar(config.rounds, enabled=not quiet)
        if not quiet:
            print(table_header(), flush=True)

        def on_round(row: RoundRow) -> None:
            progress.clear()
            if not quiet:
                print(format_row(row), flush=True)

        def on_step(row: StepRow) -> None:
            progress.clear()
            if not quiet:
                print(format_step(row), flush=True)

        try:
            result = await run_demo(
                config,
                demo_node.node,
                data,
                node_name=demo_node.description,
                coordinator_key=coordinator,
                on_round=on_round,
                on_phase=progress.show,
                on_step=on_step,
            )
        finally:
            progress.clear()
        head = result.head_record
        last = result.rows[-1]
        print(
            f"done: held-out accuracy {last.accuracy:.2%}, training loss {last.loss:.4f} after "
            f"{len(result.rows)} rounds; head record {head}",
            flush=True,
        )
        print(audit_line(head, coordinator.did, demo_node.reach, demo_node.gone), flush=True)
    if args.plot:
        write_plot(
            result.rows,
            args.plot,
            f"gradstore demo: {config.mode} {config.model}, {config.peers} peers",
        )
    if args.summary_json:
        write_summary(result, args.summary_json)
    return _exit.SUCCESS
