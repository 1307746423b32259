"""argparse value types and options shared by the parsers (light: imported for --help)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ._exit import UsageError

_UNITS = {"": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def byte_count(text: str) -> int:
    """``1073741824``, ``1GiB``, ``512MiB``: a positive number of bytes (argparse type)."""
    digits = text.strip()
    unit = digits.lstrip("0123456789")
    number = digits[: len(digits) - len(unit)]
    scale = _UNITS.get(unit.strip().lower())
    if not number or scale is None or int(number) * scale <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of bytes (optionally KiB, MiB, GiB, TiB), got {text!r}"
        )
    return int(number) * scale


def seconds(text: str) -> float:
    """A number of seconds >= 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


class EmptyArgumentError(UsageError):
    """A CID argument given as an empty string: one ``error:`` line and exit 2, before any
    node is asked (argparse lets an exception of a type other than its own out of
    ``parse_args``; ``main`` reports it)."""


def cid_argument(what: str) -> Callable[[str], str]:
    """An argparse type for a positional CID (``what`` names it): the text as given, parsed
    later by the command; an empty one is refused at once. In a script that CID comes from
    an earlier command's output (``read record < result.txt``): empty, that command failed."""

    def given(text: str) -> str:
        if not text.strip():
            raise EmptyArgumentError(
                f"{what} is empty (when it comes from an earlier command's output, that "
                "command printed none: see its error)"
            )
        return text

    given.__name__ = "CID"
    return given


def add_max_bytes(parser: argparse.ArgumentParser) -> None:
    """``--max-bytes N``: the largest document a command reads or writes (``command_limits``)."""
    parser.add_argument(
        "--max-bytes",
        type=byte_count,
        default=None,
        metavar="N",
        help="refuse documents larger than N bytes (default 1 GiB); "
        "N may end in KiB, MiB, GiB or TiB",
    )
