"""``--compress SPEC`` and ``--residual PATH`` for put and peer publish (parsers only: light)."""

from __future__ import annotations

import argparse

from ._lazy import one_blas_thread

SPEC_HELP = (
    "store a compressed document (gradstore/2): bf16, fp16, int8[:BLOCK], or "
    "topk:RATIO[,values=bf16|int8|2bit][,chunk=N][,index=12|16], e.g. topk:0.015,values=int8"
)


def spec(text: str) -> str:
    """``--compress``'s value, once the codec parser takes it (argparse type): a malformed
    one is a usage error (exit 2), said before a gradient is read or a node is asked."""
    # NumPy is imported here, before the command runs: compressing does no linear algebra,
    # so OpenBLAS starts with one thread, as lazy(blas=False) would have had it for put
    one_blas_thread()
    from ..compress import parse_spec
    from ..errors import CompressionError

    try:
        parse_spec(text)
    except CompressionError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_compress_options(parser: argparse.ArgumentParser, *, peer: bool) -> None:
    """Add ``--compress`` and ``--residual`` to ``parser``.

    A peer keeps an error-feedback residual by default (next to its key); ``put`` keeps one
    only when ``--residual`` names a file.
    """
    group = parser.add_argument_group("compression")
    group.add_argument("--compress", type=spec, metavar="SPEC", default=None, help=SPEC_HELP)
    where = (
        "default: KEY.residual-JOB next to the key, KEY.residual-JOB@STEP with --step"
        if peer
        else "default: none"
    )
    group.add_argument(
        "--residual",
        metavar="PATH",
        default=None,
        help="error feedback: what compression left out is kept in PATH and added to the "
        "next update; replaced once the update is "
        + ("verified by the coordinator (with --no-wait: announced)" if peer else "stored")
        + f" ({where})",
    )
