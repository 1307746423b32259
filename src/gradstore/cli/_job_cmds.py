"""Job subcommands: keygen, peer publish/await, aggregate (offline); round show is in
``_round_show``.

Their parsers are in ``_job_args``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ..aggregate import AggregationParams, aggregate
from ..errors import KeyFileError
from ..files import load_gradient
from ..format import Gradient
from ..job import load_job
from ..messages import SigningKey
from ..peer import Peer, PeerSteps
from . import _exit
from ._exit import UsageError
from ._nodes import node_from_args
from ._output import announce_written, check_target, save_output
from ._peer_wait import PeerWaitLines

T = TypeVar("T")


def cmd_keygen(args: argparse.Namespace) -> int:
    key = SigningKey.generate()
    try:
        key.save(args.out)
    except KeyFileError as exc:
        if not os.path.lexists(args.out):
            raise
        # never overwritten (an identity job files name), but say how to start over
        raise KeyFileError(
            f"{exc}: it is an identity that job files name; to start over with a new one, "
            "remove it first, or choose another --out"
        ) from None
    print(key.did)
    return _exit.SUCCESS


def cmd_peer_publish(args: argparse.Namespace) -> int:
    from ._compress_cmd import compressed_update, residual_next_to_key

    config = load_job(args.config)
    key = SigningKey.load(args.key)
    steps = PeerSteps(config, key.did)  # a key outside the job is refused here
    gradient = load_gradient(args.gradient)
    # what this peer sends, cut and checked before anything goes out: in a stepped job one
    # step (--step), or all of this peer's steps (the file's other tensors are left out)
    one = args.step is not None or not config.stepped
    mine = steps.cut(gradient, steps.check(args.step)) if one else steps.mine_of(gradient)
    # --compress: the residual is replaced once the coordinator verified the input
    document, taken = compressed_update(
        args.compress,
        args.residual,
        mine,
        default_residual=residual_next_to_key(args.key, config.job, args.step),
    )

    async def run() -> list[str]:
        node = node_from_args(args)
        try:
            async with Peer(config, node, key) as peer:
                lines = PeerWaitLines(peer, args.round, args.step, publishing=True)
                if one:
                    cid = await lines.run(
                        peer.publish(
                            document,
                            args.round,
                            args.num_samples,
                            step=args.step,
                            wait=not args.no_wait,
                            timeout=args.timeout,
                        )
                    )
                    return [str(cid)]
                cids = await lines.run(
                    peer.publish_steps(
                        document,
                        args.round,
                        args.num_samples,
                        wait=not args.no_wait,
                        timeout=args.timeout,
                    )
                )
                return [f"{step} {cid}" for step, cid in cids.items()]
        finally:
            await node.aclose()

    lines = asyncio.run(run())
    taken()
    print("\n".join(lines))
    return _exit.SUCCESS


def cmd_peer_await(args: argparse.Namespace) -> int:
    config = load_job(args.config)
    PeerSteps(config, None).known(args.step)  # before waiting for the round, not after
    check_target(args.output)

    async def run() -> Any:
        node = node_from_args(args)
        try:
            # awaiting needs no key: results are verified against the job's coordinator
            async with Peer(config, node) as peer:
                lines = PeerWaitLines(peer, args.round, args.step, publishing=False)
                return await lines.run(
                    peer.await_result(args.round, step=args.step, timeout=args.timeout)
                )
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
