"""Auditing a round split among coordinators by steps (docs/design/multicoord.md): a step
record signed by its owner, named in the round/5 record's entry, audits on its own and in
the whole; a part signed by a coordinator that does not own its step fails ``step-owner``.
The split round's output is the single coordinator's, CID for CID."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from gradstore.audit import SteppedRoundReport, verify_history, verify_round
from gradstore.dag import CID, DAG_CBOR
from gradstore.errors import AuditError, MessageError
from gradstore.messages import (
    RoundStep,
    SigningKey,
    SteppedRoundRecord,
    decode_stepped_record,
    encode_step_record,
    encode_stepped_record,
)
from gradstore.node import LocalNode, Node

from .rounds import COORDINATOR, key
from .stepped import StepDone, Stepped, sign_round, stepped_round

OWNER = key(201)  # owns step "head"
THIRD = key(202)  # a coordinator of no step


async def audit(node: Node, cid: CID) -> str:
    """The check that fails, or "ok" (the root pinned as the round's coordinator)."""
    try:
        await verify_round(node, cid, coordinator=COORDINATOR.did)
    except AuditError as exc:
        return exc.check
    return "ok"


async def signed_by(node: Node, done: StepDone, signer: SigningKey) -> StepDone:
    """``done``'s step record as ``signer`` writes and signs it (the same step, inputs and
    output: what an owner computing the step writes)."""
    record = dataclasses.replace(done.record, coordinator=signer.did)
    _, data = encode_step_record(record, signer)
    return StepDone(await node.put_block(data, DAG_CBOR), record)


async def split(
    node: Node, honest: Stepped, head: StepDone, named: str | None = OWNER.did
) -> tuple[CID, SteppedRoundRecord]:
    """``honest`` with step "head" replaced by ``head``, its entry naming ``named``."""
    entries = tuple(
        RoundStep(e.step, record=head.record_cid, output=e.output, coordinator=named)
        if e.step == "head"
        else e
        for e in honest.record.steps
    )
    record = dataclasses.replace(honest.record, steps=entries)
    return await sign_round(node, record), record


def test_a_round_split_between_two_coordinators_audits_with_the_same_output(
    tmp_path: Path,
) -> None:
    async def main_() -> None:
        node = LocalNode(tmp_path)
        single = await stepped_round(node)
        head = await signed_by(node, single.steps["head"], OWNER)
        cid, record = await split(node, single, head)
        report = await verify_round(node, cid, coordinator=COORDINATOR.did)
        assert isinstance(report, SteppedRoundReport)
        assert [s.record.coordinator for s in report.steps] == [
            OWNER.did,
            COORDINATOR.did,
            COORDINATOR.did,
        ]
        assert record.output == single.record.output  # the whole: the same model-level CID
        assert (await verify_history(node, cid, coordinator=COORDINATOR.did))[0].record_cid == cid

    asyncio.run(main_())


def test_a_part_signed_by_a_coordinator_not_owning_its_step_fails_step_owner(
    tmp_path: Path,
) -> None:
    async def main_() -> None:
        node = LocalNode(tmp_path)
        single = await stepped_round(node)
        by_third = await signed_by(node, single.steps["head"], THIRD)
        cid, _ = await split(node, single, by_third)  # the round says OWNER owns head
        assert await audit(node, cid) == "step-owner"
        by_owner = await signed_by(node, single.steps["head"], OWNER)
        cid, _ = await split(node, single, by_owner, named=None)  # the root owns head
        assert await audit(node, cid) == "step-owner"
        cid, _ = await split(node, single, single.steps["head"], named=OWNER.did)  # root signed
        assert await audit(node, cid) == "step-owner"

    asyncio.run(main_())


def test_a_step_whose_owner_died_fails_in_the_round_which_still_audits(tmp_path: Path) -> None:
    async def main_() -> None:
        node = LocalNode(tmp_path)
        single = await stepped_round(node, failed={"head": "no result"})
        entries = tuple(
            RoundStep(
                "head", failed=f"no result from its coordinator {OWNER.did}", coordinator=OWNER.did
            )
            if e.step == "head"
            else e
            for e in single.record.steps
        )
        record = dataclasses.replace(single.record, steps=entries)
        report = await verify_round(node, await sign_round(node, record))
        assert isinstance(report, SteppedRoundReport)
        assert [s.record.step for s in report.steps] == ["mid", "emb"]
        assert report.failed == (("head", f"no result from its coordinator {OWNER.did}"),)

    asyncio.run(main_())


def test_an_entrys_coordinator_is_encoded_only_when_it_is_another(tmp_path: Path) -> None:
    async def main_() -> Stepped:
        return await stepped_round(LocalNode(tmp_path))

    single = asyncio.run(main_())
    _, plain = encode_stepped_record(single.record, COORDINATOR)
    assert b"coordinator" in plain and plain.count(b"coordinator") == 1  # the record's own
    head = single.record.steps[0]
    owned = dataclasses.replace(head, coordinator=OWNER.did)
    record = dataclasses.replace(single.record, steps=(owned, *single.record.steps[1:]))
    cid, data = encode_stepped_record(record, COORDINATOR)
    assert decode_stepped_record(data, cid=cid) == record
    assert record.owner(owned) == OWNER.did and record.owner(head) == COORDINATOR.did
    with pytest.raises(MessageError, match="left out when it is the record's"):
        dataclasses.replace(
            single.record,
            steps=(dataclasses.replace(head, coordinator=COORDINATOR.did), *record.steps[1:]),
        )
    with pytest.raises(MessageError, match="did:key"):
        RoundStep("head", failed="gone", coordinator="not-a-did")


def test_the_spec_reference_agrees_on_a_split_round(tmp_path: Path) -> None:
    """docs/spec.md section 9.3 alone (``spec_reference``) audits a split round and names a
    part signed by a coordinator that does not own its step, as gradstore does."""
    from .test_spec import both_checks

    async def main_() -> tuple[CID, CID]:
        node = LocalNode(tmp_path)
        single = await stepped_round(node)
        honest, _ = await split(node, single, await signed_by(node, single.steps["head"], OWNER))
        lying, _ = await split(node, single, await signed_by(node, single.steps["head"], THIRD))
        return honest, lying

    honest, lying = asyncio.run(main_())
    assert both_checks(tmp_path, honest) == ("ok", "ok")
    assert both_checks(tmp_path, lying) == ("step-owner", "step-owner")
