"""Flower's ``server_round`` N is gradstore round N, as docs/frameworks.md says: the strategy's
record for Flower's round N has ``round`` N, and ``gradstore round show`` reads it as Flower's."""

from __future__ import annotations

import asyncio
import json

import pytest
from flwr.app import ConfigRecord

from gradstore.audit import fetch_record
from gradstore.cli import main
from gradstore.flower import GradstoreStrategy, tensors_to_arrays
from gradstore.node import KuboNode

from .conftest import NodeIds, model, plain_reply


def test_flowers_round_n_is_the_records_round_n(
    api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with GradstoreStrategy(node=api) as strategy:
        for server_round in (1, 2):  # Flower's first train round is 1 (0 evaluates the start)
            arrays = tensors_to_arrays(model(0))
            msgs = strategy.configure_train(server_round, arrays, ConfigRecord(), NodeIds([1, 2]))
            replies = [plain_reply(m, model(i), 5) for i, m in enumerate(msgs)]
            strategy.aggregate_train(server_round, replies)
        records = strategy.records
    assert sorted(records) == [1, 2]

    async def rounds() -> list[int]:
        async with KuboNode(api) as node:
            return [(await fetch_record(node, records[r]))[1].round for r in (1, 2)]

    assert asyncio.run(rounds()) == [1, 2]
    capsys.readouterr()
    assert main(["round", "show", str(records[2]), "--api", api]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["round"] == 2
    assert shown["numbering"]["flower"] == (
        "Flower's server_round 2, when a GradstoreStrategy wrote it (Flower counts from 1)"
    )
