"""The round kernel: what running a round takes, whoever runs it (``Coordinator``, Flower's
``GradstoreStrategy``), as one public face.

- verify an input: ``verify_input`` fetches one by CID (one bounded attempt),
  ``verify_gradient`` takes one that came as arrays; both bind the document to its
  announcement (``Claim``), check it against the round's schema (``check_gradient``) and
  give a ``VerifiedInput``, or raise ``errors.RefusedError`` with the reason (its code and
  detail; ``InputRefused`` is its former name, kept);
- ``duplicates``: the announcements that repeat a CID another announced first;
- ``close_round``: aggregate the verified inputs, store the aggregate and the signed record;
- ``ByteBudget``: how many bytes of documents are held at once; ``FETCH_RETRY``: the waits
  between the attempts at an input;
- ``new_run_id``: a fresh run's id; ``Schema``, ``schema_of``, ``schema_text``.
"""

from __future__ import annotations

from .binding import Claim, check_binding, duplicates
from .closing import Closed, close_round
from .fetch_plan import FETCH_RETRY
from .inputs import (
    ByteBudget,
    InputRefused,
    VerifiedInput,
    check_gradient,
    tensor_infos,
    verify_gradient,
    verify_input,
)
from .journal import new_run_id
from .rounds import Schema, schema_of, schema_text

__all__ = [
    "FETCH_RETRY",
    "ByteBudget",
    "Claim",
    "Closed",
    "InputRefused",
    "Schema",
    "VerifiedInput",
    "check_binding",
    "check_gradient",
    "close_round",
    "duplicates",
    "new_run_id",
    "schema_of",
    "schema_text",
    "tensor_infos",
    "verify_gradient",
    "verify_input",
]
