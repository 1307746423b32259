"""The step record (gradstore/step/1) and the stepped round record (gradstore/round/5):
round trips, pinned CIDs, the peers' signatures over the step, and every hostile record."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gradstore.dag import cbor
from gradstore.dag.cid import CID, DAG_CBOR
from gradstore.errors import IntegrityError
from gradstore.format import Codec
from gradstore.messages import (
    MAX_RECORD_BYTES,
    Announce,
    MessageError,
    RecordExclusion,
    RecordInput,
    RoundStep,
    SigningKey,
    SteppedRoundRecord,
    StepRecord,
    announcement_signature,
    check_selector,
    check_step_of,
    decode_record,
    decode_step_record,
    decode_stepped_record,
    encode_message,
    encode_step_record,
    encode_stepped_record,
)

from .conftest import raw_cid, record_cid, seeded_key

JOB = "mnist-demo"
RUN = "k3x9run0000000000000000000"
PEERS = {seeded_key(i).did: seeded_key(i) for i in (1, 2, 3)}

# The records below, signed by the key with seed 100. Changing one of these CIDs changes
# every published record of its type: bump the type instead.
GOLDEN_STEP = "bafyreihgiku6tv5locz5tss6ar2wdu3lybvdreuiabmgdt334uftjuck6u"
GOLDEN_ROUND = "bafyreieqffqnldp3ffxiydho5hq6d5xwovq7sxfdqojuzmkejoa5bwbsfu"


def _input(peer: SigningKey, step: str | None, tag: bytes, **kw: Any) -> RecordInput:
    """An input carrying ``peer``'s signed announcement of it for ``step``."""
    gradient = raw_cid(tag)
    ann = Announce(
        job=JOB,
        run=RUN,
        round=7,
        step=step,
        peer=peer.did,
        cid=str(gradient),
        num_samples=500,
        sent_at=1_700,
    )
    _, sig = announcement_signature(encode_message(ann, peer))
    fields: dict[str, Any] = dict(
        peer=peer.did, gradient=gradient, num_samples=500, weight=0.5, sent_at=1_700, peer_sig=sig
    )
    fields.update(kw)
    return RecordInput(**fields)


def _step(coord: SigningKey, step: str = "head", **kw: Any) -> StepRecord:
    p1, p2, p3 = (seeded_key(i) for i in (1, 2, 3))
    fields: dict[str, Any] = dict(
        job=JOB,
        run=RUN,
        round=7,
        step=step,
        tensors=("head.*", "final_norm.weight"),
        method="trimmed_mean",
        params={"trim_ratio": 0.1, "clip_input_norm": 10.0},
        inputs=(
            _input(p2, step, b"g2"),
            _input(p1, step, b"g1", codec=Codec("int8", block=64)),
        ),
        excluded=(RecordExclusion(peer=p3.did, reason="timeout"),),
        output=raw_cid(b"aggregate " + step.encode()),
        coordinator=coord.did,
    )
    fields.update(kw)
    return StepRecord(**fields)


def _round(coord: SigningKey, **kw: Any) -> SteppedRoundRecord:
    fields: dict[str, Any] = dict(
        job=JOB,
        run=RUN,
        round=7,
        steps=(
            RoundStep("head", record=record_cid(b"step head"), output=raw_cid(b"agg head")),
            RoundStep("block1", failed="quorum not met: 1 of 2 peers by the deadline"),
            RoundStep("block0", record=record_cid(b"step block0"), output=raw_cid(b"agg b0")),
        ),
        output=raw_cid(b"model"),
        prev=record_cid(b"round 6"),
        coordinator=coord.did,
    )
    fields.update(kw)
    return SteppedRoundRecord(**fields)


def _signed(node: dict[str, Any], key: SigningKey) -> bytes:
    """``node`` signed as a (possibly hostile) coordinator would: sig over the rest."""
    node = {k: v for k, v in node.items() if k != "sig"}
    return cbor.encode({**node, "sig": key.sign(cbor.encode(node))})


def _reason(decode: Any, data: bytes) -> str:
    with pytest.raises(MessageError) as info:
        decode(data)
    return info.value.reason


# --- gradstore/step/1 ---------------------------------------------------------------------


def test_step_record_round_trip_and_layout(coord_key: SigningKey) -> None:
    rec = _step(coord_key)
    cid, data = encode_step_record(rec, coord_key)
    assert cid.codec == DAG_CBOR and cid.matches(data)
    assert decode_step_record(data, cid=cid) == rec
    node = cbor.decode(data)
    assert list(node) == [  # DAG-CBOR order: by length, then bytewise
        "job",
        "run",
        "sig",
        "step",
        "type",
        "round",
        "inputs",
        "method",
        "output",
        "params",
        "tensors",
        "excluded",
        "coordinator",
    ]
    assert node["type"] == "gradstore/step/1" and node["step"] == "head"
    assert node["tensors"] == ["head.*", "final_norm.weight"]  # the job file's order
    assert sorted(node["inputs"][0]) == sorted(
        ["peer", "gradient", "num_samples", "weight", "codec", "sent_at", "peer_sig"]
    )
    sig = node.pop("sig")
    assert coord_key.sign(cbor.encode(node)) == sig


def test_step_record_cid_is_pinned(coord_key: SigningKey) -> None:
    cid, data = encode_step_record(_step(coord_key), coord_key)
    assert str(cid) == GOLDEN_STEP
    assert encode_step_record(decode_step_record(data), coord_key) == (cid, data)


def test_each_inputs_peer_signature_covers_the_step(coord_key: SigningKey) -> None:
    rec = decode_step_record(encode_step_record(_step(coord_key), coord_key)[1])
    assert all(i.peer_signed(rec) for i in rec.inputs)
    assert rec.inputs[0].announcement(rec).step == "head"
    # the same signed inputs under another step's name: no peer signed that
    moved = replace(rec, step="block0")
    assert not any(i.peer_signed(moved) for i in moved.inputs)
    # announcements signed without a step (an unstepped job's) do not cover a step record
    p1, p2 = seeded_key(1), seeded_key(2)
    unstepped = replace(rec, inputs=(_input(p1, None, b"g1"), _input(p2, None, b"g2")))
    assert not any(i.peer_signed(unstepped) for i in unstepped.inputs)


def test_a_step_record_needs_signed_inputs(coord_key: SigningKey) -> None:
    rec = _step(coord_key)
    bare = tuple(replace(i, sent_at=None, peer_sig=None) for i in rec.inputs)
    with pytest.raises(MessageError, match="peer_sig"):
        replace(rec, inputs=bare)
    with pytest.raises(MessageError, match="at least one input"):
        replace(rec, inputs=())


@pytest.mark.parametrize("name", ["w", "layer1/weight", "a.*", "...*", "conv1:0", "a.b.*", "é.*"])
def test_selectors_that_a_job_file_may_list(name: str) -> None:
    assert check_selector("tensors[0]", name) == name


@pytest.mark.parametrize(
    "name",
    ["", "*", ".*", "..*", "a*", "*.w", "a.*.*", "a.b*", "../x", "/abs", "a\x1b[2J", 7, None],
)
def test_selectors_that_are_refused(name: Any, coord_key: SigningKey) -> None:
    with pytest.raises(MessageError) as info:
        check_selector("tensors[0]", name)
    assert info.value.reason == "malformed"
    with pytest.raises(MessageError):
        _step(coord_key, tensors=(name,))


@pytest.mark.parametrize("tensors", [(), ("a.*", "a.*"), "a.*", b"a.*", None, {"a.*": 1}])
def test_a_step_lists_distinct_selectors(tensors: Any, coord_key: SigningKey) -> None:
    with pytest.raises(MessageError) as info:
        _step(coord_key, tensors=tensors)
    assert info.value.reason == "malformed"


@pytest.mark.parametrize("step", ["../../x", "", "a" * 65, ".x", "a b", 7, None])
def test_a_step_name_is_checked_like_a_job_name(step: Any, coord_key: SigningKey) -> None:
    with pytest.raises(MessageError) as info:
        replace(_step(coord_key), step=step)
    assert info.value.reason == "malformed"


def _step_node(coord: SigningKey) -> dict[str, Any]:
    node: dict[str, Any] = cbor.decode(encode_step_record(_step(coord), coord)[1])
    return node


@pytest.mark.parametrize(
    "mutate",
    [
        lambda n: n.update(extra=1),  # an unknown key
        lambda n: n.update(prev=None),  # a round record's key
        lambda n: n.pop("step"),
        lambda n: n.pop("tensors"),
        lambda n: n.update(type="gradstore/round/4"),
        lambda n: n.update(type="gradstore/step/2"),
        lambda n: n.update(step="../../x"),
        lambda n: n.update(step=7),
        lambda n: n.update(tensors="head.*"),  # a string, not a list
        lambda n: n.update(tensors=["head.*", "head.*"]),
        lambda n: n.update(tensors=["head*"]),
        lambda n: n.update(tensors=[]),
        lambda n: n.update(round="7"),
        lambda n: n.update(output=str(n["output"])),  # text, not a link
        lambda n: n.update(inputs={}),
        lambda n: n.update(excluded=None),
        lambda n: n.update(inputs=[]),
        lambda n: n["inputs"][0].pop("peer_sig"),  # round/3 inputs
        lambda n: n["inputs"][0].update(weight=1),  # int, not float
        lambda n: n["inputs"].reverse(),  # not sorted by peer
        lambda n: n["inputs"][0].update(peer_sig=b"short"),
        lambda n: n.update(params=[]),
        lambda n: n.update(coordinator="did:key:zbad"),
    ],
)
def test_hostile_step_records_are_malformed_even_when_signed(
    mutate: Any, coord_key: SigningKey
) -> None:
    node = _step_node(coord_key)
    mutate(node)
    assert _reason(decode_step_record, _signed(node, coord_key)) == "malformed"


def test_step_record_signatures_and_hashes(coord_key: SigningKey, peer_key: SigningKey) -> None:
    node = _step_node(coord_key)
    assert _reason(decode_step_record, _signed(node, peer_key)) == "bad-signature"
    node["inputs"][0]["num_samples"] = 5_000  # the coordinator's signature no longer covers it
    assert _reason(decode_step_record, cbor.encode(node)) == "bad-signature"
    _, data = encode_step_record(_step(coord_key), coord_key)
    with pytest.raises(IntegrityError):
        decode_step_record(data, cid=CID.hash(DAG_CBOR, data + b"x"))
    with pytest.raises(MessageError) as info:
        encode_step_record(_step(coord_key), peer_key)
    assert info.value.reason == "not-coordinator"


def test_too_large_step_record(coord_key: SigningKey) -> None:
    _, data = encode_step_record(_step(coord_key), coord_key)
    with pytest.raises(MessageError) as info:
        decode_step_record(data, max_bytes=len(data) - 1)
    assert info.value.reason == "too-large"
    huge = _step(coord_key, tensors=tuple(f"t{i:07d}.{'x' * 200}" for i in range(20_000)))
    _, data = encode_step_record(huge, coord_key)
    assert len(data) > MAX_RECORD_BYTES
    assert _reason(decode_step_record, data) == "too-large"


# --- gradstore/round/5 --------------------------------------------------------------------


def test_stepped_round_record_round_trip_and_layout(coord_key: SigningKey) -> None:
    rec = _round(coord_key)
    cid, data = encode_stepped_record(rec, coord_key)
    assert decode_stepped_record(data, cid=cid) == rec
    node = cbor.decode(data)
    assert list(node) == [
        "job",
        "run",
        "sig",
        "prev",
        "type",
        "round",
        "steps",
        "output",
        "coordinator",
    ]
    assert node["type"] == "gradstore/round/5"
    # the steps in the job's (backward) order, a failed one with its reason and no links
    assert [s["step"] for s in node["steps"]] == ["head", "block1", "block0"]
    assert list(node["steps"][0]) == ["step", "output", "record"]
    assert node["steps"][1] == {"step": "block1", "failed": rec.steps[1].failed}
    assert rec.step_of("block1") == rec.steps[1] and rec.step_of("nope") is None


def test_stepped_round_record_cid_is_pinned(coord_key: SigningKey) -> None:
    cid, data = encode_stepped_record(_round(coord_key), coord_key)
    assert str(cid) == GOLDEN_ROUND
    assert encode_stepped_record(decode_stepped_record(data), coord_key) == (cid, data)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: (s[0], s[0]), "twice"),
        (lambda s: (replace(s[1]), RoundStep("block1", failed="again")), "twice"),
        (lambda s: (s[1],), "at least one closed"),
        (lambda s: (), "at least one closed"),
        (lambda s: ("head",), "RoundStep"),
        (lambda s: "head", "RoundStep"),
    ],
)
def test_stepped_round_steps_are_checked(coord_key: SigningKey, change: Any, match: str) -> None:
    with pytest.raises(MessageError, match=match) as info:
        _round(coord_key, steps=change(_round(coord_key).steps))
    assert info.value.reason == "malformed"


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"step": "../../x", "failed": "x"}, "step"),
        ({"step": "a" * 65, "failed": "x"}, "step"),
        ({"step": "", "failed": "x"}, "step"),
        ({"step": "s"}, "record"),  # neither closed nor failed
        ({"step": "s", "record": record_cid(b"r")}, "output"),
        ({"step": "s", "failed": "x", "record": record_cid(b"r")}, "failed"),
        ({"step": "s", "failed": ""}, "failed"),
        ({"step": "s", "record": raw_cid(b"r"), "output": raw_cid(b"o")}, "dag-cbor"),
        ({"step": "s", "record": "bafy", "output": raw_cid(b"o")}, "record"),
    ],
)
def test_a_round_step_is_closed_or_failed(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(MessageError, match=match) as info:
        RoundStep(**kw)
    assert info.value.reason == "malformed"


def _round_node(coord: SigningKey) -> dict[str, Any]:
    node: dict[str, Any] = cbor.decode(encode_stepped_record(_round(coord), coord)[1])
    return node


@pytest.mark.parametrize(
    "mutate",
    [
        lambda n: n.update(extra=1),
        lambda n: n.update(method="mean"),  # a round/4 key
        lambda n: n.pop("steps"),
        lambda n: n.pop("prev"),
        lambda n: n.update(type="gradstore/round/4"),
        lambda n: n.update(type="gradstore/step/1"),
        lambda n: n.update(steps={}),
        lambda n: n.update(steps=[]),
        lambda n: n["steps"].append(n["steps"][0]),  # a step twice
        lambda n: n["steps"].__setitem__(2, {**n["steps"][2], "step": "head"}),
        lambda n: n["steps"][0].update(step="../../x"),
        lambda n: n["steps"][0].update(step=["head"]),
        lambda n: n["steps"][0].update(extra=1),
        lambda n: n["steps"][0].update(failed="both"),
        lambda n: n["steps"][0].pop("output"),
        lambda n: n["steps"][0].update(output=None),
        lambda n: n["steps"][0].update(record=str(n["steps"][0]["record"])),
        lambda n: n["steps"][0].update(record=raw_cid(b"not a record")),
        lambda n: n["steps"][1].update(failed=None),
        lambda n: n["steps"][1].update(failed=7),
        lambda n: n["steps"].__setitem__(0, "head"),
        lambda n: n.update(prev=raw_cid(b"not a record")),
        lambda n: n.update(output=None),
        lambda n: n.update(round=-1),
        lambda n: n.update(run="Not A Run"),
    ],
)
def test_hostile_stepped_round_records_are_malformed_even_when_signed(
    mutate: Any, coord_key: SigningKey
) -> None:
    node = _round_node(coord_key)
    mutate(node)
    assert _reason(decode_stepped_record, _signed(node, coord_key)) == "malformed"


def test_stepped_round_record_signatures_and_size(
    coord_key: SigningKey, peer_key: SigningKey
) -> None:
    node = _round_node(coord_key)
    assert _reason(decode_stepped_record, _signed(node, peer_key)) == "bad-signature"
    node["steps"].reverse()  # the order is signed: it is the job's
    assert _reason(decode_stepped_record, cbor.encode(node)) == "bad-signature"
    long = "x" * (MAX_RECORD_BYTES // 4)
    huge = _round(
        coord_key,
        steps=(
            _round(coord_key).steps[0],
            *(RoundStep(f"s{i}", failed=long) for i in range(5)),
        ),
    )
    _, data = encode_stepped_record(huge, coord_key)
    assert _reason(decode_stepped_record, data) == "too-large"


def test_each_decoder_reads_only_its_record_type(coord_key: SigningKey) -> None:
    """Old round/2-4 records still decode with decode_record alone; a step or round/5 record
    is never read as one of them, nor the other way round."""
    _, step = encode_step_record(_step(coord_key), coord_key)
    _, stepped = encode_stepped_record(_round(coord_key), coord_key)
    for data in (step, stepped):
        assert _reason(decode_record, data) == "malformed"
    assert _reason(decode_step_record, stepped) == "malformed"
    assert _reason(decode_stepped_record, step) == "malformed"


def test_a_round_links_its_step_records(coord_key: SigningKey) -> None:
    head = _step(coord_key, "head")
    head_cid, _ = encode_step_record(head, coord_key)
    rec = _round(
        coord_key,
        steps=(RoundStep("head", record=head_cid, output=head.output),),
    )
    check_step_of(rec, head_cid, head)
    for wrong_cid, step in [
        (record_cid(b"another"), head),  # not the record the round links
        (head_cid, replace(head, step="block0")),  # a step the round does not close
        (head_cid, replace(head, round=8)),
        (head_cid, replace(head, coordinator=seeded_key(7).did)),
        (head_cid, replace(head, output=raw_cid(b"other aggregate"))),
    ]:
        with pytest.raises(MessageError) as info:
            check_step_of(rec, wrong_cid, step)
        assert info.value.reason == "malformed"
