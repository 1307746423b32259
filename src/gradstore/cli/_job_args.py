"""The parsers of the job subcommands; light to import (the commands are in ``_job_cmds``)."""

from __future__ import annotations

from typing import Any

from ._argtypes import byte_count
from ._compress_args import add_compress_options
from ._lazy import lazy
from ._method_args import METHOD_CHOICES, add_method_options
from ._nodes import add_node_options, add_timeout_option


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keygen", help="create an Ed25519 identity (file mode 0600); prints its did:key"
    )
    p.add_argument("--out", required=True, help="key file to create (never overwritten)")
    p.set_defaults(run=lazy("_job_cmds", "cmd_keygen"))

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
    p.set_defaults(run=lazy("_coordinator_cmd", "cmd_coordinator"))

    peer = sub.add_parser("peer", help="act as one of a job's peers")
    psub = peer.add_subparsers(dest="peer_command", metavar="ACTION", required=True)
    p = psub.add_parser(
        "publish", help="store a gradient, announce it, wait for the coordinator's ack"
    )
    p.add_argument("gradient", help="gradient as .npz or .safetensors")
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--key", required=True, help="this peer's key file")
    p.add_argument("--round", type=int, required=True)
    p.add_argument(
        "--step",
        metavar="NAME",
        default=None,
        help="a job with [[steps]]: publish only this step (the file's other steps' tensors are "
        "left out); without it, every step of this peer is announced, one line STEP CID each",
    )
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--no-wait", action="store_true", help="return after the first announcement")
    p.add_argument("--timeout", type=float, default=None, help="give up after S seconds")
    add_node_options(p)
    add_compress_options(p, peer=True)
    p.set_defaults(run=lazy("_job_cmds", "cmd_peer_publish"))

    p = psub.add_parser("await", help="wait for a round's result, verify and save the aggregate")
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--round", type=int, required=True)
    p.add_argument(
        "--step",
        metavar="NAME",
        default=None,
        help="a job with [[steps]]: wait for this step's aggregate only (without it: the "
        "round's model-level output, once every step has ended)",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write: .safetensors by its extension, else .npz",
    )
    p.add_argument("--timeout", type=float, default=None, help="give up after S seconds")
    add_node_options(p)
    p.set_defaults(run=lazy("_job_cmds", "cmd_peer_await"))

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
    p.add_argument(
        "--method",
        required=True,
        choices=METHOD_CHOICES,
        metavar="METHOD",
        help="one of: %(choices)s",
    )
    # nargs="+" lists swallow the inputs that follow them (`--num-samples 10 20 a.npz b.npz`):
    # they take strings, and _split_lists gives the non-numeric tail back to the inputs.
    p.add_argument("--num-samples", nargs="+", default=None, metavar="N", help="one per input")
    p.add_argument("--weights", nargs="+", default=None, metavar="W", help="one per input")
    p.add_argument("--trim-ratio", type=float, default=None)
    p.add_argument("--byzantine", type=int, default=None)
    p.add_argument("--select", type=int, default=None)
    p.add_argument("--clip-input-norm", type=float, default=None)
    p.add_argument("--clip-output-norm", type=float, default=None)
    p.set_defaults(run=lazy("_job_cmds", "cmd_aggregate"))

    job = sub.add_parser("job", help="job files")
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    p = jsub.add_parser(
        "init",
        help="write a job file from the coordinator's and peers' key files (or did:keys)",
        description="Write a job file whose ids come from key files (or did:key strings), "
        "checked as the coordinator checks it. Edit it afterwards for anything else "
        "([[schema]], [messages], more [limits]).",
    )
    p.add_argument(
        "--coordinator", required=True, metavar="KEY|DID", help="the coordinator's key file or id"
    )
    p.add_argument(
        "--peer",
        dest="peers",
        action="append",
        required=True,
        metavar="KEY|DID",
        help="a peer's key file or id (repeat for each peer)",
    )
    p.add_argument(
        "-o", "--out", default="job.toml", help="file to write (default job.toml; - for stdout)"
    )
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    p.add_argument(
        "--name", default=None, help="job name, part of the pubsub topics (default: job-<random>)"
    )
    add_method_options(p)
    p.add_argument(
        "--rounds", type=int, default=1, help="rounds to run (default 1; 0: until stopped)"
    )
    p.add_argument(
        "--quorum", type=int, default=None, help="verified peers that close a round (default: all)"
    )
    p.add_argument(
        "--deadline", type=float, default=60.0, metavar="S", help="seconds per round (default 60)"
    )
    p.add_argument("--max-gradient-bytes", type=byte_count, default=None, metavar="N")
    p.set_defaults(run=lazy("_job_init", "cmd_job_init"))

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
    add_timeout_option(p)
    p.set_defaults(run=lazy("_round_show", "cmd_round_show"))
