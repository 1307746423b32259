"""`audit round` and `audit history` on stepped rounds (round/5 records): every step record is
audited as a round/4 record is, and a coordinator that signs a round lying about a step's
output, its peers, its tensors, its round or the model-level output is caught, naming the
check (docs/audit.md)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from gradstore.audit import (
    RoundReport,
    SteppedRoundReport,
    verify_history,
    verify_round,
    verify_step,
)
from gradstore.cli import main
from gradstore.errors import AuditError
from gradstore.format import Gradient
from gradstore.job import Selector
from gradstore.messages import RECORD_TYPE_STEPPED, step_aggregate_meta
from gradstore.node import KuboDaemon, LocalNode, Node
from gradstore.store import GradientStore

from .rounds import COORDINATOR, RUN, signed_round
from .stepped import (
    PEERS,
    SHAPES,
    announcement,
    close_step,
    peer_documents,
    publish_round,
    replace_step,
    resigned,
    sign_round,
    sign_step,
    step_config,
    stepped_round,
)


async def audit(node: Node, cid: object) -> str:
    """The check that fails, or "ok"."""
    try:
        await verify_round(node, cid, coordinator=COORDINATOR.did)  # type: ignore[arg-type]
    except AuditError as exc:
        return exc.check
    return "ok"


async def _honest_round_audits(node: Node) -> None:
    honest = await stepped_round(node)
    assert honest.record.type == RECORD_TYPE_STEPPED
    report = await verify_round(node, honest.record_cid, coordinator=COORDINATOR.did)
    assert isinstance(report, SteppedRoundReport)
    assert [s.record.step for s in report.steps] == ["head", "mid", "emb"]
    assert [s.tensors for s in report.steps] == [
        ("fc.bias", "fc.weight"),
        ("layer.bias", "layer.weight"),
        ("embed.weight",),
    ]
    assert report.inputs == 9 and not report.failed
    # the model-level output holds every step's output tensors, bit for bit
    store = GradientStore(node)
    model = await store.get(honest.record.output)
    assert sorted(model.tensors) == sorted(SHAPES)
    assert model.meta["kind"] == "model" and model.meta["steps"] == ["head", "mid", "emb"]
    for done in honest.steps.values():
        out = await store.get(done.record.output)
        assert out.meta["step"] == done.record.step
        for name, array in out.tensors.items():
            assert model.tensors[name].tobytes() == array.tobytes()


def test_an_honest_stepped_round_audits(tmp_path: Path) -> None:
    asyncio.run(_honest_round_audits(LocalNode(tmp_path)))


def test_an_honest_stepped_round_audits_on_kubo(kubo: KuboDaemon) -> None:
    async def main_() -> None:
        async with kubo.node() as node:
            await _honest_round_audits(node)

    asyncio.run(main_())


def test_a_round_with_a_failed_step_audits_and_its_command_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def build() -> str:
        node = LocalNode(tmp_path / "node")
        honest = await stepped_round(node)
        cid, _ = await publish_round(node, 0, replace_step(honest, "mid", "quorum not met"))
        return str(cid)

    cid = asyncio.run(build())
    argv = ["audit", "round", cid, "--local", str(tmp_path / "node")]
    assert main([*argv, "--coordinator", COORDINATOR.did]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok step head of round 0 of job audit-job",
        "ok step emb of round 0 of job audit-job",
        "note",
        "ok round 0 of job audit-job",
    ]
    assert "step mid of round 0 failed (quorum not met)" in lines[2]
    assert "model-level output" in lines[3] and "signed by the expected coordinator" in lines[3]


def test_a_forged_step_output_fails_output_cid(tmp_path: Path) -> None:
    """The step's output is not what its inputs give, though the round and the model-level
    output agree with it: only re-deriving the step catches it."""

    async def main_() -> None:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node)
        mid = honest.steps["mid"].record
        store = GradientStore(node)
        real = await store.get(mid.output)
        nudged = {n: a + np.float32(1e-3) for n, a in real.tensors.items()}
        meta = step_aggregate_meta(
            mid.job, mid.round, mid.step, mid.method, [i.gradient for i in mid.inputs], run=RUN
        )
        forged = await sign_step(
            node, resigned(mid, output=await store.put(Gradient(nudged, meta)))
        )
        cid, _ = await publish_round(node, 0, replace_step(honest, "mid", forged))
        assert await audit(node, cid) == "output-cid"

    asyncio.run(main_())


def test_an_input_another_steps_announcement_signed_fails_input_signature(tmp_path: Path) -> None:
    """The peer signed its document's CID for step head; the coordinator lists it in step mid
    with that signature (everything else honest): the peer's signature covers the step."""

    async def main_() -> None:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node)
        mid = honest.steps["mid"].record
        first = mid.inputs[0]
        signer = next(k for k in PEERS if k.did == first.peer)
        sent_at, sig = announcement(signer, first.gradient, first.num_samples, 0, "head")
        moved = dataclasses.replace(first, sent_at=sent_at, peer_sig=sig)
        forged = await sign_step(node, resigned(mid, inputs=(moved, *mid.inputs[1:])))
        cid, _ = await publish_round(node, 0, replace_step(honest, "mid", forged))
        assert await audit(node, cid) == "input-signature"

    asyncio.run(main_())


@pytest.mark.parametrize(
    "names",
    [["fc.bias", "fc.weight"], ["layer.weight"], ["layer.bias", "layer.weight", "fc.bias"]],
    ids=["another-steps", "one-missing", "one-more"],
)
def test_inputs_whose_tensors_are_not_the_steps_fail_step_tensors(
    tmp_path: Path, names: list[str]
) -> None:
    """Step mid lists documents holding other tensors than its selectors take (each peer's
    signature is genuine for step mid), its output recomputed from them; head is said to
    have failed, so no tensor is in two outputs and the model-level output is honestly
    assembled: only the step's tensors give it away."""

    async def main_() -> None:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node)
        mid = step_config(honest.config, "mid")
        wrong = await peer_documents(node, mid, 0, 99, names=names)
        forged = await sign_step(node, await close_step(node, mid, 0, wrong))
        steps = replace_step(honest, "mid", forged)
        steps[0] = ("head", "quorum not met")
        cid, _ = await publish_round(node, 0, steps)
        assert await audit(node, cid) == "step-tensors"

    asyncio.run(main_())


def test_two_steps_giving_one_tensor_fail_step_tensors(tmp_path: Path) -> None:
    """Step mid's record claims fc.bias too (its selectors are the coordinator's word) and its
    documents hold it: each step audits alone, but the tensor is in two steps' outputs."""

    async def main_() -> None:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node)
        mid = step_config(honest.config, "mid")
        wider = dataclasses.replace(mid, tensors=(*mid.tensors, Selector("fc.bias")))
        names = ["fc.bias", "layer.bias", "layer.weight"]
        documents = await peer_documents(node, wider, 0, 98, names=names)
        forged = await sign_step(node, await close_step(node, wider, 0, documents))
        assert await verify_step(GradientStore(node), forged.record_cid, forged.record)
        steps = replace_step(honest, "mid", forged)  # the honest model: assembling refuses
        cid, _ = await publish_round(node, 0, steps, model=honest.record.output)
        assert await audit(node, cid) == "step-tensors"

    asyncio.run(main_())


def test_a_round_linking_a_step_record_of_another_round_fails_step_link(tmp_path: Path) -> None:
    async def main_() -> None:
        node = LocalNode(tmp_path)
        first = await stepped_round(node, round_=0)
        second = await stepped_round(node, round_=1, prev=first.record_cid, seed=21)
        assert await audit(node, second.record_cid) == "ok"
        steps = replace_step(second, "head", first.steps["head"])  # round 0's, itself honest
        cid, _ = await publish_round(node, 1, steps, prev=first.record_cid)
        assert await audit(node, cid) == "step-link"

    asyncio.run(main_())


def test_a_forged_model_level_output_fails_model_output(tmp_path: Path) -> None:
    async def main_() -> None:
        node = LocalNode(tmp_path)
        honest = await stepped_round(node)
        store = GradientStore(node)
        model = await store.get(honest.record.output)
        nudged = dict(model.tensors)
        nudged["fc.bias"] = nudged["fc.bias"] * np.float32(2)
        output = await store.put(Gradient(nudged, model.meta))
        forged = dataclasses.replace(honest.record, output=output)
        assert await audit(node, await sign_round(node, forged)) == "model-output"
        # the assembly of fewer steps than the round closed is not its output either
        head = honest.steps["head"].record.output
        fewer = dataclasses.replace(honest.record, output=head)
        assert await audit(node, await sign_round(node, fewer)) == "model-output"

    asyncio.run(main_())


def test_a_history_of_a_round4_then_a_round5_record_audits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def build() -> tuple[str, list[object]]:
        node = LocalNode(tmp_path / "node")
        rng = np.random.default_rng(4)
        grads = [Gradient({"w": rng.standard_normal((6, 3)).astype(np.float32)}) for _ in range(3)]
        old = await signed_round(node, grads, [10, 20, 30], round_=0)
        new = await stepped_round(node, round_=1, prev=old.record_cid)
        reports = await verify_history(node, new.record_cid, coordinator=COORDINATOR.did)
        return str(new.record_cid), list(reports)

    head, reports = asyncio.run(build())
    assert [type(r) for r in reports] == [SteppedRoundReport, RoundReport]
    argv = ["audit", "history", head, "--local", str(tmp_path / "node")]
    assert main([*argv, "--coordinator", COORDINATOR.did]) == 0
    out = capsys.readouterr().out
    assert out.count("ok step ") == 3 and "ok round 0 of job audit-job" in out
    assert out.rstrip().endswith("all by coordinator " + COORDINATOR.did)
