"""GradstoreStrategy on a real Kubo, fed real Flower Messages (honest and hostile replies).

Flower's transport is the only missing part: instructions come from the strategy's own
``configure_train`` (FedAvg sampling), replies are built as ClientApps build them.
``test_example.py`` runs the same code through Flower's own processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from gradstore.aggregate import AggregationParams, aggregate
from gradstore.audit import fetch_record, verify_round
from gradstore.dag import CID, file_cid
from gradstore.flower import (
    CONFIG_KEY,
    GradstoreClient,
    GradstoreStrategy,
    record_cid,
    reply_meta,
    tensors_to_arrays,
)
from gradstore.format import Gradient, Limits, encode
from gradstore.messages import Announce, SigningKey, encode_message
from gradstore.node import KuboDaemon, KuboNode

from .conftest import NodeIds, model, plain_reply


def _instructions(strategy: GradstoreStrategy, n: int, round_: int = 1) -> list[Message]:
    arrays = tensors_to_arrays(model(0))
    return list(strategy.configure_train(round_, arrays, ConfigRecord(), NodeIds(range(1, n + 1))))


def _signed(
    instruction: Message,
    key: SigningKey,
    cid: CID | str,
    n: int,
    *,
    arrays: dict[str, np.ndarray] | None = None,
    **override: Any,
) -> Message:
    """A signed reply as a (possibly lying) client builds it by hand."""
    config = instruction.content[CONFIG_KEY]
    fields: dict[str, Any] = {
        "job": config["job"],
        "run": config["run"],
        "round": config["round"],
        "peer": key.did,
        "cid": str(cid),
        "num_samples": n,
        "sent_at": 1,
    }
    fields.update(override)
    content = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": n}),
            CONFIG_KEY: ConfigRecord({"announce": encode_message(Announce(**fields), key)}),
        }
    )
    if arrays is not None:
        content["arrays"] = tensors_to_arrays(arrays)
    return Message(content, reply_to=instruction)


def _verify(api: str, rcid: CID) -> Any:
    async def go() -> Any:
        async with KuboNode(api) as node:
            report = await verify_round(node, rcid)
            return report.record

    return asyncio.run(go())


def _fedavg(inputs: list[tuple[str, dict[str, np.ndarray], int]]) -> dict[str, np.ndarray]:
    """The reference: gradstore's fedavg over the inputs sorted by peer did."""
    ordered = sorted(inputs, key=lambda i: i[0])
    return aggregate(
        [t for _, t, _ in ordered], AggregationParams("fedavg"), [n for _, _, n in ordered]
    )


@pytest.fixture
def strategy(api: str) -> Iterator[GradstoreStrategy]:
    with GradstoreStrategy(node=api, resolve_timeout_s=2.0, fetch_attempts=1) as s:
        yield s


def test_cid_arrays_and_plain_replies_make_one_verified_round(
    api: str, strategy: GradstoreStrategy, keys: list[SigningKey]
) -> None:
    msgs = _instructions(strategy, 3)
    with GradstoreClient(keys[0], node=api) as by_cid:
        replies = [
            by_cid.reply(msgs[0], model(1), 10, {"loss": 1.0}),
            GradstoreClient(keys[1], send="arrays").reply(msgs[1], model(2), 30, {"loss": 2.0}),
            plain_reply(msgs[2], model(3), 20),
        ]
    cid_reply = replies[0].content
    assert not cid_reply.array_records  # CID mode: no arrays crossed Flower
    assert len(cid_reply[CONFIG_KEY]["announce"]) < 400

    arrays, metrics = strategy.aggregate_train(1, replies)

    assert arrays is not None and metrics is not None
    assert list(arrays.keys()) == list(model(0).keys())  # Flower's order, not gradstore's
    plain_did = strategy._custodial(msgs[2].metadata.dst_node_id)
    expected = _fedavg(
        [(keys[0].did, model(1), 10), (keys[1].did, model(2), 30), (plain_did, model(3), 20)]
    )
    for name, array in arrays.items():
        assert array.numpy().tobytes() == expected[name].tobytes(), name
    # FedAvg weighs metrics by num-examples over every accepted reply (the plain one has no loss)
    assert metrics["loss"] == pytest.approx((1.0 * 10 + 2.0 * 30) / 60)
    assert metrics["gradstore.inputs"] == 3 and metrics["gradstore.excluded"] == 0

    rcid = record_cid(metrics)
    assert strategy.records == {1: rcid}
    record = _verify(api, rcid)  # the audit tool re-derives the output CID
    assert record.run == strategy.run_id and record.coordinator == strategy.key.did
    assert {i.peer for i in record.inputs} == {keys[0].did, keys[1].did, plain_did}
    assert record.prev is None


def test_records_chain_and_a_node_keeps_its_did(
    api: str, strategy: GradstoreStrategy, keys: list[SigningKey]
) -> None:
    first = strategy.aggregate_train(
        1, [plain_reply(m, model(i), 5) for i, m in enumerate(_instructions(strategy, 2, 1))]
    )[1]
    msgs = _instructions(strategy, 2, 2)
    # a node now signs with a key: it was named by its custodial did in round 1
    client = GradstoreClient(keys[0], send="arrays")
    second = strategy.aggregate_train(
        2, [client.reply(msgs[0], model(4), 5), plain_reply(msgs[1], model(5), 5)]
    )[1]
    assert first is not None and second is not None
    excluded = strategy.history[2].excluded
    node = msgs[0].metadata.dst_node_id  # FedAvg samples in random order
    assert len(excluded) == 1 and excluded[0][1].startswith(f"identity: node {node} replied as")

    async def prev() -> CID | None:
        async with KuboNode(api) as node:
            return (await fetch_record(node, record_cid(second)))[1].prev

    assert asyncio.run(prev()) == record_cid(first)


class _FlipBlock(httpx.AsyncBaseTransport):
    """In front of a real Kubo: flips one byte of the blocks ``block/get`` serves for ``cid``."""

    def __init__(self, cid: str) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.cid = cid

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if not request.url.path.endswith("/block/get") or request.url.params["arg"] != self.cid:
            return response
        body = bytearray(await response.aread())
        body[len(body) // 2] ^= 0x01
        return httpx.Response(response.status_code, headers=response.headers, content=bytes(body))

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_hostile_replies_are_refused_with_their_reasons_and_the_round_goes_on(
    api: str, kubo: KuboDaemon, keys: list[SigningKey]
) -> None:
    honest, liar = keys[:2], keys[2]
    other = [SigningKey.from_seed(bytes([40 + i]) * 32) for i in range(8)]

    async def put(gradient: Gradient) -> CID:
        from gradstore.store import GradientStore

        async with KuboNode(api) as node:
            return await GradientStore(node).put(gradient)

    def doc(tensors: dict[str, np.ndarray], key: SigningKey, run: str, n: int) -> Gradient:
        return Gradient(tensors, reply_meta("flower", run, 1, key.did, n))

    # the strategy reaches Kubo through a transport that corrupts one document's block
    flipped: list[str] = []

    def node() -> KuboNode:
        return KuboNode(api, transport=_FlipBlock(flipped[0]))

    with GradstoreStrategy(node=node, resolve_timeout_s=1.0, fetch_attempts=2) as strategy:
        msgs = _instructions(strategy, 12)
        run = strategy.run_id
        bad_block = asyncio.run(put(doc(model(6), other[0], run, 5)))
        flipped.append(str(bad_block))
        nan = model(7)
        nan["fc.bias"][3] = np.nan
        nan_cid = asyncio.run(put(doc(nan, other[1], run, 5)))
        wrong_shape = {"fc.weight": np.zeros((8, 6), np.float32), "fc.bias": model(0)["fc.bias"]}
        shape_cid = asyncio.run(put(doc(wrong_shape, other[2], run, 5)))
        nobody = file_cid(encode(doc(model(8), other[3], run, 5)))  # never stored anywhere
        lie = _signed(
            msgs[2], liar, file_cid(encode(doc(model(9), liar, run, 5))), 5, arrays=model(10)
        )
        tampered = _signed(msgs[8], other[4], nobody, 5)
        signed = tampered.content[CONFIG_KEY]["announce"]
        assert isinstance(signed, bytes)
        tampered.content[CONFIG_KEY]["announce"] = signed[:-1] + bytes([signed[-1] ^ 1])
        replies = [
            GradstoreClient(honest[0], send="arrays").reply(msgs[0], model(1), 10),
            GradstoreClient(honest[1], send="arrays").reply(msgs[1], model(2), 30),
            lie,  # arrays that do not make the CID it signed
            _signed(msgs[3], other[0], bad_block, 5),  # its block comes back altered
            _signed(msgs[4], other[1], nan_cid, 5),
            _signed(msgs[5], other[2], shape_cid, 5),
            _signed(msgs[6], other[3], nobody, 5),  # nobody serves it
            _signed(msgs[7], other[5], nobody, 5, run="a" * 26),  # another run's announcement
            tampered,
            _signed(msgs[9], other[6], nobody, 5, round=2),
            Message(RecordDict({"metrics": MetricRecord({"num-examples": 3})}), reply_to=msgs[10]),
            _signed(msgs[11], honest[0], nobody, 5),  # honest[0]'s did, from another node
        ]
        arrays, metrics = strategy.aggregate_train(1, replies)

    assert arrays is not None and metrics is not None
    expected = _fedavg([(honest[0].did, model(1), 10), (honest[1].did, model(2), 30)])
    for name, array in arrays.items():
        assert array.numpy().tobytes() == expected[name].tobytes(), name
    reasons = dict(strategy.history[1].excluded)
    codes = {peer: reason.split(":")[0] for peer, reason in strategy.history[1].excluded}
    assert codes[liar.did] == "integrity", reasons[liar.did]
    assert codes[other[0].did] == "integrity", reasons[other[0].did]
    assert codes[other[1].did] == "non-finite"
    assert codes[other[2].did] == "schema-mismatch"
    assert codes[other[3].did] == "unavailable"
    assert "after 2 attempts" in reasons[other[3].did]
    assert codes[other[5].did] == "wrong-run"
    assert codes[other[6].did] == "wrong-round"
    assert codes[strategy._custodial(msgs[8].metadata.dst_node_id)] == "bad-signature"
    assert codes[strategy._custodial(msgs[10].metadata.dst_node_id)] == "malformed"
    assert any(
        r.startswith("identity: ") for p, r in strategy.history[1].excluded if p == honest[0].did
    )
    assert metrics["gradstore.excluded"] == len(strategy.history[1].excluded) == 10

    record = _verify(api, record_cid(metrics))  # the round survives, and verifies
    assert [i.peer for i in record.inputs] == sorted([honest[0].did, honest[1].did])
    recorded = {(e.peer, e.reason) for e in record.excluded}
    assert recorded == set(strategy.history[1].excluded)
    assert {str(e.cid) for e in record.excluded if e.peer == other[0].did} == {str(bad_block)}


def test_only_listed_peers_may_contribute(api: str, keys: list[SigningKey]) -> None:
    with GradstoreStrategy(node=api, peers=[keys[0].did]) as strategy:
        msgs = _instructions(strategy, 3)
        replies = [
            GradstoreClient(keys[0], send="arrays").reply(msgs[0], model(1), 4),
            GradstoreClient(keys[1], send="arrays").reply(msgs[1], model(2), 4),
            plain_reply(msgs[2], model(3), 4),
        ]
        arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    codes = sorted(r.split(":")[0] for _, r in strategy.history[1].excluded)
    assert codes == ["unknown-peer", "unsigned"]
    assert [p for p, _ in strategy.history[1].inputs] == [keys[0].did]


def test_a_round_where_every_reply_is_refused_returns_no_arrays(api: str) -> None:
    with GradstoreStrategy(node=api, limits=Limits(max_bytes=64)) as strategy:
        msgs = _instructions(strategy, 2)
        arrays, metrics = strategy.aggregate_train(1, [plain_reply(m, model(1), 3) for m in msgs])
    assert arrays is None and metrics is not None
    assert metrics["gradstore.inputs"] == 0 and "gradstore.record" not in metrics
    assert all(r.startswith("too-large: ") for _, r in strategy.history[1].excluded)
    assert strategy.records == {}


def _payload(obj: Any) -> int:
    """Bytes of a Flower object as its transport serializes it (the object and its children)."""
    return len(obj.deflate()) + sum(_payload(c) for c in (obj.children or {}).values())


def test_the_model_can_travel_by_cid_too(api: str, keys: list[SigningKey]) -> None:
    with GradstoreStrategy(node=api, model_via="ipfs") as strategy:
        msgs = _instructions(strategy, 2)
        assert all(not m.content.array_records for m in msgs)
        with GradstoreClient(keys[0], node=api) as a, GradstoreClient(keys[1], node=api) as b:
            got = a.model(msgs[0])  # fetched by CID, every block verified
            assert {k: v.tobytes() for k, v in got.items()} == {
                k: v.tobytes() for k, v in model(0).items()
            }
            replies = [
                client.reply(msg, {k: v + i for k, v in client.model(msg).items()}, 5)
                for i, (client, msg) in enumerate(((a, msgs[0]), (b, msgs[1])))
            ]
        carried = sum(_payload(m) for m in [*msgs, *replies])
        arrays, metrics = strategy.aggregate_train(1, replies)
    assert carried < 4096  # both ways, two clients: no arrays crossed Flower
    assert arrays is not None and metrics is not None
    assert _verify(api, record_cid(metrics)).inputs
    expected = {k: (v + v + 1) / 2 for k, v in model(0).items()}
    for name, array in arrays.items():
        np.testing.assert_allclose(array.numpy(), expected[name], rtol=1e-6)


def test_inputs_beyond_the_memory_budget_are_read_back_with_the_same_bits(
    api: str, keys: list[SigningKey]
) -> None:
    results = []
    for keep in (1 << 30, 1):  # all in memory; none (read back from the node range by range)
        with GradstoreStrategy(node=api, keep_bytes=keep) as strategy:
            msgs = _instructions(strategy, 3)
            with GradstoreClient(keys[0], node=api) as a, GradstoreClient(keys[1], node=api) as b:
                replies = [
                    a.reply(msgs[0], model(1), 7),
                    b.reply(msgs[1], model(2), 9),
                    GradstoreClient(keys[2], send="arrays").reply(msgs[2], model(3), 11),
                ]
            arrays, metrics = strategy.aggregate_train(1, replies)
        assert arrays is not None and metrics is not None
        _verify(api, record_cid(metrics))
        results.append({k: v.numpy().tobytes() for k, v in arrays.items()})
    assert results[0] == results[1]


def test_any_flower_strategy_chooses_and_any_gradstore_method_combines(
    api: str, keys: list[SigningKey]
) -> None:
    from flwr.serverapp.strategy import FedProx

    inner = FedProx(proximal_mu=0.25, min_train_nodes=3, min_available_nodes=3)
    with GradstoreStrategy(inner, node=api, method="median") as strategy:
        msgs = _instructions(strategy, 3)
        assert all(m.content["config"]["proximal-mu"] == 0.25 for m in msgs)  # FedProx's own
        clients = [GradstoreClient(k, send="arrays") for k in keys[:3]]
        values = [model(i + 1) for i in range(3)]
        replies = [c.reply(m, v, 5) for c, m, v in zip(clients, msgs, values, strict=True)]
        arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    for name, array in arrays.items():
        expected = np.median(np.stack([v[name] for v in values]), axis=0)
        assert array.numpy().tobytes() == expected.astype(np.float32).tobytes(), name
    record = _verify(api, record_cid(metrics))
    assert record.method == "median"


def _put(api: str, gradient: Gradient) -> CID:
    from gradstore.store import GradientStore

    async def go() -> CID:
        async with KuboNode(api) as node:
            return await GradientStore(node).put(gradient)

    return asyncio.run(go())


def test_a_client_returning_another_clients_cid_is_refused_as_wrong_peer(
    api: str, strategy: GradstoreStrategy, keys: list[SigningKey]
) -> None:
    # Defect: in CID mode the strategy fetched whatever CID a client signed, so a client
    # could return another client's CID (or its own of the last round) and be aggregated.
    msgs = _instructions(strategy, 3, 1)
    with GradstoreClient(keys[0], node=api) as honest:
        first = honest.reply(msgs[0], model(1), 10)
        taken = honest.last_cid
        assert taken is not None
        replies = [first, _signed(msgs[1], keys[1], taken, 10)]
        arrays, metrics = strategy.aggregate_train(1, replies)
        assert arrays is not None and metrics is not None
        assert strategy.history[1].inputs == ((keys[0].did, taken),)
        reason = dict(strategy.history[1].excluded)[keys[1].did]
        assert reason.startswith(f"wrong-peer: the document names peer '{keys[0].did}'")
        record = _verify(api, record_cid(metrics))
        assert {(e.peer, e.reason, e.cid) for e in record.excluded} == {
            (keys[1].did, reason, taken)
        }

        # the next round, the honest client announces its document of round 1 again
        nodes = {m.metadata.dst_node_id: m for m in _instructions(strategy, 3, 2)}
        again = nodes[msgs[0].metadata.dst_node_id]  # each did keeps its Flower node
        other = nodes[msgs[1].metadata.dst_node_id]
        replies = [
            _signed(again, keys[0], taken, 10),
            GradstoreClient(keys[1], send="arrays").reply(other, model(2), 10),
        ]
        strategy.aggregate_train(2, replies)
    assert [p for p, _ in strategy.history[2].inputs] == [keys[1].did]
    assert dict(strategy.history[2].excluded) == {
        keys[0].did: "wrong-round: the document names round 1, announced for round 2"
    }


def test_one_document_without_meta_counts_once_and_a_strategy_may_require_meta(
    api: str, keys: list[SigningKey]
) -> None:
    bare = _put(api, Gradient(model(4)))  # names no peer, round or job
    for require, codes in ((False, ["duplicate-cid"]), (True, ["unbound", "unbound"])):
        with GradstoreStrategy(node=api, require_bound_meta=require) as strategy:
            msgs = _instructions(strategy, 3)
            with GradstoreClient(keys[2], node=api) as bound:
                replies = [
                    _signed(msgs[0], keys[0], bare, 5),
                    _signed(msgs[1], keys[1], bare, 5),
                    bound.reply(msgs[2], model(5), 5),  # its document names it: always welcome
                ]
                arrays, _ = strategy.aggregate_train(1, replies)
        assert arrays is not None
        excluded = dict(strategy.history[1].excluded)
        assert sorted(r.split(":")[0] for r in excluded.values()) == codes
        inputs = {p for p, _ in strategy.history[1].inputs}
        if require:
            assert inputs == {keys[2].did}
        else:
            assert inputs == {keys[0].did, keys[2].did}  # the first reply keeps the CID
            assert excluded[keys[1].did] == (
                f"duplicate-cid: {bare} was announced first by {keys[0].did}"
            )
