"""``gradstore job init``: write a job file from key files (or did:keys), checked by ``load_job``.

Nobody should paste three 56-character ids by hand: each ``--coordinator``/``--peer`` is a
key file (its did:key is read from it) or a ``did:key:...`` (what a peer sends you). The
text is validated with the same parser the coordinator uses before it is written, and an
existing file is never overwritten without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import tomllib
from pathlib import Path

from ..job import parse_job
from ..messages import SigningKey, public_key_from_did
from . import _exit
from ._exit import UsageError
from ._method_args import method_names
from ._output import announce_written, is_stdout, open_output

_DID = "did:key:"


def did_of(text: str, option: str) -> str:
    """The did:key a ``--coordinator``/``--peer`` value names: given as is, or a key file's."""
    if text.startswith(_DID):
        try:
            public_key_from_did(text)
        except ValueError as exc:
            raise UsageError(f"{option} {text!r:.80}: {exc}") from exc
        return text
    return SigningKey.load(text).did


def job_text(args: argparse.Namespace) -> str:
    """The job file's TOML for the parsed options (not yet validated)."""
    coordinator = did_of(args.coordinator, "--coordinator")
    peers = [(did_of(p, "--peer"), p) for p in args.peers]
    name = args.name or f"job-{secrets.token_hex(4)}"
    quorum = len(peers) if args.quorum is None else args.quorum
    q = json.dumps  # TOML basic strings: these ids and names need no other escaping
    lines = [
        "# gradstore job file (gradstore job init); unknown keys are errors",
        f"job = {q(name)}",
        f"coordinator = {q(coordinator)}{_from(args.coordinator)}",
        "peers = [",
        *(f"  {q(did)},{_from(source)}" for did, source in peers),
        "]",
        "",
        "[aggregation]",
        f"method = {q(args.method)}  # {' | '.join(method_names())}",
    ]
    if args.method == "weighted":
        weights = ", ".join(f"{q(did)} = 1.0" for did, _ in peers)
        lines.append(f"weights = {{ {weights} }}  # one per peer: edit them")
    for key in ("trim_ratio", "byzantine", "select", "clip_input_norm", "clip_output_norm"):
        value = getattr(args, key)
        if value is not None:
            lines.append(f"{key} = {value!r}")
    lines += [
        "",
        "[rounds]",
        f"count = {args.rounds}  # rounds 0..count-1; 0 runs until stopped",
        f"quorum = {quorum}  # verified peers needed to close a round at its deadline",
        f"deadline_s = {args.deadline!r}  # counted from a round's first announcement",
    ]
    if args.max_gradient_bytes is not None:
        lines += ["", "[limits]", f"max_gradient_bytes = {args.max_gradient_bytes}"]
    lines += STEPS_EXAMPLE
    return "\n".join(lines) + "\n"


#: A commented-out ``[[steps]]`` example closing the template (uncomment ``#`` lines to use).
STEPS_EXAMPLE = [
    "",
    "# Optional: a round in steps, output layer first, every tensor in exactly one step.",
    "# A step may also set peers, quorum, deadline_s, and method with its parameters.",
    "#[[steps]]",
    '#name = "head"',
    '#tensors = ["fc.*"]  # exact names, or prefix.* for every name starting "prefix."',
    "#",
    "#[[steps]]",
    '#name = "body"',
    '#tensors = ["conv1.weight", "conv1.bias"]',
    "#quorum = 1",
]


def _from(source: str) -> str:
    return "" if source.startswith(_DID) else f"  # {json.dumps(source)[1:-1]}"


def cmd_job_init(args: argparse.Namespace) -> int:
    out: str = args.out
    if not is_stdout(out) and Path(out).exists() and not args.force:
        journal = f"gradstore-state/{args.name or '<job>'}"
        raise UsageError(
            f"{out} exists: pass --force to replace it, or choose --out (starting over? the "
            f"new job's coordinator needs a new journal too: remove {journal}, or give it "
            "another --state)"
        )
    text = job_text(args)
    parse_job(tomllib.loads(text), source=out)  # the coordinator's own checks, before writing
    with open_output(out, terminal=True) as f:
        f.stream.write(text.encode("utf-8"))
    announce_written(out)
    return _exit.SUCCESS
