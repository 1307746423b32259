"""Job subcommands: keygen, peer publish/await, aggregate (offline), round show.

Their parsers are in ``_job_args``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..aggregate import AggregationParams, aggregate
from ..coordinator import Journal
from ..dag import CID
from ..errors import CoordinatorError, Reason
from ..files import load_gradient
from ..format import Gradient
from ..job import load_job
from ..messages import SigningKey, decode_record
from ..peer import Peer
from . import _exit
from ._exit import UsageError
from ._nodes import node_from_args
from ._output import announce_written, check_target, save_output
from ._patience import Patience

T = TypeVar("T")


def cmd_keygen(args: argparse.Namespace) -> int:
    key = SigningKey.generate()
    key.save(args.out)
    print(key.did)
    return _exit.SUCCESS


def cmd_peer_publish(args: argparse.Namespace) -> int:
    from ._compress_cmd import compressed_update, residual_next_to_key

    config = load_job(args.config)
    key = SigningKey.load(args.key)
    gradient = load_gradient(args.gradient)
    # --compress: the residual is replaced once the coordinator verified the input
    document, taken = compressed_update(
        args.compress,
        args.residual,
        gradient,
        default_residual=residual_next_to_key(args.key, config.job),
    )

    async def run() -> CID:
        node = node_from_args(args)
        try:
            async with Peer(config, node, key) as peer:
                return await peer.publish(
                    document,
                    args.round,
                    args.num_samples,
                    wait=not args.no_wait,
                    timeout=args.timeout,
                )
        finally:
            await node.aclose()

    cid = asyncio.run(run())
    taken()
    print(cid)
    return _exit.SUCCESS


def cmd_peer_await(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    check_target(args.output)  # before waiting for the round, not after

    async def run() -> Any:
        node = node_from_args(args)
        try:
            # awaiting needs no key: results are verified against the job's coordinator
            async with Peer(config, node) as peer:
                return await peer.await_result(args.round, timeout=args.timeout)
        finally:
            await node.aclose()

    result = asyncio.run(run())
    save_output(args.output, result.gradient)
    announce_written(args.output, f"{result.cid} {result.record}")
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
                raise UsageError(f"{option} expects numbers, got {token!r}") from None
            return numbers, tokens[i:]
    return numbers, []


def cmd_aggregate(args: argparse.Namespace) -> int:
    check_target(args.output)
    num_samples, rest_n = _leading_numbers(args.num_samples, int, "--num-samples")
    weights, rest_w = _leading_numbers(args.weights, float, "--weights")
    if rest_n and rest_w:  # their order on the command line is lost; the input order matters
        raise UsageError("give the input files before --num-samples and --weights")
    inputs = [*args.inputs, *rest_n, *rest_w]
    if not inputs:
        raise UsageError("no input files given")
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
    save_output(args.output, Gradient(result))
    announce_written(args.output)
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
        node = node_from_args(args, wait_s=args.timeout)
        try:
            patience = Patience(f"round record {cid} from {node.name}", args.timeout)
            return await patience.run(node.get_block(cid))
        finally:
            await node.aclose()

    record = decode_record(asyncio.run(run()), cid=cid)
    absent = sum(Reason.of(e.reason) is Reason.ABSENT for e in record.excluded)
    doc = {
        "record": str(cid),
        "type": record.type,
        "job": record.job,
        "run": record.run,
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
                **({"codec": i.codec.fields()} if i.codec else {}),
                **({} if i.sent_at is None else {"announced_at_ms": i.sent_at}),
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
            "absent": absent,
            "failed": len(record.excluded) - absent,
        },
    }
    if args.state:
        doc["stats"] = _journal_stats(Path(args.state), record.job, record.round, str(cid))
    print(json.dumps(doc, indent=2))
    return _exit.SUCCESS
