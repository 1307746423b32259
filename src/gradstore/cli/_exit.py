"""Exit codes of the ``gradstore`` command, in one place (the README's table lists them)."""

from typing import Final

from ..errors import GradstoreError

SUCCESS: Final = 0
ERROR: Final = 1  # the command ran and failed: integrity, unreachable node, bad input, ...
USAGE: Final = 2  # the command line itself is wrong (argparse's own code)
ROUND_FAILED: Final = 3  # coordinator: every round ran, and at least one failed (no record)
INTERRUPTED: Final = 130


class UsageError(GradstoreError):
    """The command line is wrong in a way argparse cannot see (exits ``USAGE``)."""


class RoundsFailedError(GradstoreError):
    """The coordinator finished its rounds and some failed (exits ``ROUND_FAILED``)."""
