"""When a close's last status is left to its result (``statuses.said_by``): only when the
result says all of it, so a peer that was refused, or whose input the close left out, still
hears why. Pure: hand-built books, no node."""

from __future__ import annotations

from gradstore.coordinator.rounds import PeerState, RoundBook
from gradstore.coordinator.statuses import Announced, result_of, said_by, status_of
from gradstore.dag import CID
from gradstore.dag.cid import DAG_CBOR, RAW
from gradstore.messages import Roster

from .harness import key

KEYS = sorted((key(i) for i in range(3)), key=lambda k: k.did)
A, B, C = (k.did for k in KEYS)
ROSTER = Roster([A, B, C])
RUN = "run0000000000000001"
OUT = str(CID.hash(RAW, b"aggregate"))
RECORD = str(CID.hash(DAG_CBOR, b"record"))


def _book(states: dict[str, PeerState], refusals: dict[str, str] | None = None) -> RoundBook:
    book = RoundBook(0, (A, B, C), 0.0, step="head")
    for peer, state in states.items():
        book.slots[peer].state = state
    book.refusals.update(refusals or {})
    return book


def _said(book: RoundBook, aggregated: tuple[str, ...], *, failed: str | None = None) -> bool:
    status = status_of(book, ROSTER, job="j", run=RUN, sent_at=1, failed=failed)
    done = Announced("j", RUN, 0, "head", OUT, RECORD, "mean", aggregated)
    return said_by(status, result_of(done, RECORD, ROSTER, sent_at=2))


def test_a_close_of_every_input_received_leaves_its_status_to_the_result() -> None:
    book = _book({A: PeerState.AGGREGATED, B: PeerState.AGGREGATED})  # C never announced
    assert _said(book, (A, B))


def test_a_status_with_more_to_say_than_the_result_goes_out() -> None:
    # received but not verified by the close: the status says so, the result cannot
    book = _book({A: PeerState.AGGREGATED, B: PeerState.RECEIVED})
    assert not _said(book, (A,))
    # a refusal and its reason
    book = _book({A: PeerState.AGGREGATED}, {C: "not-in-step: C is not one of its peers"})
    assert not _said(book, (A,))
    # verified but left out of the aggregate (excluded at the close)
    book = _book({A: PeerState.AGGREGATED, B: PeerState.VERIFIED})
    assert not _said(book, (A,))
    # a failure
    book = _book({A: PeerState.AGGREGATED})
    assert not _said(book, (A,), failed="stopped")


def test_another_steps_result_says_nothing_of_this_one() -> None:
    book = _book({A: PeerState.AGGREGATED})
    status = status_of(book, ROSTER, job="j", run=RUN, sent_at=1)
    other = Announced("j", RUN, 0, "body", OUT, RECORD, "mean", (A,))
    assert not said_by(status, result_of(other, RECORD, ROSTER, sent_at=2))
