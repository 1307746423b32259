"""Which refused messages get a log line of their own: pure, no I/O, the clock passed in.

Anyone can publish on a job's topics, so refusals can come at the node's full rate; one
line each filled gigabytes a day. The first refusal for each (reason, sender) is logged in
full; the others are only counted, and the counts per reason go out in one summary line
every ``every_s`` seconds. A sender is a peer only when the message's signature proved it
(``None`` otherwise: a forged did is no identity), so junk shares one key per reason.
Reasons are codes from a fixed set (``errors.Reason``: ``MessageError.code``, admission's).

Memory and lines are bounded: at most ``max_pairs`` (reason, sender) pairs are remembered,
each for ``remember_s`` seconds (a refusal that goes on is logged in full again after that);
once the pairs are full, new ones are counted like repeats until old ones expire.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Final

#: Seconds between summaries of the refusals not logged one by one.
SUMMARY_EVERY_S: Final = 60.0

#: (reason, sender) pairs remembered at most, and for how long.
MAX_PAIRS: Final = 1024
REMEMBER_S: Final = 3600.0


class RefusalLog:
    """Decides, for each refusal, whether to log it in full, and when to log a summary."""

    def __init__(
        self,
        every_s: float = SUMMARY_EVERY_S,
        *,
        max_pairs: int = MAX_PAIRS,
        remember_s: float = REMEMBER_S,
        verb: str = "refused",
    ) -> None:
        if every_s <= 0 or max_pairs < 1 or remember_s <= 0:
            raise ValueError("every_s and remember_s must be > 0, max_pairs >= 1")
        self.every_s = every_s
        self.max_pairs = max_pairs
        self.remember_s = remember_s
        self.verb = verb  # the summary's first word: "refused", or "ignored" for a peer
        self._logged: OrderedDict[tuple[str, str | None], float] = OrderedDict()  # -> when
        self._counts: Counter[str] = Counter()  # reason -> refusals counted since window start
        self._window_start = 0.0

    @property
    def remembered(self) -> int:
        """How many (reason, sender) pairs are remembered now (at most ``max_pairs``)."""
        return len(self._logged)

    def refused(self, reason: str, sender: str | None, now: float) -> bool:
        """Note one refusal at ``now`` (seconds); True if it is to be logged in full.

        ``sender`` is the peer the signature proved, or None for an unauthenticated message.
        """
        self._expire(now)
        key = (reason, sender)
        if key not in self._logged and len(self._logged) < self.max_pairs:
            self._logged[key] = now
            return True
        if not self._counts:
            self._window_start = now
        self._counts[reason] += 1
        return False

    def summary(self, now: float) -> str | None:
        """The summary line once ``every_s`` passed since the first refusal it counts, else None.

        ``refused 1234 more messages in the last 60 s: bad-signature 1200, malformed 34``
        (most frequent first); the counts start again from zero.
        """
        if not self._counts or now - self._window_start < self.every_s:
            return None
        total = sum(self._counts.values())
        parts = ", ".join(f"{reason} {n}" for reason, n in self._counts.most_common())
        line = (
            f"{self.verb} {total} more message{'s' if total != 1 else ''} "
            f"in the last {now - self._window_start:.0f} s: {parts}"
        )
        self._counts.clear()
        return line

    def _expire(self, now: float) -> None:
        """Forget pairs logged ``remember_s`` ago or more (the oldest are first)."""
        while self._logged:
            key, at = next(iter(self._logged.items()))
            if now - at < self.remember_s:
                return
            del self._logged[key]
