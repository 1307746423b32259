"""argparse value types and options shared by the parsers (light: imported for --help)."""

from __future__ import annotations

import argparse

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
