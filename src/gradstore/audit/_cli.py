"""The command lines of scripts/verify_{cid,round,history}.py, callable in-process as ``main(argv)``.

Exit 0 when every check holds; 1 with ``<script>: check <name> failed: ...`` on
stderr otherwise; 2 for a wrong command line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence

from ..errors import AuditError, GradstoreError
from ..format import Limits
from ..node import KuboNode, LocalNode, Node
from ..store import GradientStore
from ._cid import verify_cid
from ._history import verify_history
from ._round import RoundReport, verify_round

DEFAULT_API = "http://127.0.0.1:5001"


def _parser(prog: str, description: str, target: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument(target)
    p.add_argument(
        "--api", default=None, help=f"Kubo RPC endpoint (env GRADSTORE_API, default {DEFAULT_API})"
    )
    p.add_argument(
        "--local", metavar="DIR", default=None, help="use the embedded node stored in DIR"
    )
    p.add_argument(
        "--api-auth", default=None, help="Authorization header for Kubo (env GRADSTORE_API_AUTH)"
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=Limits().max_bytes,
        help="largest gradient document to fetch (default 1 GiB)",
    )
    return p


def _node(args: argparse.Namespace) -> Node:
    if args.local:
        return LocalNode(args.local)
    api = args.api or os.environ.get("GRADSTORE_API") or DEFAULT_API
    return KuboNode(api, auth=args.api_auth or os.environ.get("GRADSTORE_API_AUTH"))


def _run(
    prog: str, args: argparse.Namespace, work: Callable[[Node, GradientStore], Awaitable[None]]
) -> int:
    async def go() -> None:
        node = _node(args)
        try:
            await work(node, GradientStore(node, limits=Limits(max_bytes=args.max_bytes)))
        finally:
            await node.aclose()

    try:
        asyncio.run(go())
    except AuditError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except (GradstoreError, OSError) as exc:  # e.g. a --local directory that cannot be created
        print(f"{prog}: check setup failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _round_line(r: RoundReport) -> str:
    rec = r.record
    return (
        f"ok round {rec.round} of job {rec.job}: record {r.record_cid} signed by its coordinator, "
        f"{r.inputs} inputs re-fetched and verified ({r.input_bytes} tensor bytes), "
        f"{rec.method} recomputed, output {rec.output} matches"
    )


def verify_cid_main(argv: Sequence[str] | None = None) -> int:
    """``verify_cid.py CID``: every block hash-checked, strict decode, re-encoding gives CID."""
    prog = "verify_cid"
    args = _parser(
        prog,
        "Fetch a gradient, check every block, decode strictly, re-encode and compare the CID.",
        "cid",
    ).parse_args(argv)

    async def work(node: Node, store: GradientStore) -> None:
        r = await verify_cid(store, args.cid)
        print(
            f"ok {r.cid}: {r.size} bytes in {r.blocks} block(s), {r.tensors} tensor(s)"
            f"{f', kind {r.kind}' if r.kind else ''}; canonical {r.format}, CID re-derived"
        )

    return _run(prog, args, work)


def verify_round_main(argv: Sequence[str] | None = None) -> int:
    """``verify_round.py RECORD_CID``: the record's signature, inputs and output CID."""
    prog = "verify_round"
    args = _parser(
        prog,
        "Check a round record's hash and signature, re-fetch every input, recompute the aggregate "
        "with the recorded method and parameters, and compare the output CID.",
        "record",
    ).parse_args(argv)

    async def work(node: Node, store: GradientStore) -> None:
        print(_round_line(await verify_round(node, args.record, store)))

    return _run(prog, args, work)


def verify_history_main(argv: Sequence[str] | None = None) -> int:
    """``verify_history.py HEAD_RECORD_CID``: every round along the ``prev`` links."""
    prog = "verify_history"
    p = _parser(
        prog,
        "Walk a job's round records through their prev links, verifying every round and that "
        "rounds go down by one with the same job and coordinator.",
        "head",
    )
    p.add_argument(
        "--allow-gaps",
        action="store_true",
        help="accept skipped round numbers (a failed round has no record)",
    )
    args = p.parse_args(argv)

    async def work(node: Node, store: GradientStore) -> None:
        reports = await verify_history(
            node,
            args.head,
            allow_gaps=args.allow_gaps,
            store=store,
            on_round=lambda r: print(_round_line(r), flush=True),
        )
        top, bottom = reports[0].record, reports[-1].record
        print(
            f"ok history of job {top.job}: {len(reports)} round(s), {top.round} down to "
            f"{bottom.round}, all by coordinator {top.coordinator}"
        )

    return _run(prog, args, work)
