"""The signed DAG-CBOR round record: round trip, golden CID, canonical form, refusals."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import dag_cbor
import pytest
from multiformats import CID as MFCID
from multiformats import multihash

from gradstore.dag.cid import CID, DAG_CBOR, DAG_PB
from gradstore.errors import CIDError, IntegrityError
from gradstore.messages import (
    Announce,
    MessageError,
    RecordExclusion,
    RecordInput,
    RoundRecord,
    SigningKey,
    announcement_signature,
    decode_record,
    encode_message,
    encode_record,
)

from .conftest import raw_cid, record_cid, seeded_key

# Record below, signed by the key with seed 100 (Ed25519 signatures are deterministic).
# Changing this CID means every published round record would change: bump the record type.
SHA512_LINK = MFCID("base32", 1, "raw", multihash.digest(b"x", "sha2-512"))
GOLDEN_CID = "bafyreigwvxvovyiv6gkei7mfheefknihy2kx7mcu7l3ubnxlem43a5xoaa"


def _record(coord: SigningKey, **kw: Any) -> RoundRecord:
    p1, p2, p3 = (seeded_key(i).did for i in (1, 2, 3))
    fields: dict[str, Any] = dict(
        job="mnist-demo",
        run="k3x9run0000000000000000000",
        round=7,
        method="trimmed_mean",
        params={"trim_ratio": 0.1, "clip": {"l2": 10.0}, "seed": 42, "tags": ["a", "b"]},
        inputs=(
            RecordInput(peer=p2, gradient=raw_cid(b"g2"), num_samples=500, weight=0.5),
            RecordInput(peer=p1, gradient=raw_cid(b"g1"), num_samples=500, weight=0.5),
        ),
        excluded=(
            RecordExclusion(peer=p3, reason="nan-values", cid=raw_cid(b"g3")),
            RecordExclusion(peer=p3, reason="timeout"),
        ),
        output=raw_cid(b"aggregate"),
        prev=record_cid(b"round 6"),
        coordinator=coord.did,
    )
    fields.update(kw)
    return RoundRecord(**fields)


def test_round_trip(coord_key: SigningKey) -> None:
    rec = _record(coord_key)
    cid, data = encode_record(rec, coord_key)
    assert cid.codec == DAG_CBOR and cid.matches(data)
    assert decode_record(data, cid=cid) == rec
    assert decode_record(data) == rec


def test_golden_cid_is_stable(coord_key: SigningKey) -> None:
    cid, data = encode_record(_record(coord_key), coord_key)
    assert str(cid) == GOLDEN_CID
    assert encode_record(decode_record(data), coord_key) == (cid, data)


def test_first_round_has_null_prev(coord_key: SigningKey) -> None:
    rec = _record(coord_key, prev=None, excluded=())
    cid, data = encode_record(rec, coord_key)
    node = dag_cbor.decode(data)
    assert node["prev"] is None and node["excluded"] == []
    assert decode_record(data, cid=cid) == rec


def test_node_layout_matches_design(coord_key: SigningKey) -> None:
    _, data = encode_record(_record(coord_key), coord_key)
    node = dag_cbor.decode(data)
    # DAG-CBOR map key order: by length, then bytewise
    assert list(node) == [
        "job",
        "run",
        "sig",
        "prev",
        "type",
        "round",
        "inputs",
        "method",
        "output",
        "params",
        "excluded",
        "coordinator",
    ]
    assert node["type"] == "gradstore/round/2"
    assert isinstance(node["output"], MFCID) and isinstance(node["prev"], MFCID)
    assert [i["peer"] for i in node["inputs"]] == sorted(i["peer"] for i in node["inputs"])
    assert isinstance(node["inputs"][0]["gradient"], MFCID)
    assert node["inputs"][0]["weight"] == 0.5
    assert b"\xfb\x3f\xe0\x00\x00\x00\x00\x00\x00" in data  # 0.5 as a 64-bit float
    assert node["excluded"][0] == {"peer": seeded_key(3).did, "reason": "timeout"}  # no cid key
    # an excluded input's CID is text, so the record's DAG never depends on it
    assert node["excluded"][1]["cid"] == str(raw_cid(b"g3"))
    sig = node.pop("sig")
    assert coord_key.sign(dag_cbor.encode(node)) == sig


def test_construction_sorts_inputs_and_exclusions(coord_key: SigningKey) -> None:
    rec = _record(coord_key)
    assert [i.peer for i in rec.inputs] == sorted(i.peer for i in rec.inputs)
    assert [e.reason for e in rec.excluded] == ["timeout", "nan-values"]  # no cid sorts first


def test_weights_are_stored_as_floats(coord_key: SigningKey) -> None:
    assert (
        RecordInput(peer=coord_key.did, gradient=raw_cid(b"x"), num_samples=1, weight=1).weight
        == 1.0
    )


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), True, "1"])
def test_weights_must_be_finite_numbers(weight: Any, coord_key: SigningKey) -> None:
    with pytest.raises(MessageError, match="weight"):
        RecordInput(peer=coord_key.did, gradient=raw_cid(b"x"), num_samples=1, weight=weight)


@pytest.mark.parametrize(
    "params", [{"x": float("nan")}, {"x": b"bytes"}, {1: "int key"}, {"x": 2**64}, {"x": object()}]
)
def test_params_must_be_json_like(params: Any, coord_key: SigningKey) -> None:
    with pytest.raises(MessageError, match="params"):
        _record(coord_key, params=params)


def test_duplicate_input_peer_is_refused(coord_key: SigningKey) -> None:
    one = RecordInput(peer=seeded_key(1).did, gradient=raw_cid(b"a"), num_samples=1, weight=1.0)
    two = replace(one, gradient=raw_cid(b"b"))
    with pytest.raises(MessageError, match="twice"):
        _record(coord_key, inputs=(one, two))


def test_prev_must_be_a_record(coord_key: SigningKey) -> None:
    with pytest.raises(MessageError, match="prev"):
        _record(coord_key, prev=raw_cid(b"not a record"))


def test_only_the_coordinator_can_sign(coord_key: SigningKey, peer_key: SigningKey) -> None:
    with pytest.raises(MessageError) as info:
        encode_record(_record(coord_key), peer_key)
    assert info.value.reason == "not-coordinator"


def _node(coord: SigningKey) -> dict[str, Any]:
    _, data = encode_record(_record(coord), coord)
    node: dict[str, Any] = dag_cbor.decode(data)
    return node


def _resign(node: dict[str, Any], key: SigningKey) -> bytes:
    node = {k: v for k, v in node.items() if k != "sig"}
    node["sig"] = key.sign(dag_cbor.encode(node))
    return bytes(dag_cbor.encode(node))


def _reason(data: bytes) -> str:
    with pytest.raises(MessageError) as info:
        decode_record(data)
    return info.value.reason


def test_tampered_record_is_bad_signature(coord_key: SigningKey) -> None:
    node = _node(coord_key)
    node["inputs"][0]["weight"] = 0.9
    assert _reason(bytes(dag_cbor.encode(node))) == "bad-signature"


def test_record_signed_by_someone_else_is_bad_signature(
    coord_key: SigningKey, peer_key: SigningKey
) -> None:
    assert _reason(_resign(_node(coord_key), peer_key)) == "bad-signature"


def test_wrong_hash_is_integrity_error(coord_key: SigningKey) -> None:
    cid, data = encode_record(_record(coord_key), coord_key)
    other = CID.hash(DAG_CBOR, data + b"x")
    with pytest.raises(IntegrityError) as info:
        decode_record(data, cid=other)
    assert info.value.cid == str(other)
    with pytest.raises(CIDError):
        decode_record(data, cid=CID(0x55, cid.digest))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda n: n.update(type="gradstore/round/1"),
        lambda n: n.update(run="Not A Run Id"),
        lambda n: n.pop("run"),
        lambda n: n["excluded"][1].update(cid=MFCID.decode(n["excluded"][1]["cid"])),  # a link
        lambda n: n["excluded"][1].update(  # not the canonical text
            cid=MFCID.decode(n["excluded"][1]["cid"]).encode("base58btc")
        ),
        lambda n: n.update(extra=1),
        lambda n: n.pop("params"),
        lambda n: n.update(round=-1),
        lambda n: n.update(output=str(n["output"])),  # a string, not a link
        lambda n: n["inputs"][0].update(weight=1),  # int, not float
        lambda n: n["inputs"][0].pop("num_samples"),
        lambda n: n["inputs"].reverse(),  # not sorted by peer
        lambda n: n["excluded"][0].update(cid=None),  # absent, never null
        lambda n: n.update(coordinator="did:key:zbad"),
        lambda n: n["params"].update(blob=b"bytes"),
        lambda n: n["inputs"][0].update(gradient=SHA512_LINK),  # not verifiable here
    ],
)
def test_schema_violations_are_malformed_even_when_signed(
    mutate: Any, coord_key: SigningKey
) -> None:
    node = _node(coord_key)
    mutate(node)
    assert _reason(_resign(node, coord_key)) == "malformed"


def test_non_dag_cbor_bytes_are_malformed(coord_key: SigningKey) -> None:
    _, data = encode_record(_record(coord_key), coord_key)
    assert _reason(data[:-1]) == "malformed"
    assert _reason(b"\xa1\x61a\xfa\x3f\x80\x00\x00") == "malformed"  # float32
    assert _reason(b"\x5b\xff\xff\xff\xff\x00\x00\x00\x00") == "malformed"  # absurd length


def test_oversized_record_is_refused(coord_key: SigningKey) -> None:
    _, data = encode_record(_record(coord_key), coord_key)
    with pytest.raises(MessageError) as info:
        decode_record(data, max_bytes=len(data) - 1)
    assert info.value.reason == "too-large"


# --- gradstore/round/3: the codec of every input ----------------------------------------


def _with_codecs(coord: SigningKey) -> RoundRecord:
    from gradstore.format import Codec

    rec = _record(coord)
    topk = Codec("topk", chunk=4096, k=61, index=12, values="int8")
    return replace(rec, inputs=(replace(rec.inputs[0], codec=topk), rec.inputs[1]))


def test_a_round_with_a_compressed_input_is_round_3_naming_every_codec(
    coord_key: SigningKey,
) -> None:
    rec = _with_codecs(coord_key)
    cid, data = encode_record(rec, coord_key)
    node = dag_cbor.decode(data)
    assert node["type"] == "gradstore/round/3"
    assert [i["codec"] for i in node["inputs"]] == [
        {"name": "topk", "chunk": 4096, "k": 61, "index": 12, "values": "int8"},
        None,
    ]
    back = decode_record(data, cid=cid)
    assert back == rec and back.inputs[0].codec == rec.inputs[0].codec
    assert back.inputs[1].codec is None
    # a dense round keeps round/2 and its CID
    cid2, _ = encode_record(_record(coord_key), coord_key)
    assert str(cid2) == GOLDEN_CID


def _resigned(coord: SigningKey, node: dict[str, Any]) -> bytes:
    node.pop("sig", None)
    node["sig"] = coord.sign(dag_cbor.encode(node))
    return bytes(dag_cbor.encode(node))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda n: n.update(type="gradstore/round/2"), "keys"),  # round/2 has no codec
        (lambda n: [i.update(codec=None) for i in n["inputs"]], "names no codec"),
        (lambda n: n["inputs"][1].pop("codec"), "keys"),
        (lambda n: n["inputs"][0].update(codec={"name": "topk", "k": 61}), "codec"),
        (lambda n: n["inputs"][0]["codec"].update(k=0), "codec"),
        (lambda n: n["inputs"][0]["codec"].update(k=True), "codec"),
        (lambda n: n["inputs"][0]["codec"].update(values="int4"), "codec"),
        (lambda n: n["inputs"][0].update(codec="topk"), "codec"),
        (lambda n: n["inputs"][0]["codec"].update(extra=1), "codec"),
    ],
)
def test_codec_entries_are_checked(coord_key: SigningKey, change: Any, match: str) -> None:
    _, data = encode_record(_with_codecs(coord_key), coord_key)
    node = dag_cbor.decode(data)
    change(node)
    with pytest.raises(MessageError, match=match):
        decode_record(_resigned(coord_key, node))


def test_a_codec_must_be_a_codec(coord_key: SigningKey) -> None:
    with pytest.raises(MessageError, match="codec"):
        RecordInput(peer=coord_key.did, gradient=raw_cid(b"x"), num_samples=1, weight=1.0,
                    codec={"name": "bf16"})  # type: ignore[arg-type]  # fmt: skip


def _signed_inputs(rec: RoundRecord, keys: dict[str, SigningKey]) -> RoundRecord:
    """``rec`` as a round/4 record: each input carries its peer's signed announcement."""
    inputs = []
    for i in rec.inputs:
        ann = Announce(
            rec.job, rec.run, rec.round, i.peer, str(i.gradient.to_v1()), i.num_samples, 1_700
        )
        sig = announcement_signature(encode_message(ann, keys[i.peer]))[1]
        inputs.append(replace(i, sent_at=ann.sent_at, peer_sig=sig))
    return replace(rec, inputs=tuple(inputs))


def test_round_4_carries_each_peers_signed_announcement(coord_key: SigningKey) -> None:
    keys = {seeded_key(i).did: seeded_key(i) for i in (1, 2)}
    rec = _signed_inputs(_record(coord_key), keys)
    assert rec.type == "gradstore/round/4"
    cid, data = encode_record(rec, coord_key)
    back = decode_record(data, cid=cid)
    assert back == rec and all(i.peer_signed(back) for i in back.inputs)
    node = dag_cbor.decode(data)
    assert node["type"] == "gradstore/round/4"
    assert sorted(node["inputs"][0]) == sorted(
        ["peer", "gradient", "num_samples", "weight", "codec", "sent_at", "peer_sig"]
    )
    assert node["inputs"][0]["codec"] is None
    # the coordinator's word changed, the peer's signature no longer covers it
    lied = replace(back.inputs[0], num_samples=back.inputs[0].num_samples * 50)
    assert not lied.peer_signed(back)


def test_round_4_inputs_either_all_carry_signatures_or_none(coord_key: SigningKey) -> None:
    keys = {seeded_key(i).did: seeded_key(i) for i in (1, 2)}
    rec = _signed_inputs(_record(coord_key), keys)
    half = (rec.inputs[0], replace(rec.inputs[1], sent_at=None, peer_sig=None))
    with pytest.raises(MessageError, match="every input carries"):
        replace(rec, inputs=half)
    with pytest.raises(MessageError, match="go together"):
        replace(rec.inputs[0], peer_sig=None)
    with pytest.raises(MessageError, match="64 bytes"):
        replace(rec.inputs[0], peer_sig=b"short")
    node = _node(coord_key)
    node["type"] = "gradstore/round/4"  # a round/4 type over round/2 inputs
    assert _reason(_resign(node, coord_key)) == "malformed"


def test_a_peer_announcing_a_cidv0_signs_the_text_the_record_rebuilds(
    coord_key: SigningKey,
) -> None:
    """Kubo's `ipfs add` gives CIDv0 (``Qm...``) texts; a peer that announces one signs the
    CIDv1 text its announcement carries, which is what an auditor rebuilds from the record."""
    peer = seeded_key(1)
    v1 = CID(DAG_PB, bytes(32), 1)
    v0 = CID(DAG_PB, bytes(32), 0)
    assert str(v0).startswith("Qm")
    base = _record(coord_key)
    for given in (v0, str(v0)):
        ann = Announce(base.job, base.run, base.round, peer.did, given, 5, 1_700)  # type: ignore[arg-type]
        assert ann.cid == str(v1)
        sent, sig = announcement_signature(encode_message(ann, peer))
        assert sent.cid == str(v1)
        inp = RecordInput(peer=peer.did, gradient=v0, num_samples=5, weight=1.0,
                          sent_at=1_700, peer_sig=sig)  # fmt: skip
        assert inp.peer_signed(replace(base, inputs=(inp,)))
