"""Binding a document to the announcement that names it: the pure decisions, no network."""

from __future__ import annotations

from typing import Any

import pytest

from gradstore.coordinator.binding import Claim, check_binding, duplicates
from gradstore.coordinator.rounds import PeerState, RoundBook, drop_duplicate_cids, judge
from gradstore.dag import CID
from gradstore.dag.cid import DAG_PB

A, B, C = "did:key:zA", "did:key:zB", "did:key:zC"
CLAIM = Claim(peer=B, round=3, job="j", num_samples=10, run="r1")
BOUND = {"kind": "gradient", "round": 3, "peer": B, "num_samples": 10, "job": "j"}


def _code(meta: dict[str, Any], claim: Claim = CLAIM) -> str | None:
    reason = check_binding(meta, claim)
    return None if reason is None else reason.split(":")[0]


def test_a_document_that_names_its_own_announcement_is_bound() -> None:
    assert check_binding(BOUND, CLAIM) is None
    assert check_binding({**BOUND, "run": "r1", "kind": "delta"}, CLAIM) is None
    assert check_binding({**BOUND, "kind": "state", "model": "mlp"}, CLAIM) is None


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"peer": A}, "wrong-peer"),
        ({"round": 2}, "wrong-round"),
        ({"round": "3"}, "wrong-round"),
        ({"round": True}, "wrong-round"),
        ({"job": "other"}, "wrong-job"),
        ({"run": "r0"}, "wrong-run"),
        ({"kind": "aggregate"}, "wrong-kind"),
        ({"kind": "model"}, "wrong-kind"),
        ({"kind": "residual"}, "wrong-kind"),
        ({"num_samples": 11}, "samples-mismatch"),
        ({"num_samples": 10.0}, "samples-mismatch"),
    ],
)
def test_each_key_the_meta_names_must_agree(change: dict[str, Any], code: str) -> None:
    assert _code({**BOUND, **change}) == code


def test_the_reason_names_both_sides_and_escapes_what_the_document_says() -> None:
    reason = check_binding({**BOUND, "peer": A}, CLAIM)
    assert reason == f"wrong-peer: the document names peer {A!r}, announced by {B}"
    hostile = check_binding({**BOUND, "peer": "\x1b[31m" + "x" * 500}, CLAIM)
    assert hostile is not None and "\x1b" not in hostile and len(hostile) < 200


def test_meta_without_the_keys_is_checked_only_when_the_job_requires_it() -> None:
    assert check_binding({}, CLAIM) is None
    assert check_binding({"note": "hi"}, CLAIM) is None
    strict = Claim(B, 3, "j", 10, "r1", require_meta=True)
    assert _code({}, strict) == "unbound"
    reason = check_binding({"round": 3, "job": "j"}, strict)
    assert reason is not None and reason.endswith("lacks peer")
    assert check_binding({"round": 3, "job": "j", "peer": B}, strict) is None
    # a wrong key is named as wrong, not as missing
    assert _code({"round": 4}, strict) == "wrong-round"


def test_the_run_is_checked_only_when_the_claim_names_one() -> None:
    assert check_binding({**BOUND, "run": "r0"}, Claim(B, 3, "j", 10)) is None


def test_odd_meta_values_are_refused_not_crashed_on() -> None:
    assert _code({**BOUND, "kind": ["model"]}) is None  # unhashable kind: not a known non-update
    assert _code({**BOUND, "peer": {"did": B}}) == "wrong-peer"


def test_the_first_announcement_of_a_cid_keeps_it() -> None:
    one = str(CID.hash(DAG_PB, b"one"))
    two = str(CID.hash(DAG_PB, b"two"))
    got = duplicates([(A, one), (B, two), (C, one)])
    assert got == {C: f"duplicate-cid: {one} was announced first by {A}"}
    v1 = CID.parse(one)
    v0 = CID(DAG_PB, v1.digest, version=0)  # the same document's Qm... form
    assert str(v0).startswith("Qm")
    assert duplicates([(A, one), (B, str(v0))]).keys() == {B}
    assert duplicates([(A, "not a cid"), (B, "not a cid")]).keys() == {B}


def test_at_close_a_verified_duplicate_fails_and_the_earlier_announcement_stays() -> None:
    cid = str(CID.hash(DAG_PB, b"doc"))
    book = RoundBook(0, (A, B, C), opened_at=0.0)
    book.accept(B, cid, 1, at=1.0)  # B announced first
    book.accept(A, cid, 1, at=2.0)
    book.accept(C, str(CID.hash(DAG_PB, b"other")), 1, at=3.0)
    for p in (A, B, C):
        book.verify(p, 10, ())
    assert drop_duplicate_cids(book) == [A]
    verdict = judge(book, 2)
    assert verdict.verified == (B, C)
    assert verdict.excluded == ((A, f"duplicate-cid: {cid} was announced first by {B}"),)


def test_a_duplicate_of_an_input_that_failed_is_not_a_duplicate() -> None:
    cid = str(CID.hash(DAG_PB, b"doc"))
    book = RoundBook(0, (A, B), opened_at=0.0)
    book.accept(A, cid, 1, at=1.0)
    book.accept(B, cid, 2, at=2.0)
    book.fail(A, "samples-mismatch: ...")
    book.verify(B, 10, ())
    assert drop_duplicate_cids(book) == []
    assert book.slots[B].state is PeerState.VERIFIED
