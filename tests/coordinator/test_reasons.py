"""Refusal reasons as fields (issue 26): every code the coordinator, the binding, admission,
Flower and the peer write is a ``Reason``, the texts stay ``"code: detail"``, and a code read
from someone else's message never crashes the reader. No node, no network."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import gradstore
from gradstore.coordinator import (
    AdmissionState,
    Claim,
    RoundBook,
    Verdict,
    admit,
    check_binding,
    check_gradient,
    duplicates,
)
from gradstore.coordinator.rounds import ABSENT, PeerState, cut_off, judge, keep_majority_schema
from gradstore.errors import MessageError, Reason, RefusedError, reason_detail, reason_text
from gradstore.format import Gradient
from gradstore.messages import (
    Announce,
    Roster,
    Status,
    decode_lists,
    encode_fitted,
    verify_message,
)

from .harness import key

RUN = "a" * 26
NOW_MS = 1_800_000_000_000
PEERS = sorted(key(i).did for i in range(3))
CID = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
OTHER_CID = "bafkreidgvpkjawlxz6sffxzwgooowe5yt7i6wsyg236mfoks77nywkptdq"

#: The packages that make refusals, and the one ``word: `` text there that is no reason.
REFUSING = ("coordinator", "flower", "messages", "peer", "audit")
NOT_A_REASON = {"gradstore"}  # Flower's log lines start "gradstore: ..."

_CODE_HEAD = re.compile(r"^([a-z]+(?:-[a-z]+)*): ")


def _text_heads(path: Path) -> list[tuple[int, str]]:
    """(line, first word) of every string or f-string in ``path`` that reads ``word: ...``
    (docstrings aside): a reason text written by hand."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    heads = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = None if id(node) in docstrings else node.value
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            text = first.value if isinstance(first, ast.Constant) else None
        match = _CODE_HEAD.match(text or "")
        if match:
            heads.append((node.lineno, match.group(1)))
    return heads


def test_no_reason_text_is_spelled_by_hand_with_a_code_the_enum_lacks() -> None:
    # mypy makes every RefusedError and MessageError take a Reason; this catches a text
    # written as "new-code: ..." and passed along as a plain string
    root = Path(gradstore.__file__).parent
    codes = {r.value for r in Reason}
    strays = [
        f"{path.relative_to(root)}:{line}: {word}"
        for package in REFUSING
        for path in sorted((root / package).rglob("*.py"))
        for line, word in _text_heads(path)
        if word not in codes | NOT_A_REASON
    ]
    assert not strays


def _ann(**changes: object) -> Announce:
    fields: dict[str, object] = {
        "job": "j",
        "run": RUN,
        "round": 0,
        "peer": PEERS[0],
        "cid": CID,
        "num_samples": 1,
        "sent_at": NOW_MS,
        **changes,
    }
    return Announce(**fields)  # type: ignore[arg-type]


def test_every_refusal_the_pure_rules_give_carries_a_known_code() -> None:
    state = AdmissionState(
        run=RUN, open_round=3, max_ahead=1, max_skew_ms=1000, announced={(3, PEERS[0]): CID}
    )
    admitted = {
        admit(ann, state, NOW_MS).reason
        for ann in (
            _ann(run="b" * 26),
            _ann(round=3, sent_at=NOW_MS + 5000),
            _ann(round=1),
            _ann(round=9),
            _ann(round=3, cid=OTHER_CID),
        )
    }
    assert admitted == {
        Reason.WRONG_RUN,
        Reason.CLOCK_SKEW,
        Reason.STALE_ROUND,
        Reason.FUTURE_ROUND,
        Reason.CONFLICTING_CID,
    }
    again = admit(_ann(round=3), state, NOW_MS)
    assert (again.verdict, again.reason) == (Verdict.DUPLICATE, Reason.DUPLICATE)
    claim = Claim(PEERS[0], 3, "j", 10, RUN, require_meta=True)
    bound = {"peer": PEERS[0], "round": 3, "job": "j"}
    texts = [
        check_binding({"kind": "aggregate"}, claim),
        check_binding({"job": "k"}, claim),
        check_binding({"run": "r"}, claim),
        check_binding({"round": 2}, claim),
        check_binding({"peer": PEERS[1]}, claim),
        check_binding({**bound, "num_samples": 9}, claim),
        check_binding({}, claim),
        *duplicates([(PEERS[0], CID), (PEERS[1], CID)]).values(),
        check_gradient(Gradient({"w": np.full(2, np.nan, np.float32)}), None, False)[1],
        check_gradient(Gradient({"w": np.ones(2, np.float32)}), (("v", "<f4", (2,)),), False)[1],
    ]
    book = RoundBook(0, tuple(PEERS), 0.0)
    book.accept(PEERS[0], CID, 1, 0.0)
    cut_off(book)
    for peer, schema in ((PEERS[1], (("w", "<f4", (2,)),)), (PEERS[2], (("w", "<f8", (2,)),))):
        book.accept(peer, CID, 1, 0.0)
        book.verify(peer, 8, schema)
    keep_majority_schema(book)
    texts += [why for _, why in judge(book, 1).excluded]
    codes = [Reason.of(text or "") for text in texts]
    assert codes == [
        Reason.WRONG_KIND,
        Reason.WRONG_JOB,
        Reason.WRONG_RUN,
        Reason.WRONG_ROUND,
        Reason.WRONG_PEER,
        Reason.SAMPLES_MISMATCH,
        Reason.UNBOUND,
        Reason.DUPLICATE_CID,
        Reason.NON_FINITE,
        Reason.SCHEMA_MISMATCH,
        Reason.UNAVAILABLE,  # cut off at the deadline
        Reason.SCHEMA_MISMATCH,  # the minority's schema (a tie: the lowest peer id keeps it)
    ]
    assert book.slots[PEERS[2]].state is PeerState.FAILED
    assert Reason.of(ABSENT) is Reason.ABSENT


@pytest.mark.parametrize("code", list(Reason))
def test_a_code_and_its_detail_make_the_text_and_read_back_from_it(code: Reason) -> None:
    text = reason_text(code, "the detail: with a colon")
    assert text == f"{code.value}: the detail: with a colon"
    assert type(text) is str  # records and statuses encode plain strings
    assert Reason.of(text) is code and reason_detail(text) == "the detail: with a colon"
    refused = RefusedError(code, "the detail: with a colon", peer="did:key:z", cid=CID)
    assert (refused.code, refused.reason, str(refused)) == (code, text, text)
    parsed = RefusedError.parse(text, peer="did:key:z", round_=4, job="j")
    assert (parsed.code, parsed.detail, parsed.reason) == (code, refused.detail, text)
    assert str(parsed) == f"round 4 of job j: the coordinator refused: {text}"
    # what a lists block that must shrink keeps of a reason: the code, as it always was
    assert (text.split(":")[0].split() or ["refused"])[0][:40] == code.value
    message = MessageError(code, "why")
    assert (message.code, message.reason, message.detail, str(message)) == (
        code,
        code,
        "why",
        f"{code.value}: why",
    )


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("evil-code: the coordinator says so", Reason.UNKNOWN),
        ("Too-Large: not our spelling", Reason.UNKNOWN),
        ("__class__: x", Reason.UNKNOWN),
        ("_missing_: x", Reason.UNKNOWN),
        ("\u202etoo-large: x", Reason.UNKNOWN),
        ("x" * 100_000, Reason.UNKNOWN),
        ("unknown: said so itself", Reason.UNKNOWN),
        ("internal error: ValueError: boom", Reason.INTERNAL),
        ("too-large", Reason.TOO_LARGE),
        ("  absent :  never announced", Reason.ABSENT),
        (":", Reason.REFUSED),
        ("", Reason.REFUSED),
    ],
)
def test_a_reason_read_from_a_hostile_message_is_a_code_or_unknown(text: str, code: Reason) -> None:
    assert Reason.of(text) is code
    refused = RefusedError.parse(text, round_=0, job="j")
    assert refused.code is code and refused.reason == text


def test_shortened_lists_keep_each_reasons_code() -> None:
    # reasons too long for one block are cut to their code; the codes are Reason values
    dids = [f"did:key:z6Mk{i:044d}" for i in range(6000)]
    roster = Roster(dids)
    kinds = [
        reason_text(Reason.TOO_LARGE, "x" * 200),
        reason_text(Reason.ABSENT, "never announced " + "x" * 200),
        "internal error: ValueError: " + "x" * 200,
    ]
    reasons = tuple(kinds[i % 3] for i in range(len(dids)))
    every, none = roster.bitmap(dids), roster.bitmap(())
    big = Status("j", RUN, 0, every, none, every, reasons, 5)
    coordinator = key(9)
    data, block = encode_fitted(big, coordinator)
    assert block is not None
    linked = verify_message(data, job="j", coordinator=coordinator.did, peers=roster)
    assert isinstance(linked, Status)
    got = decode_lists(block[1], linked, roster).reasons
    assert got == tuple(("too-large", "absent", "internal")[i % 3] for i in range(len(dids)))


def test_the_refusal_and_config_errors_are_in_the_package_face() -> None:
    assert gradstore.RefusedError is RefusedError and gradstore.Reason is Reason
    assert issubclass(gradstore.ConfigError, gradstore.CoordinatorError)
    assert issubclass(gradstore.ConfigError, ValueError)  # Flower's option checks were
    from gradstore.coordinator import InputRefused

    assert InputRefused is RefusedError  # its former name, kept
