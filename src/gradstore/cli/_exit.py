"""Exit codes of the ``gradstore`` command, in one place."""

from typing import Final

SUCCESS: Final = 0
ERROR: Final = 1  # the command ran and failed: integrity, unreachable node, bad input, ...
USAGE: Final = 2  # the command line itself is wrong (argparse's own code)
INTERRUPTED: Final = 130
