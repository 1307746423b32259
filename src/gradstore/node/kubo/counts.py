"""A count of the RPC requests this process sent to Kubo, by command, for measuring.

Every request goes through ``KuboClient._send`` or ``bulk.BulkRead``, which call ``count``.
With ``GRADSTORE_RPC_COUNTS`` set to a file path, the counts are written there as JSON when
the process exits (``python -m benchmarks steps`` sets it for the coordinator's process):
requests per input and per step are load-independent, where wall time is not.
"""

from __future__ import annotations

import atexit
import json
import os
from collections import Counter
from pathlib import Path
from typing import Final

#: Where the counts go at exit (unset: they are only kept in memory).
ENV: Final = "GRADSTORE_RPC_COUNTS"

REQUESTS: Counter[str] = Counter()


def count(command: str) -> None:
    """One request of ``command`` (``block/get``, ``pubsub/pub``, ...) was sent (also from
    bulk reads' worker threads: a count, not a lock-guarded figure)."""
    REQUESTS[command] += 1


def _dump(path: str) -> None:
    Path(path).write_text(json.dumps(dict(sorted(REQUESTS.items())), indent=1) + "\n")


if _path := os.environ.get(ENV):
    atexit.register(_dump, _path)
