"""The parsers of ``gradstore audit cid|round|history|population|stage`` (light; the commands are in ``_audit_cmds``)."""

from __future__ import annotations

import argparse
from typing import Any

from ._argtypes import add_max_bytes, cid_argument
from ._help import examples
from ._lazy import lazy
from ._nodes import add_node_options, add_timeout_option


def register(sub: Any) -> None:
    audit = sub.add_parser(
        "audit",
        help="re-check what was published: a gradient, a round, a job's history, a "
        "population's decisions, a pipeline stage's forward pass",
        description="Independent re-checks. Each exits 0 when every check holds, and 1 with "
        "'error: check NAME failed: ...' naming the first that does not.",
        epilog=examples(
            'gradstore audit round "$record" --config job.toml',
            'gradstore audit history "$record" --coordinator did:key:z6Mk...',
            'gradstore audit cid "$aggregate"',
        ),
    )
    asub = audit.add_subparsers(dest="audit_command", metavar="CHECK", required=True)

    p = asub.add_parser(
        "cid",
        help="fetch a gradient, check every block, decode strictly, re-derive its CID",
        epilog=examples(
            'gradstore audit cid "$aggregate"              # a round\'s output, or any gradient',
        ),
    )
    p.add_argument("cid", type=cid_argument("the CID"), help="the gradient's CID")
    _common(p)
    p.set_defaults(run=lazy("_audit_cmds", "cmd_audit_cid"))

    p = asub.add_parser(
        "round",
        help="check a round record's signature, re-fetch its inputs, recompute, compare the output",
        epilog=examples(
            'gradstore audit round "$record" --config job.toml        # pinned to the job file',
            'gradstore audit round "$record" --coordinator did:key:z6Mk... --api http://127.0.0.1:5001',
        ),
    )
    p.add_argument("record", type=cid_argument("the record CID"), help="round record CID")
    _pins(p)
    _common(p)
    p.set_defaults(run=lazy("_audit_cmds", "cmd_audit_round"))

    p = asub.add_parser(
        "history",
        help="verify every round along the prev links from a record (same job, same coordinator)",
        epilog=examples(
            'gradstore audit history "$record" --config job.toml',
            'gradstore audit history "$record" --coordinator did:key:z6Mk... --allow-gaps',
        ),
    )
    p.add_argument(
        "head", type=cid_argument("the head record CID"), help="the newest round record's CID"
    )
    p.add_argument(
        "--allow-gaps",
        action="store_true",
        help="accept skipped round numbers (a failed round has no record)",
    )
    _pins(p)
    _common(p)
    p.set_defaults(run=lazy("_audit_cmds", "cmd_audit_history"))

    p = asub.add_parser(
        "population",
        help="re-derive every decision of a population (PBT) along the prev links from a record",
        epilog=examples('gradstore audit population "$record" --config job.toml'),
    )
    p.add_argument(
        "head", type=cid_argument("the record CID"), help="the newest population record's CID"
    )
    _pins(p)
    _common(p)
    p.set_defaults(run=lazy("_population_cmds", "cmd_audit_population", blas=False))

    p = asub.add_parser(
        "stage",
        help="re-execute a pipeline stage's forward pass from its input and parameters, "
        "compare with its published output",
        description="A pipeline stage's output is re-derived from the micro-batch's input "
        "document and the stage's parameter document of the round (the CIDs the replica "
        "recorded: `gradstore demo --mode model-parallel` prints one such command). The three "
        "documents' meta must name the same job, round, micro-batch, stage and peer; the "
        "layer is the one the parameters hold, its activation the model's (no document says "
        "it). Exits 0 when the re-executed document has the published CID, 1 naming the check "
        "that failed.",
        epilog=examples(
            'gradstore audit stage "$output" --input "$input" --params "$params" '
            "--activation tanh --config job.toml",
        ),
    )
    p.add_argument("output", type=cid_argument("the output CID"), help="the published output")
    p.add_argument(
        "--input", required=True, type=cid_argument("--input"), metavar="CID",
        help="the micro-batch's input: the first stage's rows, or the activation it took",
    )  # fmt: skip
    p.add_argument(
        "--params", required=True, type=cid_argument("--params"), metavar="CID",
        help="the stage's parameters in that round, as the replica stored them",
    )  # fmt: skip
    p.add_argument(
        "--activation", required=True, choices=("tanh", "none"),
        help="the layer's activation function, from the model's code (the demo's fc1: tanh)",
    )  # fmt: skip
    p.add_argument(
        "--config",
        metavar="JOB_TOML",
        default=None,
        help="pin the job file: its name, the stage's replicas and tensors (checks "
        "expected-job, stage-peer, params-tensors)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="X",
        help="pass when the activations differ by at most X though the CIDs do not (another "
        "machine or BLAS: see docs/design/pipeline.md); default: bit for bit",
    )
    _common(p)
    p.set_defaults(run=lazy("_audit_cmds", "cmd_audit_stage"))


def _pins(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--coordinator",
        metavar="DID",
        default=None,
        help="refuse records not signed by this coordinator (check expected-coordinator); "
        "without it or --config, whichever key a record names is trusted",
    )
    group.add_argument(
        "--config",
        metavar="JOB_TOML",
        default=None,
        help="pin the job file's coordinator and job name (checks expected-coordinator, "
        "expected-job)",
    )


def _common(parser: argparse.ArgumentParser) -> None:
    add_max_bytes(parser)
    add_node_options(parser)
    add_timeout_option(parser)
