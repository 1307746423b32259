"""What the root of a tree round decides, without a network (docs/design/multicoord.md, "The
tree by peer groups"): a leaf's partial record is taken only as its group's, signed by its
leaf, over its peers' signed inputs; a silent group fails at the deadline plus the close
retries naming its leaf; a group whose partial holds other tensors fails at the
combination; the divisor is the method's over every group's inputs; the tree and partial
records round-trip and refuse what they must."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from gradstore.coordinator.tree_state import TreeRound, check_remote_partial, checked_part
from gradstore.dag import CID
from gradstore.errors import MessageError, Reason
from gradstore.job import parse_job
from gradstore.messages import (
    Announce,
    PartialRecord,
    RecordInput,
    Result,
    TreeGroup,
    TreeRecord,
    announcement_signature,
    decode_partial_record,
    decode_tree_record,
    encode_message,
    encode_partial_record,
    encode_tree_record,
)

from .harness import key

RUN = "a" * 26
DOC = CID.parse("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
ROOT, LEAF_A, LEAF_B = key(100), key(110), key(111)
PEERS = sorted((key(i) for i in range(4)), key=lambda k: k.did)
CONFIG = parse_job(
    {
        "job": "tree-job",
        "coordinator": ROOT.did,
        "peers": [k.did for k in PEERS],
        "aggregation": {"method": "fedavg", "accumulate": "exact"},
        "rounds": {"count": 1, "quorum": 4, "deadline_s": 10.0},
        "groups": [
            {"name": "a", "coordinator": LEAF_A.did, "peers": [k.did for k in PEERS[:2]]},
            {"name": "b", "coordinator": LEAF_B.did, "peers": [k.did for k in PEERS[2:]]},
        ],
    }
)


def signed_input(i: int, samples: int) -> RecordInput:
    """Peer ``i``'s input with its own signed announcement (a tree's peers name no step)."""
    ann = Announce(
        job=CONFIG.job,
        run=RUN,
        round=0,
        peer=PEERS[i].did,
        cid=str(DOC),
        num_samples=samples,
        sent_at=1000,
    )
    _, sig = announcement_signature(encode_message(ann, PEERS[i]))
    return RecordInput(PEERS[i].did, DOC, samples, float(samples), None, 1000, sig)


def partial(group: str, leaf: Any, peers: list[int], **changes: Any) -> tuple[PartialRecord, CID]:
    rec = PartialRecord(
        job=CONFIG.job,
        run=RUN,
        round=0,
        group=group,
        method="fedavg",
        params={},
        inputs=tuple(signed_input(i, 10 + i) for i in peers),
        excluded=(),
        output=DOC,
        coordinator=leaf.did,
    )
    rec = dataclasses.replace(rec, **changes)
    cid, _ = encode_partial_record(rec, leaf)
    return rec, cid


def result_of(rec: PartialRecord, cid: CID) -> Result:
    return Result(
        job=rec.job,
        run=rec.run,
        round=rec.round,
        cid=str(rec.output),
        record=str(cid),
        method=rec.method,
        peers=b"\x00",
        sent_at=1000,
    )


def test_a_leafs_partial_is_taken_only_as_its_groups_over_its_peers_signed_inputs() -> None:
    a, b = CONFIG.groups
    rec, cid = partial("a", LEAF_A, [0, 1])
    check_remote_partial(result_of(rec, cid), cid, rec, group=a, job=CONFIG.job, run=RUN)
    with pytest.raises(MessageError) as exc:  # signed by A, claimed for b
        check_remote_partial(result_of(rec, cid), cid, rec, group=b, job=CONFIG.job, run=RUN)
    assert exc.value.code is Reason.NOT_COORDINATOR
    other, ocid = partial("b", LEAF_A, [0, 1], coordinator=LEAF_A.did)
    with pytest.raises(MessageError, match="group 'b'"):  # A's record naming another group
        check_remote_partial(result_of(other, ocid), ocid, other, group=a, job=CONFIG.job, run=RUN)
    foreign, fcid = partial("a", LEAF_A, [0, 2])  # peer 2 is group b's
    with pytest.raises(MessageError, match="not in the group"):
        check_remote_partial(
            result_of(foreign, fcid), fcid, foreign, group=a, job=CONFIG.job, run=RUN
        )
    forged = dataclasses.replace(rec, inputs=(dataclasses.replace(rec.inputs[0], num_samples=99),))
    with pytest.raises(MessageError, match="not what it signed"):
        check_remote_partial(result_of(forged, cid), cid, forged, group=a, job=CONFIG.job, run=RUN)


def test_a_silent_group_fails_at_the_deadline_plus_the_close_retries_naming_its_leaf() -> None:
    book = TreeRound(CONFIG, 0, grace_s=2.0)
    assert book.due(100.0) == ([], None)  # no leaf said anything: the clock has not started
    book.heard(100.0)
    assert book.due(111.9) == ([], 112.0)
    rec, cid = partial("a", LEAF_A, [0, 1])
    tensors = {"w": np.zeros((1, 3))}
    book.took("a", checked_part(rec, cid, tensors, {"dtypes": {"w": "<f4"}}))
    silent, wake = book.due(112.0)
    assert wake is None
    assert silent == [("b", f"unavailable: no result from its coordinator {LEAF_B.did}")]
    book.fail(*silent[0])
    assert book.done
    entries = book.entries()
    assert entries[0] == TreeGroup("a", LEAF_A.did, cid, DOC)
    assert entries[1].failed is not None and LEAF_B.did in entries[1].failed
    plan = book.plan()
    assert plan is not None and [n for n, _ in plan.parts] == ["a"]
    assert plan.divisor == 10 + 11  # fedavg: the samples of every input combined


def test_the_divisor_is_over_every_group_and_a_group_with_other_tensors_fails() -> None:
    book = TreeRound(CONFIG, 0, grace_s=2.0)
    ra, ca = partial("a", LEAF_A, [0, 1])
    rb, cb = partial("b", LEAF_B, [2, 3])
    book.took("a", checked_part(ra, ca, {"w": np.zeros((1, 3))}, {"dtypes": {"w": "<f4"}}))
    book.took("b", checked_part(rb, cb, {"w": np.zeros((2, 3))}, {"dtypes": {"w": "<f4"}}))
    plan = book.plan()
    assert plan is not None and plan.divisor == 10 + 11 + 12 + 13 and not plan.failed
    assert [i.peer for i in plan.inputs] == sorted(k.did for k in PEERS)
    book = TreeRound(CONFIG, 0, grace_s=2.0)
    book.took("a", checked_part(ra, ca, {"w": np.zeros((1, 3))}, {"dtypes": {"w": "<f4"}}))
    book.took("b", checked_part(rb, cb, {"w": np.zeros((1, 4))}, {"dtypes": {"w": "<f4"}}))
    plan = book.plan()
    assert plan is not None and list(plan.failed) == ["b"] and plan.divisor == 21
    assert "schema-mismatch" in plan.failed["b"]


def test_a_partial_whose_meta_names_no_dtypes_is_not_taken() -> None:
    rec, cid = partial("a", LEAF_A, [0, 1])
    with pytest.raises(Exception, match="dtypes"):
        checked_part(rec, cid, {"w": np.zeros((1, 3))}, {})


def test_partial_and_tree_records_round_trip_and_are_signed() -> None:
    rec, _ = partial("a", LEAF_A, [0, 1])
    cid, data = encode_partial_record(rec, LEAF_A)
    assert decode_partial_record(data, cid=cid) == rec
    tree = TreeRecord(
        job=CONFIG.job,
        run=RUN,
        round=0,
        method="fedavg",
        params={},
        groups=(TreeGroup("a", LEAF_A.did, cid, DOC), TreeGroup("b", LEAF_B.did, failed="gone")),
        output=DOC,
        prev=None,
        coordinator=ROOT.did,
    )
    tcid, tdata = encode_tree_record(tree, ROOT)
    assert decode_tree_record(tdata, cid=tcid) == tree
    with pytest.raises(MessageError):
        encode_tree_record(tree, LEAF_A)  # only the root signs the round
    with pytest.raises(MessageError, match="at least one closed group"):
        dataclasses.replace(tree, groups=(TreeGroup("b", LEAF_B.did, failed="gone"),))
