"""Leaves hashed in the thread that reads them, each as soon as its bytes are all in."""

from __future__ import annotations

from collections.abc import Callable

from ..dag.assemble import LeafSpan


class LeafCheck:
    """``progress`` of a ``cat``: ``check(span)`` for each leaf span in turn, once the bytes
    read (``filled``, counted from the file's offset ``start``) cover it. It runs in the
    reading thread, so what ``check`` raises (``IntegrityError``) ends the transfer."""

    def __init__(
        self, spans: list[LeafSpan], check: Callable[[LeafSpan], None], start: int = 0
    ) -> None:
        self.spans = spans
        self.check = check
        self.start = start
        self.verified = 0  # spans checked so far, in order

    def __call__(self, filled: int) -> None:
        while self.verified < len(self.spans):
            span = self.spans[self.verified]
            if span.offset - self.start + span.size > filled:
                return
            self.check(span)
            self.verified += 1
