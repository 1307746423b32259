"""What the store commands share: ``--meta`` and the ``--max-bytes`` limits, parsed once
(``DocumentOptions``), the refusals that name them, and document files.

Light on purpose: the commands that need no node (``_file_cmds``) and those that do
(``_store_cmds``) both import it, and neither pulls the other's imports in.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import FormatError, LimitExceededError
from ..format import DEFAULT_LIMITS, FORMAT_ID, Limits
from ._exit import UsageError

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")

RAISED_BY_MAX_BYTES = frozenset(("max_bytes", "max_elements"))
"""The limits ``--max-bytes`` sets (``command_limits``); every other one is the default."""


def parse_meta(items: list[str]) -> dict[str, Any]:
    """``k=v`` pairs: v as JSON when it parses (numbers, true/false/null, quoted strings), else a string."""
    meta: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--meta expects KEY=VALUE, got {item!r}")
        if key in meta:
            raise UsageError(f"--meta {key} is given twice")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        meta[key] = parsed
    return meta


def command_limits(args: argparse.Namespace) -> Limits:
    """The limits a command runs with: the defaults, scaled to ``--max-bytes``.

    put checks what it stores against the same limits get decodes with, so what one
    stores the other fetches.
    """
    max_bytes = getattr(args, "max_bytes", None) or DEFAULT_LIMITS.max_bytes
    return Limits(max_bytes=max_bytes, max_elements=max(DEFAULT_LIMITS.max_elements, max_bytes))


@dataclass(frozen=True)
class DocumentOptions:
    """A command's document options, parsed once: the ``limits`` its documents are checked
    and read against (``--max-bytes``, ``command_limits``) and its ``--meta``."""

    limits: Limits
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, args: argparse.Namespace) -> DocumentOptions:
        """The options of ``args`` (a command without ``--meta`` has none)."""
        return cls(command_limits(args), parse_meta(getattr(args, "meta", None) or []))

    @contextlib.contextmanager
    def named_limits(self, what: str) -> Iterator[None]:
        """A limit refusal inside names ``what`` it refused and, for a limit ``--max-bytes``
        sets, the option and its value now; the other limits (rank, tensor count, name and
        meta sizes) are every reader's defaults, which no option changes: say so."""
        try:
            yield
        except LimitExceededError as exc:
            if exc.limit in RAISED_BY_MAX_BYTES:
                limit = self.limits.max_bytes
                hint = f"the limit is --max-bytes {limit}; pass a larger --max-bytes N to allow it"
            else:
                hint = "a limit every reader applies by default, which no option raises"
            raise LimitExceededError(f"{what}: {exc} ({hint})", exc.limit) from exc

    def check(self, what: str, check: Callable[[int, Limits], None], size: int) -> None:
        """``check(size, limits)`` a document about to be written or stored against the
        limits its readers apply: what encode, cid and put accept, decode and get read
        back. A refusal names ``what`` (``named_limits``)."""
        with self.named_limits(what):
            check(size, self.limits)

    def read_document(self, path: str, parse: Callable[[np.ndarray], T]) -> T:
        """Parse a document file with ``parse``; a refusal names the file (and --max-bytes).

        The file's bytes go into a NumPy buffer (no big ``bytes`` object).
        """
        import numpy as np

        buf = np.fromfile(path, dtype=np.uint8)
        try:
            with self.named_limits(path):
                return parse(buf)
        except FormatError as exc:
            if str(exc).startswith(f"not a {FORMAT_ID} document"):
                raise FormatError(f"{path}: {exc}") from exc
            raise FormatError(f"{path}: not a valid gradstore document: {exc}") from exc
