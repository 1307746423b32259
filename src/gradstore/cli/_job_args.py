"""The parsers of the job subcommands; light to import (the commands are in ``_job_cmds``)."""

from __future__ import annotations

from typing import Any

from ._argtypes import byte_count, cid_argument
from ._compress_args import add_compress_options
from ._help import examples
from ._lazy import lazy
from ._method_args import METHOD_CHOICES, PARAMETER_OPTIONS, add_method_options
from ._nodes import add_node_options, add_timeout_option


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keygen",
        help="create an Ed25519 identity (file mode 0600); prints its did:key",
        epilog=examples("gradstore keygen --out alice.key          # prints did:key:z6Mk..."),
    )
    p.add_argument("--out", required=True, help="key file to create (never overwritten)")
    p.set_defaults(run=lazy("_job_cmds", "cmd_keygen"))

    p = sub.add_parser(
        "coordinator",
        help="run a job's coordinator until its rounds are done (a job with [population]: "
        "its PBT controller, every interval)",
        epilog=examples(
            "gradstore coordinator --config job.toml --key coord.key",
            "gradstore coordinator --config job.toml --key coord.key --state ./state -v",
            "gradstore coordinator --config job.toml --key head-owner.key --state ./head",
            then="A job whose [[steps]] name other coordinators (steps `coordinator`) runs one\n"
            "command per owner, each with its key and state folder: an owner runs only its\n"
            "steps, the job's coordinator combines every step into the round's record\n"
            "(docs/design/multicoord.md).",
        ),
    )
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument(
        "--key",
        required=True,
        help="the coordinator's key file: the job's coordinator, or the owner of some of its "
        "[[steps]] (steps `coordinator`), which runs only those steps in the job's coordinator's "
        "run; the job's coordinator combines every step into the round's record",
    )
    p.add_argument(
        "--state", default=None, help="journal folder (default: ./gradstore-state/<job>)"
    )
    spill = p.add_mutually_exclusive_group()
    spill.add_argument(
        "--spill",
        action="store_true",
        help="keep verified inputs in spill files in <state>/spill, read at the close "
        "(the default, docs/design/spill.md)",
    )
    spill.add_argument(
        "--spill-dir",
        default=None,
        help="keep verified inputs in spill files in this folder (a disk that writes at "
        "least as fast as the node reads)",
    )
    spill.add_argument(
        "--no-spill",
        action="store_true",
        help="no spill files: read inputs back from the node when the round is aggregated "
        "(slower for large rounds; no disk used beside the node's)",
    )
    p.add_argument(
        "-v", "--verbose", action="count", default=0, help="log announcements (-vv: debug)"
    )
    add_node_options(p)
    p.set_defaults(run=lazy("_coordinator_cmd", "cmd_coordinator"))

    peer = sub.add_parser(
        "peer",
        help="act as one of a job's peers: publish a gradient, await a round's aggregate",
        epilog=examples(
            "gradstore peer publish --config job.toml --key alice.key --round 0 alice.npz",
            "gradstore peer await --config job.toml --round 0 -o aggregate.npz",
        ),
    )
    psub = peer.add_subparsers(dest="peer_command", metavar="ACTION", required=True)
    p = psub.add_parser(
        "publish",
        help="store a gradient, announce it, wait for the coordinator's ack",
        epilog=examples(
            "gradstore peer publish --config job.toml --key alice.key --round 0 \\\n"
            "    --num-samples 100 alice.npz",
            "gradstore peer publish --config job.toml --key alice.key --round 1 \\\n"
            "    --compress topk:0.027,values=2bit alice.npz",
            "gradstore peer publish --config job.toml --key alice.key --round 0 \\\n"
            "    --step head alice.npz            # a job with [[steps]]: one step",
        ),
    )
    p.add_argument("gradient", help="gradient as .npz or .safetensors")
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--key", required=True, help="this peer's key file")
    p.add_argument("--round", type=int, required=True, help="the round (from 0)")
    p.add_argument(
        "--step",
        metavar="NAME",
        default=None,
        help="a job with [[steps]]: publish only this step (the file's other steps' tensors are "
        "left out); without it, every step of this peer is announced, one line STEP CID each",
    )
    p.add_argument("--num-samples", type=int, default=1, help="fedavg's weight (default 1)")
    p.add_argument("--no-wait", action="store_true", help="return after the first announcement")
    p.add_argument("--timeout", type=float, default=None, help="give up after S seconds")
    add_node_options(p)
    add_compress_options(p, peer=True)
    p.set_defaults(run=lazy("_job_cmds", "cmd_peer_publish"))

    p = psub.add_parser(
        "await",
        help="wait for a round's result, verify and save the aggregate",
        epilog=examples(
            "gradstore peer await --config job.toml --round 0 -o aggregate.npz",
            "gradstore peer await --config job.toml --round 0 --step head -o head.npz",
        ),
    )
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument("--round", type=int, required=True, help="the round (from 0)")
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
        description="Aggregate gradients with the coordinator's code, bit for bit what a round "
        "with these inputs would publish. sum/mean/fedavg/weighted over large float32/float64 "
        "tensors run a numba-compiled kernel that gives the NumPy path's exact bits; "
        "GRADSTORE_NUMBA=0 turns it off.",
        epilog=examples(
            "gradstore aggregate --method fedavg alice.npz bob.npz --num-samples 100 50 -o avg.npz",
            "gradstore aggregate --method median a.npz b.npz c.npz -o median.npz",
        ),
    )
    p.add_argument(
        "inputs", nargs="*", help="gradients as .npz or .safetensors, in canonical order"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write: .safetensors by its extension, else .npz",
    )
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
    for option, kind, metavar, text in PARAMETER_OPTIONS:
        p.add_argument(option, type=kind, default=None, metavar=metavar, help=text)
    p.set_defaults(run=lazy("_job_cmds", "cmd_aggregate"))

    job = sub.add_parser(
        "job",
        help="write a job file (job init)",
        epilog=examples(
            "gradstore job init --coordinator coord.key --peer alice.key --peer bob.key",
        ),
    )
    jsub = job.add_subparsers(dest="job_command", metavar="ACTION", required=True)
    p = jsub.add_parser(
        "init",
        help="write a job file from the coordinator's and peers' key files (or did:keys)",
        description="Write a job file whose ids come from key files (or did:key strings), "
        "checked as the coordinator checks it. Edit it afterwards for anything else "
        "([[schema]], [messages], more [limits], [[steps]]).",
        epilog=examples(
            "gradstore job init --name walkthrough --coordinator coord.key \\\n"
            "    --peer alice.key --peer bob.key",
            "gradstore job init --coordinator coord.key --peer alice.key --peer did:key:z6Mk... \\\n"
            "    --method median --rounds 10 -o job.toml --force",
        ),
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
    p.add_argument(
        "--max-gradient-bytes",
        type=byte_count,
        default=None,
        metavar="N",
        help="[limits] max_gradient_bytes: the coordinator refuses inputs whose document is "
        "larger (default 1 GiB); N may end in KiB, MiB, GiB or TiB",
    )
    p.set_defaults(run=lazy("_job_init", "cmd_job_init"))

    rnd = sub.add_parser(
        "round",
        help="watch a job's open round, list its past rounds, show a round record",
        epilog=examples(
            "gradstore round status --config job.toml --watch",
            "gradstore round list --config job.toml",
            'gradstore round show "$record"',
        ),
    )
    rsub = rnd.add_subparsers(dest="round_command", metavar="ACTION", required=True)
    p = rsub.add_parser(
        "show",
        help="a round record as JSON, with each peer's status",
        epilog=examples(
            'gradstore round show "$record"                 # $record: what peer await printed',
            'gradstore round show "$record" --state gradstore-state/walkthrough',
        ),
    )
    p.add_argument("record", type=cid_argument("the record CID"), help="round record CID")
    p.add_argument(
        "--state",
        default=None,
        help="the coordinator's journal folder: adds the round's stats (seconds per stage, bytes)",
    )
    add_node_options(p)
    add_timeout_option(p)
    p.set_defaults(run=lazy("_round_show", "cmd_round_show"))

    p = rsub.add_parser(
        "status",
        help="the open round (each peer's state, verified of quorum) and the last result, "
        "from the coordinator's signed statuses",
        description="Listen to the job's coordinator for a few seconds and print its open "
        "round: each step's peers (received, verified, refused with the coordinator's reason, "
        "absent), verified out of quorum, the deadline, and the last round's CIDs. Only "
        "messages signed by the job file's coordinator and stamped after the command started "
        "count (not forgeries, not replays).",
        epilog=examples(
            "gradstore round status --config job.toml",
            "gradstore round status --config job.toml --watch          # again at each change",
            "gradstore round status --config job.toml --watch --json   # JSON lines",
        ),
    )
    p.add_argument("--config", required=True, help="job file (TOML)")
    p.add_argument(
        "--watch",
        action="store_true",
        help="print it again at each change, until the job's last round ended (or Ctrl-C)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object (--watch: one a line)")
    add_node_options(p)
    p.set_defaults(run=lazy("_round_status", "cmd_round_status", blas=False))

    p = rsub.add_parser(
        "list",
        help="a job's past rounds with their record and output CIDs, newest first",
        description="Walk the job's signed round records through prev, from HEAD (a round "
        "record CID) or from the record of the last round the coordinator says closed "
        "(--config): every record's hash and signature checked, each of the same job, run "
        "and coordinator (with --config: the job file's coordinator).",
        epilog=examples(
            "gradstore round list --config job.toml",
            'gradstore round list "$record" --config job.toml --limit 5',
            'gradstore round list "$record" --json',
        ),
    )
    p.add_argument("head", nargs="?", default=None, help="the newest round record's CID")
    p.add_argument("--config", default=None, help="job file (TOML): pins its coordinator")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="at most N rounds")
    p.add_argument("--json", action="store_true", help="one JSON object")
    add_node_options(p)
    add_timeout_option(p)
    p.set_defaults(run=lazy("_round_list", "cmd_round_list", blas=False))
