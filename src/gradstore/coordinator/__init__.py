"""The event-driven aggregation coordinator: pure round rules inside a thin asyncio shell.

``admission`` (is an announcement accepted?), ``rounds`` (when does a round close, who is
aggregated?), ``fetch_plan`` (which input to fetch next?) and ``statuses`` (what do peers
hear?) decide; ``service`` reads, calls them and acts; ``inputs`` verifies one input and
``closing`` stores a round's aggregate and record; ``journal`` makes it all durable.
"""

from .admission import Admission, AdmissionState, Verdict, admit
from .journal import Journal
from .rounds import PeerState, RoundBook, Slot
from .service import Coordinator, Progress, RoundOutcome, format_outcome

__all__ = [
    "Admission",
    "AdmissionState",
    "Coordinator",
    "Journal",
    "PeerState",
    "Progress",
    "RoundBook",
    "RoundOutcome",
    "Slot",
    "Verdict",
    "admit",
    "format_outcome",
]
