"""One round at a time under each side, measured where the ServerApp sees the messages.

Sides: plain FedAvg; GradstoreStrategy(FedAvg) with clients replying by CID; the same with
the global model sent by CID too (``model_via="ipfs"``).

"Bytes over Flower" are the serialized sizes of Flower's message objects (what its
transport moves: each message's records, arrays in chunks), down (instructions) and up
(replies). A round's time runs from configure_train to the end of aggregate_train.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from gradstore.flower import GradstoreStrategy, arrays_to_tensors, tensors_to_arrays
from gradstore.format import DEFAULT_LIMITS

app = ServerApp()


def payload(obj: Any) -> int:
    """Bytes of a Flower object as its transport serializes it (the object and its children)."""
    return len(obj.deflate()) + sum(payload(c) for c in (obj.children or {}).values())


class Measured(Strategy):
    """Delegates to ``inner``; remembers the last train round's bytes and seconds."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner
        self.last: dict[str, float] = {}
        self._t0 = 0.0

    def summary(self) -> None:
        self.inner.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._t0 = time.perf_counter()
        messages = list(self.inner.configure_train(server_round, arrays, config, grid))
        self.last = {"down": sum(payload(m) for m in messages)}
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        self.last["up"] = sum(payload(m) for m in replies)
        self.last["replies"] = len(replies)
        t = time.perf_counter()
        result = self.inner.aggregate_train(server_round, replies)
        done = time.perf_counter()
        self.last["aggregate_s"] = done - t
        self.last["round_s"] = done - self._t0
        return result

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)


def model(mib: float, tensors: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    per = max(1, int(mib * 2**20 / 4 / tensors))
    return {f"layer{i}.weight": rng.standard_normal(per).astype(np.float32) for i in range(tensors)}


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    nodes = int(config["min-nodes"])
    initial = tensors_to_arrays(model(float(config["mib"]), int(config["tensors"])))

    def fedavg() -> FedAvg:
        return FedAvg(fraction_evaluate=0.0, min_train_nodes=nodes, min_available_nodes=nodes)

    api = str(config["gradstore-api"])
    with (
        GradstoreStrategy(fedavg(), node=api, job="bench") as replies_by_cid,
        GradstoreStrategy(fedavg(), node=api, job="bench", model_via="ipfs") as both_by_cid,
    ):
        sides = [
            ("flower", Measured(fedavg())),
            ("gradstore", Measured(replies_by_cid)),
            ("gradstore+model", Measured(both_by_cid)),
        ]
        for i in range(int(config["repeat"])):
            results = {}
            for side, strategy in sides[i % 3 :] + sides[: i % 3]:  # each side goes first in turn
                result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
                results[side] = arrays_to_tensors(result.arrays, DEFAULT_LIMITS)
                print("gradstore-bench " + json.dumps({"side": side, **strategy.last}), flush=True)
            agree = all(
                np.allclose(results["flower"][k], other[k], rtol=1e-6, atol=1e-7)
                for other in results.values()
                for k in results["flower"]
            )
            print("gradstore-bench " + json.dumps({"agree": agree}), flush=True)
        print("gradstore-bench done", flush=True)
