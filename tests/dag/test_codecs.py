"""dag-pb and UnixFS codecs: canonical output, strict input, every refusal typed."""

from __future__ import annotations

import pytest

from gradstore.dag import (
    CID,
    DAG_PB,
    RAW,
    Block,
    PBLink,
    PBNode,
    UnixFSData,
    block_links,
    decode_pbnode,
    decode_unixfs,
    encode_pbnode,
    encode_unixfs_file,
)
from gradstore.errors import DAGError

LEAF = CID.hash(RAW, b"leaf")


def test_pbnode_round_trip_links_before_data() -> None:
    links = [PBLink(LEAF, "", 4), PBLink(CID.hash(RAW, b"x"), "name", None), PBLink(LEAF, None, 7)]
    raw = encode_pbnode(links, b"\x08\x02")
    assert decode_pbnode(raw) == PBNode(tuple(links), b"\x08\x02")
    assert raw.startswith(b"\x12\x2a\x0a\x24" + LEAF.bytes + b"\x12\x00\x18\x04")
    assert raw.endswith(b"\x0a\x02\x08\x02")


def test_pbnode_without_links_or_data() -> None:
    assert decode_pbnode(b"") == PBNode((), None)
    assert encode_pbnode([], None) == b""


def test_unixfs_file_encoding_is_unpacked_and_minimal() -> None:
    raw = encode_unixfs_file(1_048_577, [1_048_576, 1])
    assert raw.hex() == "080218818040208080402001"
    assert decode_unixfs(raw) == UnixFSData(type=2, filesize=1_048_577, blocksizes=(1_048_576, 1))


def test_unixfs_packed_blocksizes_are_read() -> None:
    raw = b"\x08\x02\x18\x03\x22\x02\x01\x02"  # blocksizes [1, 2] packed
    assert decode_unixfs(raw).blocksizes == (1, 2)


def test_unixfs_reads_data_mode_and_mtime() -> None:
    raw = b"\x08\x00\x12\x02hi\x18\x02\x38\xa4\x03\x42\x02\x08\x01"
    fs = decode_unixfs(raw)
    assert (fs.type, fs.data, fs.filesize, fs.mode, fs.mtime) == (0, b"hi", 2, 420, b"\x08\x01")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x0a\x00\x12\x00", "Links after Data"),
        (b"\x0a\x00\x0a\x00", "two Data"),
        (b"\x1a\x00", "unexpected field"),
        (b"\x12\x09\x0a\x03\x01\x55\x12", "overruns"),  # link length past the end
        (b"\x12\x02\x12\x00", "without a Hash"),
        (b"\x12\x04\x12\x00\x0a\x00", "out-of-order"),  # Name before Hash
        (b"\x12\x03\x0a\x01\x00", "not a supported CID"),
        (b"\x12", "truncated"),
        (b"\x0a\x80\x00", "non-minimal"),
        (b"\x12\x2a\x0a\x24" + LEAF.bytes + b"\x12\x02\xff\xfe", "not UTF-8"),
        (b"\x12\x28\x0a\x24" + LEAF.bytes + b"\x1a\x00", "wire type"),
    ],
)
def test_pbnode_refusals(raw: bytes, match: str) -> None:
    with pytest.raises(DAGError, match=match):
        decode_pbnode(raw)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x18\x01", "without a Type"),
        (b"\x08\x02\x08\x02", "twice"),
        (b"\x08\x02\x12\x00\x12\x00", "twice"),
        (b"\x08\x02\x50\x01", "unexpected field"),
        (b"\x08\x02\x1a\x00", "unexpected field"),  # filesize as bytes
        (b"\x08\x02\x12\x05ab", "overruns"),
        (b"\x08", "truncated"),
        (b"\x08\x02\x18" + b"\xff" * 9 + b"\x01", "longer than"),
    ],
)
def test_unixfs_refusals(raw: bytes, match: str) -> None:
    with pytest.raises(DAGError, match=match):
        decode_unixfs(raw)


def test_block_links() -> None:
    node = encode_pbnode([PBLink(LEAF, "", 4)], encode_unixfs_file(4, [4]))
    assert block_links(Block(CID.hash(DAG_PB, node), node)) == [LEAF]
    assert block_links(Block(LEAF, b"leaf")) == []


def test_block_links_of_dag_cbor() -> None:
    import dag_cbor
    from multiformats import CID as MFCID

    other = CID.hash(DAG_PB, b"n")
    doc = {"a": MFCID.decode(str(LEAF)), "b": [1, {"c": MFCID.decode(str(other))}]}
    raw = dag_cbor.encode(doc)
    assert block_links(Block(CID.hash(0x71, raw), raw)) == [LEAF, other]
    with pytest.raises(DAGError, match="dag-cbor"):
        block_links(Block(CID.hash(0x71, b"\xff"), b"\xff"))
