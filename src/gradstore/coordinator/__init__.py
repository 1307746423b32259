"""The event-driven aggregation coordinator: pure round rules inside a thin asyncio shell.

``admission`` (is an announcement accepted?), ``rounds`` (when does a round close, who is
aggregated?), ``fetch_plan`` (which input to fetch next?) and ``statuses`` (what do peers
hear?) decide; ``service`` reads, calls them and acts; ``inputs`` verifies one input and
``closing`` stores a round's aggregate and record; ``journal`` makes it all durable.
``kernel`` is the part of them that any round runner uses (Flower's strategy does): it is
all exported here.
"""

from .admission import Admission, AdmissionState, Verdict, admit
from .journal import Journal
from .kernel import (
    FETCH_RETRY,
    ByteBudget,
    Claim,
    Closed,
    InputRefused,
    Schema,
    VerifiedInput,
    check_binding,
    check_gradient,
    close_round,
    duplicates,
    new_run_id,
    schema_of,
    schema_text,
    tensor_infos,
    verify_gradient,
    verify_input,
)
from .rounds import PeerState, RoundBook, Slot
from .service import Coordinator, Progress, RoundOutcome, format_outcome

__all__ = [
    "FETCH_RETRY",
    "Admission",
    "AdmissionState",
    "ByteBudget",
    "Claim",
    "Closed",
    "Coordinator",
    "InputRefused",
    "Journal",
    "PeerState",
    "Progress",
    "RoundBook",
    "RoundOutcome",
    "Schema",
    "Slot",
    "Verdict",
    "VerifiedInput",
    "admit",
    "check_binding",
    "check_gradient",
    "close_round",
    "duplicates",
    "format_outcome",
    "new_run_id",
    "schema_of",
    "schema_text",
    "tensor_infos",
    "verify_gradient",
    "verify_input",
]
