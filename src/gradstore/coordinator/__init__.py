"""The event-driven aggregation coordinator: pure round rules inside a thin asyncio shell.

``state`` holds what the coordinator knows and makes every decision, with the pure rules
of ``admission`` (is an announcement accepted?), ``rounds`` (when does a round close, who
is aggregated?), ``fetch_plan`` (which input to fetch next?) and ``statuses`` (what do
peers hear?); ``service`` runs the tasks that wait for I/O, hand each event to the state
and apply the effects it returns; ``inputs`` verifies one input and ``closing`` stores a
round's aggregate and record; ``journal`` makes it all durable.
"""

from .admission import Admission, AdmissionState, Verdict, admit
from .journal import Journal
from .outcome import RoundOutcome, format_outcome
from .progress import RoundProgress
from .rounds import PeerState, RoundBook, Slot
from .service import Coordinator
from .state import CoordinatorState, Effects

#: The earlier name of ``RoundProgress`` (``Progress`` is a byte-count callback elsewhere).
Progress = RoundProgress

__all__ = [
    "Admission",
    "AdmissionState",
    "Coordinator",
    "CoordinatorState",
    "Effects",
    "Journal",
    "PeerState",
    "Progress",
    "RoundBook",
    "RoundOutcome",
    "RoundProgress",
    "Slot",
    "Verdict",
    "admit",
    "format_outcome",
]
