"""The event-driven aggregation coordinator: pure round rules inside a thin asyncio shell.

``state`` holds what the coordinator knows and makes every decision, with the pure rules
of ``admission`` (is an announcement accepted?), ``rounds`` (when does a round close, who
is aggregated?), ``fetch_plan`` (which input to fetch next?) and ``statuses`` (what do
peers hear?); ``service`` runs the tasks that wait for I/O, hand each event to the state
and apply the effects it returns (``effects``); ``inputs`` verifies one input, ``closing``
stores a round's (or a step's) aggregate and record, and ``closer`` closes each step of a
round on its own and then the round; ``steps`` names a job's steps as the coordinator runs
them; ``journal`` makes it all durable. A tree job's root is ``tree.TreeRoot`` (its
decisions ``tree_state``'s); its leaves are ``Coordinator``s closing into partial records
(``partial``).
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
from .outcome import RoundOutcome, format_outcome
from .progress import RoundProgress
from .rounds import PeerState, RoundBook, Slot
from .service import Coordinator
from .state import CoordinatorState, Effects
from .tree import TreeRoot

#: The earlier public name of ``RoundProgress``: each meaning of progress has a name of its own
#: (``gradstore.store.ByteProgress``, ``gradstore.demo.DemoProgressBar``).
Progress = RoundProgress

__all__ = [
    "FETCH_RETRY",
    "Admission",
    "AdmissionState",
    "ByteBudget",
    "Claim",
    "Closed",
    "Coordinator",
    "CoordinatorState",
    "Effects",
    "InputRefused",
    "Journal",
    "PeerState",
    "Progress",
    "RoundBook",
    "RoundOutcome",
    "RoundProgress",
    "Schema",
    "Slot",
    "TreeRoot",
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
