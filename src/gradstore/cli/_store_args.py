"""The parsers of the store subcommands; light to import (the commands: ``_file_cmds`` for
encode, decode and cid, which need no node; ``_store_cmds`` for the others)."""

from __future__ import annotations

import argparse
from typing import Any

from ._argtypes import add_max_bytes, cid_argument
from ._compress_args import add_compress_options
from ._help import examples
from ._lazy import lazy
from ._nodes import add_node_options, add_timeout_option

"""What --help says about --max-bytes (``format.DEFAULT_LIMITS`` is not imported for --help)."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "encode",
        help="write the gradstore/1 document of an .npz or .safetensors file",
        epilog=examples(
            "gradstore encode alice.npz -o alice.doc                # its CID: ipfs add --only-hash",
            "gradstore encode model.safetensors -o model.doc --meta round=3",
        ),
    )
    p.add_argument("input", help="gradient as .npz or .safetensors")
    p.add_argument("-o", "--output", required=True, help="document file to write")
    _add_meta(p)
    add_max_bytes(p)
    p.set_defaults(run=lazy("_file_cmds", "cmd_encode", blas=False))

    p = sub.add_parser(
        "decode",
        help="turn a document back into an .npz or .safetensors file (a compressed one: "
        "decompressed, to each tensor's declared dtype)",
        epilog=examples(
            "gradstore decode alice.doc -o alice.npz",
            "gradstore decode alice.doc -o alice.safetensors         # by the extension",
            "gradstore decode packed.doc -o exact.npz --float64      # a compressed one, exactly",
        ),
    )
    p.add_argument("input", help="document file")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write: .safetensors by its extension, else .npz",
    )
    add_max_bytes(p)
    _add_float64(p)
    p.set_defaults(run=lazy("_file_cmds", "cmd_decode", blas=False))

    p = sub.add_parser(
        "cid",
        help="CID of a gradient's document (or of any file with --raw), no node needed",
        epilog=examples(
            "gradstore cid alice.npz                # the CID `gradstore put alice.npz` prints",
            "gradstore cid alice.npz --meta round=3",
            "gradstore cid --raw alice.doc          # as `ipfs add --only-hash -Q alice.doc`",
        ),
    )
    p.add_argument("input", help="gradient as .npz or .safetensors (or any file with --raw)")
    p.add_argument(
        "--raw", action="store_true", help="CID of the file's bytes, as `ipfs add --only-hash`"
    )
    _add_meta(p)
    add_max_bytes(p)
    p.set_defaults(run=lazy("_file_cmds", "cmd_cid", blas=False))

    p = sub.add_parser(
        "put",
        help="store an .npz or .safetensors gradient on the node, pinned; prints its CID",
        epilog=examples(
            "gradstore put alice.npz                                    # the node: see --api",
            "gradstore put alice.npz --meta round=3 --local ./node      # the embedded node",
            "gradstore put alice.npz --compress topk:0.015,values=int8 --residual alice.res",
        ),
    )
    p.add_argument("input", help="gradient as .npz or .safetensors")
    _add_meta(p)
    add_node_options(p)
    add_timeout_option(p)
    add_max_bytes(p)
    add_compress_options(p, peer=False)
    p.set_defaults(run=lazy("_store_cmds", "cmd_put", blas=False))

    p = sub.add_parser(
        "get",
        help="fetch, verify and decode a gradient into an .npz or .safetensors file (a "
        "compressed one: decompressed, to each tensor's declared dtype)",
        epilog=examples(
            'gradstore get "$cid" -o copy.npz',
            'gradstore get "$cid" -o copy.safetensors --timeout 0     # wait for ever',
            'gradstore get "$cid" -o - > copy.npz                     # to stdout',
        ),
    )
    p.add_argument(
        "cid", type=cid_argument("the CID"), help="the gradient's CID (what put printed)"
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        help="file to write: .safetensors by its extension, else .npz",
    )
    add_node_options(p)
    add_timeout_option(p)
    add_max_bytes(p)
    _add_float64(p)
    p.set_defaults(run=lazy("_store_cmds", "cmd_get", blas=False))

    p = sub.add_parser(
        "verify",
        help="check every block of a CID and that it is a canonical gradstore/1 document",
        epilog=examples(
            'gradstore verify "$cid"',
            'gradstore verify "$cid" --api http://127.0.0.1:5001 --max-bytes 4GiB',
        ),
    )
    p.add_argument("cid", type=cid_argument("the CID"), help="the gradient's CID")
    add_node_options(p)
    add_timeout_option(p)
    add_max_bytes(p)
    p.set_defaults(run=lazy("_store_cmds", "cmd_verify", blas=False))

    p = sub.add_parser(
        "inspect",
        help="names, dtypes, shapes, sizes and meta of a CID or document file",
        epilog=examples(
            'gradstore inspect "$cid"',
            "gradstore inspect alice.doc --json",
        ),
    )
    p.add_argument("target", type=cid_argument("the CID or file"), help="a CID or a document file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_node_options(p)
    add_timeout_option(p)
    add_max_bytes(p)
    p.set_defaults(run=lazy("_store_cmds", "cmd_inspect", blas=False))


def _add_meta(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--meta", action="append", default=[], metavar="K=V", help="meta entry (repeatable)"
    )


def _add_float64(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--float64",
        action="store_true",
        help="for a compressed document (refused for a dense one): write the exact float64 "
        "decompressed values, what aggregation and audit use, instead of each tensor's "
        "declared dtype; they count against --max-bytes",
    )
