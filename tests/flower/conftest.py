"""Flower replies built in-process from real Flower Messages (the transport is the only thing missing)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message, MetricRecord, RecordDict

from gradstore.flower import tensors_to_arrays
from gradstore.messages import SigningKey
from gradstore.node import KuboDaemon


class NodeIds:
    """The one thing FedAvg asks of Flower's Grid to sample clients: the connected node ids."""

    def __init__(self, ids: Iterable[int]) -> None:
        self.ids = list(ids)

    def get_node_ids(self) -> list[int]:
        return list(self.ids)


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "fc.weight": rng.standard_normal((8, 5)).astype(np.float32),
        "fc.bias": rng.standard_normal(8).astype(np.float32),
    }


def plain_reply(instruction: Message, arrays: dict[str, np.ndarray], n: int) -> Message:
    """What a plain Flower ClientApp sends back: arrays and num-examples."""
    content = RecordDict(
        {"arrays": tensors_to_arrays(arrays), "metrics": MetricRecord({"num-examples": n})}
    )
    return Message(content, reply_to=instruction)


@pytest.fixture
def keys() -> list[SigningKey]:
    return [SigningKey.from_seed(bytes([i + 1]) * 32) for i in range(4)]


@pytest.fixture
def api(kubo: KuboDaemon) -> Iterator[str]:
    yield kubo.api_url


@pytest.fixture
def key_files(tmp_path: Path, keys: list[SigningKey]) -> list[Path]:
    paths = []
    for i, key in enumerate(keys):
        path = tmp_path / f"client{i}.pem"
        key.save(path)
        paths.append(path)
    return paths


@pytest.fixture(autouse=True)
def serverapp_identity() -> Iterator[None]:
    """What a ServerApp process knows before it builds messages: its run, task and node ids
    (Flower 1.4x; earlier Flowers build messages without one)."""
    try:
        from flwr.supercore.task_identity import TaskIdentity
    except ImportError:
        yield
        return

    saved = (TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id)
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 1, 0
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved
