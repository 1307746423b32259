"""The decision record gradstore/population/1: canonical, signed, and its members' reports signed."""

from __future__ import annotations

import dataclasses

import pytest

from gradstore.dag.cid import CID, DAG_CBOR
from gradstore.errors import IntegrityError, MessageError, Reason
from gradstore.pbt.decide import MemberFailure
from gradstore.population.record import (
    POPULATION_RECORD_TYPE,
    decode_population_record,
    encode_population_record,
    member_reports_signed,
)

from .helpers import CONTROLLER, MEMBER_KEYS, ckpt, honest_record, job


def _record() -> object:
    config = job()
    members = [k.did for k in MEMBER_KEYS]
    first = config.population.first_hparams()  # type: ignore[union-attr]
    scores = {m: 0.1 * (i + 1) for i, m in enumerate(members[:7])}
    failed = (MemberFailure(members[7], "absent: never reported"),)
    return honest_record(config, 0, scores, first, failed=failed)


def test_record_round_trips_and_links_checkpoints() -> None:
    rec = _record()
    cid, data = encode_population_record(rec, CONTROLLER)  # type: ignore[arg-type]
    assert cid.codec == DAG_CBOR
    back = decode_population_record(data, cid=cid)
    assert back == rec
    assert back.type == POPULATION_RECORD_TYPE
    assert member_reports_signed(back) == []
    # the bottom 2 of 7 and the failed member copy; 8 hyperparameter sets follow
    assert len(back.copies) == 3 and len(back.hparams_after()) == 8
    assert {c.checkpoint for c in back.copies} <= {m.report.checkpoint for m in back.members}


def test_a_record_not_signed_by_the_controller_is_refused() -> None:
    rec = _record()
    with pytest.raises(MessageError) as err:
        encode_population_record(rec, MEMBER_KEYS[0])  # type: ignore[arg-type]
    assert err.value.code is Reason.NOT_COORDINATOR
    # signed by a member key but naming it as controller, then relabelled: bad signature
    impostor = dataclasses.replace(rec, controller=MEMBER_KEYS[0].did)  # type: ignore[type-var]
    _, data = encode_population_record(impostor, MEMBER_KEYS[0])
    from gradstore.dag import cbor

    node = cbor.decode(data)
    node["controller"] = CONTROLLER.did
    with pytest.raises(MessageError) as err:
        decode_population_record(cbor.encode(node))
    assert err.value.code is Reason.BAD_SIGNATURE


def test_a_record_is_checked_against_its_cid() -> None:
    _, data = encode_population_record(_record(), CONTROLLER)  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        decode_population_record(data, cid=CID.hash(DAG_CBOR, b"another block"))


def test_a_score_changed_by_the_controller_breaks_the_members_signature() -> None:
    rec = _record()
    first = rec.members[0]  # type: ignore[attr-defined]
    changed = dataclasses.replace(first.report, score=0.99)
    forged = dataclasses.replace(
        rec, members=(dataclasses.replace(first, report=changed), *rec.members[1:])
    )  # type: ignore[attr-defined, type-var]
    _, data = encode_population_record(forged, CONTROLLER)
    back = decode_population_record(data)  # the controller's signature is fine
    assert member_reports_signed(back) == [first.report.member]


def test_members_must_be_sorted_once() -> None:
    rec = _record()
    with pytest.raises(MessageError, match="sorted by member"):
        dataclasses.replace(rec, members=tuple(reversed(rec.members)))  # type: ignore[attr-defined, type-var]
    with pytest.raises(MessageError, match="both ranked and failed"):
        dataclasses.replace(
            rec,  # type: ignore[type-var]
            failed=(MemberFailure(rec.members[0].report.member, "absent"),),  # type: ignore[attr-defined]
        )


def test_failed_checkpoint_is_text_not_a_link() -> None:
    rec = _record()
    failed = (MemberFailure(MEMBER_KEYS[7].did, "integrity: hash mismatch", str(ckpt("x", 0))),)
    rec = dataclasses.replace(rec, failed=failed)  # type: ignore[type-var]
    _, data = encode_population_record(rec, CONTROLLER)
    back = decode_population_record(data)
    assert back.failed == failed
