"""A small progress bar on stderr, shown only for big transfers on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_MIN_BYTES = 8 << 20  # below this a bar is noise


class ByteProgressBar:
    """Callable (done, total) -> None that draws ``label [####    ] 12.0/256.0 MB 410 MB/s``."""

    def __init__(self, label: str, stream: TextIO | None = None, *, force: bool = False) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = force or self.stream.isatty()
        self.start = time.perf_counter()
        self._last = 0.0
        self._drawn = False
        self._width = 0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or max(done, total) < _MIN_BYTES:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and done != total:
            return
        self._last = now
        rate = done / max(now - self.start, 1e-9) / 1e6
        if total:
            filled = int(30 * done / total)
            bar = f"[{'#' * filled}{' ' * (30 - filled)}] {done / 1e6:.1f}/{total / 1e6:.1f} MB"
        else:
            bar = f"{done / 1e6:.1f} MB"
        line = f"{self.label} {bar} {rate:.0f} MB/s"
        self.stream.write(f"\r{line:<{self._width}}")  # pad over a longer previous line
        self._width = len(line)
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
