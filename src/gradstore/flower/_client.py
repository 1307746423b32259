"""The ClientApp side: reply to a gradstore strategy with a signed CID instead of arrays.

In CID mode (the default) the client puts its arrays into its own IPFS node as a
gradstore/1 document and its Flower reply carries only a signed announcement of the
document's CID (a few hundred bytes); the strategy fetches the document over IPFS and
verifies every block. In arrays mode the reply carries the arrays as plain Flower does,
plus the signed CID, which the strategy recomputes from the arrays. An instruction from a
strategy that is not gradstore's gets a plain Flower reply. ``model(msg)`` reads the
global model of an instruction, fetched by CID (every block verified) when the strategy
sends it over IPFS.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Final, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from ..dag import CID, file_cid
from ..errors import ConfigError, GradstoreError
from ..format import DEFAULT_LIMITS, Gradient, Limits, encode
from ..messages import Announce, SigningKey, encode_message
from ..node import Closing
from ._arrays import ArraysRefused, arrays_to_tensors, tensors_to_arrays
from ._loop import NodeLoop, NodeSource
from ._protocol import CONFIG_KEY, Instruction, reply_meta

Send = Literal["cid", "arrays"]

#: node_config / run_config keys ``GradstoreClient.from_context`` reads.
KEY_CONFIG: Final = "gradstore-key"
API_CONFIG: Final = "gradstore-api"
SEND_CONFIG: Final = "gradstore-send"


def instruction_of(msg: Message) -> Instruction | None:
    """The gradstore part of a train instruction, or None if a plain strategy sent it."""
    config = msg.content.config_records.get(CONFIG_KEY)
    return None if config is None else Instruction.from_config(config)


class GradstoreClient(Closing):
    """A ClientApp's identity (``key``), its node, and how it replies (``send``)."""

    def __init__(
        self,
        key: SigningKey,
        *,
        node: NodeSource | None = None,
        send: Send = "cid",
        weighted_by_key: str = "num-examples",
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        if send not in ("cid", "arrays"):
            raise ConfigError(f"send must be 'cid' or 'arrays', got {send!r}")
        if send == "cid" and node is None:
            raise ConfigError("send='cid' needs a node (the Kubo RPC URL) to put the document on")
        self.key = key
        self.send: Send = send
        self.weighted_by_key = weighted_by_key
        self.limits = limits
        self.last_cid: CID | None = None
        self._io = None if node is None else NodeLoop(node, limits=limits, name="gradstore-flower")

    @classmethod
    def from_context(cls, context: Context, **kwargs: Any) -> GradstoreClient:
        """The client a SuperNode's config describes: ``gradstore-key`` (a PEM key file),
        ``gradstore-api`` (else $GRADSTORE_API) and ``gradstore-send`` (``cid``/``arrays``),
        from ``--node-config`` first, then the run config."""
        config = {**context.run_config, **context.node_config}
        path = config.get(KEY_CONFIG)
        if not isinstance(path, str) or not path:
            raise ConfigError(
                f"this SuperNode has no {KEY_CONFIG!r} in its --node-config: give each client "
                "a key file (gradstore keygen --out FILE) so round records can name it"
            )
        api = config.get(API_CONFIG) or os.environ.get("GRADSTORE_API")
        send = config.get(SEND_CONFIG, "cid")
        kwargs.setdefault("node", api if isinstance(api, str) and api else None)
        kwargs.setdefault("send", send)
        return cls(SigningKey.load(path), **kwargs)

    def close(self) -> None:
        if self._io is not None:
            self._io.close()

    def model(self, msg: Message, key: str = "arrays") -> dict[str, np.ndarray[Any, Any]]:
        """The global model an instruction carries: fetched by its CID, every block verified,
        when the strategy sends it over IPFS; else read from its ArrayRecord ``key``."""
        ins = instruction_of(msg)
        if ins is not None and ins.model is not None:
            if self._io is None:
                raise GradstoreError(
                    f"the model comes by CID ({ins.model}): this client needs a node (api)"
                )
            cid = ins.model
            gradient = self._io.run(lambda store: store.get(cid))
            return dict(gradient.tensors)
        records = msg.content.array_records
        if key not in records:
            raise GradstoreError(f"the instruction carries no model (no ArrayRecord {key!r})")
        try:
            return arrays_to_tensors(records[key], self.limits)
        except ArraysRefused as exc:
            raise GradstoreError(f"the instruction's model: {exc.reason}") from None

    def reply(
        self,
        msg: Message,
        arrays: ArrayRecord | Mapping[str, Any],
        num_examples: int,
        metrics: Mapping[str, Any] | None = None,
    ) -> Message:
        """The train reply to ``msg``: the arrays as a signed CID (or with it), and metrics."""
        if type(num_examples) is not int or num_examples < 1:
            raise ValueError(f"num_examples must be a positive int, got {num_examples!r}")
        metric = MetricRecord(dict(metrics or {}))
        metric[self.weighted_by_key] = num_examples
        if isinstance(arrays, ArrayRecord):
            record = arrays
            try:
                tensors = arrays_to_tensors(arrays, self.limits)
            except ArraysRefused as exc:
                raise GradstoreError(f"cannot send these arrays: {exc.reason}") from None
        else:
            tensors = {name: np.asarray(value) for name, value in arrays.items()}
            record = tensors_to_arrays(tensors)
        ins = instruction_of(msg)
        if ins is None:  # a plain Flower strategy: a plain Flower reply
            return Message(RecordDict({"arrays": record, "metrics": metric}), reply_to=msg)
        gradient = Gradient(
            tensors, reply_meta(ins.job, ins.run, ins.round, self.key.did, num_examples)
        )
        content = RecordDict({"metrics": metric})
        if self.send == "cid":
            assert self._io is not None
            cid = self._io.run(lambda store: store.put(gradient))
        else:
            cid = file_cid(encode(gradient))
            content["arrays"] = record
        self.last_cid = cid
        announce = Announce(
            job=ins.job,
            run=ins.run,
            round=ins.round,
            peer=self.key.did,
            cid=str(cid),
            num_samples=num_examples,
            sent_at=int(time.time() * 1000),
        )
        content[CONFIG_KEY] = ConfigRecord({"announce": encode_message(announce, self.key)})
        return Message(content, reply_to=msg)
