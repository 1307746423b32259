"""Flower bridge (extra ``flower``): gradstore rounds inside a Flower run.

    from gradstore.flower import GradstoreStrategy, GradstoreClient, record_cid

Server side, ``GradstoreStrategy(FedAvg(), node="http://127.0.0.1:5001")`` wraps a Flower
strategy that aggregates as FedAvg does (FedAvg when none is given; one with its own
aggregation is refused, see ``_inner``): every client reply becomes a verified gradstore/1
document, the arrays are aggregated by gradstore's deterministic aggregators in peer order,
and each round leaves a signed round record, pinned, whose CID is in the round's metrics
(``record_cid(metrics)``) and which ``gradstore audit round`` re-derives. Client side,
``GradstoreClient.from_context(context).reply(msg, arrays, num_examples)`` answers with a
signed CID instead of the arrays, so they travel over IPFS, verified block by block.
"""

try:
    import flwr as _flwr  # noqa: F401  (fail here, with the extra's name, if Flower is missing)
except ImportError:
    from ..errors import MissingExtraError

    raise MissingExtraError(
        "flower", "gradstore.flower (Flower strategies and ClientApps)"
    ) from None

from ._arrays import ArraysRefused, arrays_to_tensors, record_nbytes, tensors_to_arrays
from ._client import GradstoreClient, instruction_of
from ._protocol import (
    CONFIG_KEY,
    EXCLUDED_METRIC,
    INPUTS_METRIC,
    RECORD_METRIC,
    Instruction,
    custodial_did,
    record_cid,
    reply_meta,
)
from ._strategy import FlowerRound, GradstoreStrategy

__all__ = [
    "CONFIG_KEY",
    "EXCLUDED_METRIC",
    "INPUTS_METRIC",
    "RECORD_METRIC",
    "ArraysRefused",
    "FlowerRound",
    "GradstoreClient",
    "GradstoreStrategy",
    "Instruction",
    "arrays_to_tensors",
    "custodial_did",
    "instruction_of",
    "record_cid",
    "record_nbytes",
    "reply_meta",
    "tensors_to_arrays",
]
