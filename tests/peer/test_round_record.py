"""A peer that missed a step's result reads it from the round/5 record (issue 19, the bounded
beacon): once a stepped round's own result is out, the coordinator stops repeating its
steps' results, and the record the signed round result names links every step's record.

Against a scripted coordinator on real Kubo that publishes the round's result alone (as a
peer that joined late, or lost the step messages, hears it), with real signed records on
the coordinator's node. The hostile cases: a record that is not the one the result names,
or that links a step record of another step, round or run, is an error, never an outcome.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest

from gradstore.dag import CID
from gradstore.dag.cid import DAG_CBOR
from gradstore.errors import MessageError, Reason, RefusedError, RoundFailedError
from gradstore.format import Gradient
from gradstore.job import JobConfig
from gradstore.messages import (
    RecordExclusion,
    RecordInput,
    RoundStep,
    SigningKey,
    SteppedRoundRecord,
    StepRecord,
    encode_step_record,
    encode_stepped_record,
)
from gradstore.node import KuboNode
from gradstore.peer import AggregateResult, StepFailed
from gradstore.store import GradientStore

from ..coordinator.harness import key
from .scripted import RUN, STEP_TENSORS, stepped_job
from .test_steps import stage

pytestmark = pytest.mark.kubo

NON_FINITE = "non-finite: tensor 'embed' holds NaN or Inf"


@dataclass
class Records:
    """A round's signed records as stored on the coordinator's node: the round/5 record
    (``cid``), the model-level output, and each closed step's record and aggregate."""

    cid: CID
    model: CID
    steps: dict[str, tuple[CID, CID]] = field(default_factory=dict)  # step: (record, output)


async def _put(node: KuboNode, cid: CID, data: bytes) -> None:
    assert await node.put_block(data, DAG_CBOR) == cid


def _input(peer: str, n: int) -> RecordInput:
    return RecordInput(peer, CID.hash(0x55, peer.encode()), n, 1.0, None, 1, bytes(64))


def _step(config: JobConfig, coord: SigningKey, round_: int, step: str, output: CID,
          peers: list[str], excluded: tuple[RecordExclusion, ...] = (),
          run: str = RUN) -> StepRecord:  # fmt: skip
    return StepRecord(
        job=config.job,
        run=run,
        round=round_,
        step=step,
        tensors=tuple(str(t) for t in next(s.tensors for s in config.steps if s.name == step)),
        method="mean",
        params={},
        inputs=tuple(_input(p, 3) for p in peers),
        excluded=excluded,
        output=output,
        coordinator=coord.did,
    )


async def store_round(
    node: KuboNode,
    config: JobConfig,
    coord: SigningKey,
    round_: int,
    *,
    hostile: str | None = None,
) -> Records:
    """Round ``round_``'s records: head closed (both peers), body failed, embed closed
    (peer 1; peer 0 excluded as non-finite); ``hostile`` forges one thing."""
    dids = [p for p in config.roster]
    store = GradientStore(node)
    outputs = {}
    for value, step in enumerate(("head", "embed"), 1):
        tensors = {n: np.full(3, float(value + round_), np.float32) for n in STEP_TENSORS[step]}
        outputs[step] = await store.put(Gradient(tensors, {"kind": "aggregate", "step": step}))
    model = await store.put(Gradient({"head.b": np.zeros(3, np.float32)}, {"round": round_}))
    exclusion = (RecordExclusion(dids[0], NON_FINITE),)
    head = _step(config, coord, round_, "head", outputs["head"], dids,
                 run="another0000000000000run00" if hostile == "step-of-another-run" else RUN)  # fmt: skip
    if hostile == "step-of-another-round":
        head = dataclasses.replace(head, round=round_ + 100)
    embed = _step(config, coord, round_, "embed", outputs["embed"], dids[1:], exclusion)
    records = Records(CID.hash(DAG_CBOR, b""), model)
    for rec in (head, embed):
        cid, data = encode_step_record(rec, coord)
        await _put(node, cid, data)
        records.steps[rec.step] = (cid, rec.output)
    head_link = records.steps["embed" if hostile == "another-steps-record" else "head"]
    steps = [
        RoundStep("head", record=head_link[0], output=head_link[1]),
        RoundStep("body", failed="quorum not met: 0 verified of 1 needed"),
        RoundStep("embed", record=records.steps["embed"][0], output=outputs["embed"]),
    ]
    if hostile == "no-such-step":
        steps = steps[1:]
    signer, by = coord, coord.did
    if hostile == "not-the-coordinators":
        signer = key(55)
        by = signer.did
    record = SteppedRoundRecord(
        job=config.job,
        run="another0000000000000run00" if hostile == "another-run" else RUN,
        round=round_,
        steps=tuple(steps),
        output=model,
        prev=None,
        coordinator=by,
    )
    records.cid, data = encode_stepped_record(record, signer)
    await _put(node, records.cid, data)
    return records


def test_a_peer_that_missed_the_steps_results_reads_them_from_the_round_record(  # type: ignore[no-untyped-def]
    kubo_factory,
) -> None:
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    dids = [k.did for k in keys]

    async def go() -> None:
        async with stage(daemons, config, coord, keys) as (c, (p0, p1), coord_node):
            records = await store_round(coord_node, config, coord, 0)
            # the round's result alone: each step's result was missed (sent before, or lost)
            await c.result(0, None, records.model, dids, records.cid)
            head = await p0.await_result(0, step="head", timeout=30)
            assert isinstance(head, AggregateResult) and head.step == "head"
            assert (head.cid, head.record) == (records.steps["head"][1], records.steps["head"][0])
            assert head.peers == tuple(dids)
            np.testing.assert_array_equal(head.gradient.tensors["head.w"], np.full(3, 1.0))
            with pytest.raises(RoundFailedError) as failed:
                await p0.await_result(0, step="body", timeout=30)
            assert failed.value.step == "body"
            assert failed.value.reason == "quorum not met: 0 verified of 1 needed"
            # every step once; aggregates in the order their (concurrent) fetches end
            got = {i.step: i async for i in p1.step_results(0, timeout=30)}
            assert sorted(got) == ["body", "embed", "head"]
            assert got["body"] == StepFailed(0, "body", "quorum not met: 0 verified of 1 needed")
            embed = got["embed"]
            assert isinstance(embed, AggregateResult) and embed.peers == (dids[1],)
            # the peers' own inputs: verified by the record, or refused with its reason
            mine = await p1.publish(_part("head"), 0, 3, step="head", timeout=30)
            assert isinstance(mine, CID)
            with pytest.raises(RefusedError) as refused:
                await p0.publish(_part("embed"), 0, 3, step="embed", timeout=30)
            assert refused.value.code is Reason.NON_FINITE and refused.value.step == "embed"
            assert refused.value.reason == NON_FINITE

    asyncio.run(go())


def _part(step: str) -> Gradient:
    return Gradient({n: np.ones(3, np.float32) for n in STEP_TENSORS[step]})


HOSTILE = {
    "another-steps-record": "which is step 'embed''s",
    "step-of-another-round": "of another job, run or round",
    "step-of-another-run": "of another job, run or round",
    "another-run": "the result says run",
    "not-the-coordinators": "by its coordinator",
    "no-such-step": "has no step 'head'",
}


def test_a_round_record_that_does_not_match_its_result_is_an_error(kubo_factory) -> None:  # type: ignore[no-untyped-def]
    """Each forged record of its own round (1, 2, ...): ``await_result`` raises MessageError
    naming what does not match, and yields no outcome; a result whose output is not the
    record's is refused the same way."""
    daemons = kubo_factory(2, connect=True)
    config, coord, keys = stepped_job()
    dids = [k.did for k in keys]

    async def go() -> dict[str, str]:
        said: dict[str, str] = {}
        async with stage(daemons, config, coord, keys) as (c, (p0, _), coord_node):
            cases = [*HOSTILE, "another-output"]
            for round_, case in enumerate(cases, 1):
                records = await store_round(
                    coord_node,
                    config,
                    coord,
                    round_,
                    hostile=None if case == "another-output" else case,
                )
                model = records.steps["head"][1] if case == "another-output" else records.model
                await c.result(round_, None, model, dids, records.cid)
                with pytest.raises(MessageError) as info:
                    await p0.await_result(round_, step="head", timeout=30)
                assert info.value.code is Reason.MALFORMED
                said[case] = str(info.value)
        return said

    said = asyncio.run(go())
    for case, text in HOSTILE.items():
        assert text in said[case], (case, said[case])
    assert "the result says" in said["another-output"]
