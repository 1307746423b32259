"""The aggregation options ``job init`` and ``demo`` share: one list of method names (the
aggregator's own), and the method's parameters under the job file's names."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Final

from ._lazy import LazyChoices

#: The parameter options, as (option, type, metavar, help); each sets the job file's key
#: of that name.
PARAMETER_OPTIONS: Final = (
    ("--trim-ratio", float, "R", "trimmed_mean: fraction dropped on each side (0 <= R < 0.5)"),
    ("--byzantine", int, "F", "krum, multikrum: how many Byzantine inputs to tolerate"),
    ("--select", int, "M", "multikrum: how many inputs to average (default n - F)"),
    ("--clip-input-norm", float, "N", "any method: bound each input's L2 norm to N first"),
    ("--clip-output-norm", float, "N", "any method: bound the aggregate's L2 norm to N"),
)


def method_names() -> Sequence[str]:
    """Every aggregation method, by the name job files and round records use."""
    from ..aggregate import METHODS

    return METHODS


#: ``choices`` for a ``--method`` option, loaded when first used (``--help`` stays light).
METHOD_CHOICES: Final = LazyChoices(method_names)


def add_method_options(
    parser: argparse._ActionsContainer, *, default: str = "fedavg", note: str = ""
) -> None:
    """``--method`` (default ``default``; ``note`` ends its help) and its parameters."""
    parser.add_argument(
        "--method",
        default=default,
        choices=METHOD_CHOICES,
        metavar="METHOD",
        help=f"aggregation method, one of: %(choices)s (default {default}){note}",
    )
    for option, kind, metavar, text in PARAMETER_OPTIONS:
        parser.add_argument(option, type=kind, default=None, metavar=metavar, help=text)
