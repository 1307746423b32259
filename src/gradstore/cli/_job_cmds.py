"""Job subcommands: keygen, coordinator, peer publish/await, aggregate (offline), round show."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..aggregate import METHODS, AggregationParams, aggregate
from ..coordinator import Coordinator, Journal, RoundOutcome, format_outcome
from ..dag import CID
from ..errors import AggregationError, CoordinatorError
from ..format import Gradient
from ..job import load_job
from ..messages import SigningKey, decode_record
from ..peer import Peer
from . import _exit
from ._nodes import add_node_options, node_from_args
from ._tensor_files import load_gradient, save_gradient

T = TypeVar("T")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keygen", help="create an Ed25519 identity (file mode 0600); prints its did:key"
    )
    p.add_argument("--out", required=True, help="key file to create (never overwritten)")
    p.set_defaults(run=cmd_keygen)

    p = sub.add_parser("coordinator", help="run a job's coordinator until its rounds are done")
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--key", required=True, help="the coordinator's key file")
    p.add_argument(
        "--state", default=None, help="journal folder (default: ./gradstore-state/<job>)"
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="log announcements (-vv: debug)"
    )
    add_node_options(p)
    p.set_defaults(run=cmd_coordinator)

    peer = sub.add_parser("peer", help="act as one of a job's peers")
    psub = peer.add_subparsers(dest="peer_command", metavar="ACTION", required=True)
    p = psub.add_parser(
        "publish", help="store a gradient, announce it, wait for the coordinator's ack"
    )
    p.add_argument("gradient", help="gradient as .npz or .safetensors")
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--key", required=True, help="this peer's key file")
    p.add_argument("--round", type=int, required=True)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--no-wait", action="store_true", help="return after the first announcement")
    p.add_argument("--timeout", type=float, default=None, help="give up after S seconds")
    add_node_options(p)
    p.set_defaults(run=cmd_peer_publish)

    p = psub.add_parser("await", help="wait for a round's result, verify and save the aggregate")
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--round", type=int, required=True)
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write: .safetensors by its extension, else .npz",
    )
    p.add_argument("--timeout", type=float, default=None, help="give up after S seconds")
    add_node_options(p)
    p.set_defaults(run=cmd_peer_await)

    p = sub.add_parser(
        "aggregate",
        help="aggregate .npz/.safetensors gradients offline with the coordinator's code",
        epilog="sum/mean/fedavg/weighted over large float32/float64 tensors run a numba-compiled "
        "kernel that gives the NumPy path's exact bits; GRADSTORE_NUMBA=0 turns it off.",
    )
    p.add_argument(
        "inputs", nargs="*", help="gradients as .npz or .safetensors, in canonical order"
    )
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--method", required=True, choices=METHODS)
    # nargs="+" lists swallow the inputs that follow them (`--num-samples 10 20 a.npz b.npz`):
    # they take strings, and _split_lists gives the non-numeric tail back to the inputs.
    p.add_argument("--num-samples", nargs="+", default=None, metavar="N", help="one per input")
    p.add_argument("--weights", nargs="+", default=None, metavar="W", help="one per input")
    p.add_argument("--trim-ratio", type=float, default=None)
    p.add_argument("--byzantine", type=int, default=None)
    p.add_argument("--select", type=int, default=None)
    p.add_argument("--clip-input-norm", type=float, default=None)
    p.add_argument("--clip-output-norm", type=float, default=None)
    p.set_defaults(run=cmd_aggregate)

    rnd = sub.add_parser("round", help="inspect round records")
    rsub = rnd.add_subparsers(dest="round_command", metavar="ACTION", required=True)
    p = rsub.add_parser("show", help="a round record as JSON, with each peer's status")
    p.add_argument("record", help="round record CID")
    p.add_argument(
        "--state",
        default=None,
        help="the coordinator's journal folder: adds the round's stats (seconds per stage, bytes)",
    )
    add_node_options(p)
    p.set_defaults(run=cmd_round_show)


def cmd_keygen(args: argparse.Namespace) -> int:
    key = SigningKey.generate()
    key.save(args.out)
    print(key.did)
    return _exit.SUCCESS


def cmd_coordinator(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    key = SigningKey.load(args.key)
    level = (
        logging.WARNING
        if args.verbose == 0
        else logging.INFO
        if args.verbose == 1
        else logging.DEBUG
    )
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    state = Path(args.state) if args.state else Path("gradstore-state") / config.job

    def report(outcome: RoundOutcome) -> None:
        print(format_outcome(outcome), flush=True)

    async def run() -> bool:
        """True once every round of the job is done (now or in an earlier run)."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        node = node_from_args(args)
        try:
            ident = await node.identity()
            print(
                f"coordinator {key.did} for job {config.job} on {node.name} ({ident.peer_id})",
                file=sys.stderr,
                flush=True,
            )
            coordinator = Coordinator(config, key, node, state, on_round=report)
            await coordinator.run(stop)
            return config.rounds.count > 0 and coordinator.round >= config.rounds.count
        finally:
            await node.aclose()

    if not asyncio.run(run()):
        # stopped by a signal: the journal keeps the open round for a restart
        return _exit.INTERRUPTED
    return _exit.SUCCESS


def cmd_peer_publish(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    key = SigningKey.load(args.key)
    gradient = load_gradient(args.gradient)

    async def run() -> CID:
        node = node_from_args(args)
        try:
            async with Peer(config, node, key) as peer:
                return await peer.publish(
                    gradient,
                    args.round,
                    args.num_samples,
                    wait=not args.no_wait,
                    timeout=args.timeout,
                )
        finally:
            await node.aclose()

    print(asyncio.run(run()))
    return _exit.SUCCESS


def cmd_peer_await(args: argparse.Namespace) -> int:
    config = load_job(args.config)

    async def run() -> Any:
        node = node_from_args(args)
        try:
            # awaiting needs no key: results are verified against the job's coordinator
            async with Peer(config, node) as peer:
                return await peer.await_result(args.round, timeout=args.timeout)
        finally:
            await node.aclose()

    result = asyncio.run(run())
    save_gradient(args.output, result.gradient)
    print(f"{result.cid} {result.record}")
    return _exit.SUCCESS


def _leading_numbers(
    tokens: list[str] | None, kind: Callable[[str], T], option: str
) -> tuple[list[T] | None, list[str]]:
    """Split ``tokens`` into the numbers at its head and the rest (input paths)."""
    if tokens is None:
        return None, []
    numbers: list[T] = []
    for i, token in enumerate(tokens):
        try:
            numbers.append(kind(token))
        except ValueError:
            if not numbers:
                raise AggregationError(f"{option} expects numbers, got {token!r}") from None
            return numbers, tokens[i:]
    return numbers, []


def cmd_aggregate(args: argparse.Namespace) -> int:
    num_samples, rest_n = _leading_numbers(args.num_samples, int, "--num-samples")
    weights, rest_w = _leading_numbers(args.weights, float, "--weights")
    if rest_n and rest_w:  # their order on the command line is lost; the input order matters
        raise AggregationError("give the input files before --num-samples and --weights")
    inputs = [*args.inputs, *rest_n, *rest_w]
    if not inputs:
        raise AggregationError("no input files given")
    gradients = [load_gradient(path) for path in inputs]
    params = AggregationParams(
        method=args.method,
        weights=tuple(weights) if weights else None,
        trim_ratio=args.trim_ratio,
        byzantine=args.byzantine,
        select=args.select,
        clip_input_norm=args.clip_input_norm,
        clip_output_norm=args.clip_output_norm,
    )
    result = aggregate([g.tensors for g in gradients], params, num_samples)
    save_gradient(args.output, Gradient(result))
    print(args.output)
    return _exit.SUCCESS


def _journal_stats(state: Path, job: str, round_: int, record: str) -> dict[str, Any]:
    """The round's stats as the coordinator journaled them; refuses another job's journal."""
    path = state / "journal.sqlite"
    if not path.is_file():
        raise CoordinatorError(f"no coordinator journal at {path}")
    with Journal(path) as journal:
        if journal.get_meta("job") not in (None, job):
            raise CoordinatorError(f"{path} is the journal of another job")
        row = next((r for r in journal.rounds() if r.round == round_), None)
        if row is None or row.record != record:
            raise CoordinatorError(f"{path} has no closed round {round_} with record {record}")
        return journal.stats(round_) or {}


def cmd_round_show(args: argparse.Namespace) -> int:
    cid = CID.parse(args.record)

    async def run() -> bytes:
        node = node_from_args(args)
        try:
            return await node.get_block(cid)
        finally:
            await node.aclose()

    record = decode_record(asyncio.run(run()), cid=cid)
    doc = {
        "record": str(cid),
        "type": "gradstore/round/1",
        "job": record.job,
        "round": record.round,
        "method": record.method,
        "params": record.params,
        "coordinator": record.coordinator,
        "output": str(record.output),
        "prev": None if record.prev is None else str(record.prev),
        "peers": [
            {
                "peer": i.peer,
                "status": "aggregated",
                "gradient": str(i.gradient),
                "num_samples": i.num_samples,
                "weight": i.weight,
            }
            for i in record.inputs
        ]
        + [
            {
                "peer": e.peer,
                "status": "excluded",
                "reason": e.reason,
                "gradient": None if e.cid is None else str(e.cid),
            }
            for e in record.excluded
        ],
        "counts": {
            "expected": len(record.inputs) + len(record.excluded),
            "aggregated": len(record.inputs),
            "absent": sum(e.reason.startswith("absent") for e in record.excluded),
            "failed": sum(not e.reason.startswith("absent") for e in record.excluded),
        },
    }
    if args.state:
        doc["stats"] = _journal_stats(Path(args.state), record.job, record.round, str(cid))
    print(json.dumps(doc, indent=2))
    return _exit.SUCCESS
