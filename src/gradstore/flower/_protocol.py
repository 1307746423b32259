"""What the strategy and its clients put into Flower's messages, and how peers are named.

The strategy adds one ConfigRecord under ``"gradstore"`` to every train instruction:
``job``, ``run``, ``round``, ``coordinator``, and ``model`` (the global model's CID) when
the model travels over IPFS instead of in the instruction's ArrayRecord. A gradstore client answers with a
ConfigRecord under the same key holding ``announce``: a signed gradstore announcement
(``messages.Announce``: job, run, round, its did, the CID of its document, its sample
count), next to the ArrayRecord (arrays mode) or instead of it (CID mode).

Flower's MetricRecord holds numbers only, so the round record's CID travels in the
round's metrics as the list of its binary bytes (``gradstore.record``); ``record_cid``
turns it back into a CID.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..dag import CID
from ..errors import CIDError
from ..messages import SigningKey

#: The key of gradstore's ConfigRecord in instructions and replies.
CONFIG_KEY: Final = "gradstore"
#: Metric keys the strategy adds to each train round's MetricRecord.
RECORD_METRIC: Final = "gradstore.record"
INPUTS_METRIC: Final = "gradstore.inputs"
EXCLUDED_METRIC: Final = "gradstore.excluded"


@dataclass(frozen=True)
class Instruction:
    """The gradstore part of a train instruction: which round of which run, for whom."""

    job: str
    run: str
    round: int
    coordinator: str
    model: str | None = None  # the global model's CID, when it travels over IPFS

    def to_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "job": self.job,
            "run": self.run,
            "round": self.round,
            "coordinator": self.coordinator,
        }
        if self.model is not None:
            config["model"] = self.model
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Instruction | None:
        """The instruction in ``config``, or None when it is not a gradstore instruction."""
        job, run, round_, coordinator, model = (
            config.get(k) for k in ("job", "run", "round", "coordinator", "model")
        )
        if not (
            isinstance(job, str)
            and isinstance(run, str)
            and type(round_) is int
            and isinstance(coordinator, str)
            and (model is None or isinstance(model, str))
        ):
            return None
        return cls(job, run, round_, coordinator, model)


def reply_meta(job: str, run: str, round_: int, peer: str, num_samples: int) -> dict[str, Any]:
    """The meta of a client's document: the client computes its CID with it, the strategy too."""
    return {
        "kind": "gradient",
        "job": job,
        "run": run,
        "round": round_,
        "peer": peer,
        "num_samples": num_samples,
    }


def model_meta(job: str, run: str, round_: int) -> dict[str, Any]:
    """The meta of the global model the strategy sends by CID for ``round_``."""
    return {"kind": "model", "job": job, "run": run, "round": round_}


def custodial_key(secret: bytes, node_id: int) -> SigningKey:
    """The key the strategy names (and signs for) a client by when the client signs nothing.

    An Ed25519 key whose seed is HMAC-SHA256(secret, node id): stable for one strategy
    (one run), unlinkable across runs, and nobody but the strategy holds its private key.
    The round record's ``peer_sig`` of such a client is the strategy's word, not the client's.
    """
    seed = hmac.new(secret, f"gradstore/flower/node/{node_id}".encode(), hashlib.sha256).digest()
    return SigningKey.from_seed(seed)


def custodial_did(secret: bytes, node_id: int) -> str:
    """The did of :func:`custodial_key`: how the strategy names a client that signs nothing."""
    return custodial_key(secret, node_id).did


def cid_metric(cid: CID) -> list[int]:
    """A CID as a MetricRecord value: the list of its binary bytes."""
    return list(cid.bytes)


def record_cid(metrics: Mapping[str, Any]) -> CID:
    """The round record's CID carried in a train round's metrics (``gradstore.record``)."""
    value = metrics.get(RECORD_METRIC)
    if not isinstance(value, list) or not all(type(b) is int and 0 <= b < 256 for b in value):
        raise CIDError(f"metrics hold no {RECORD_METRIC!r} (a list of CID bytes)")
    return CID.from_bytes(bytes(value))
