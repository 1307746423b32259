"""CAR v1: write -> read round trips, incremental parsing, and every refusal."""

from __future__ import annotations

import dag_cbor
import numpy as np
import pytest
from multiformats import CID as MFCID

from gradstore.dag import CID, RAW, Block, CarReader, build_file, encode_header, write_car
from gradstore.dag.varint import encode_varint
from gradstore.errors import DAGError

SEED = 7


def _blocks() -> list[Block]:
    data = np.random.default_rng(SEED).integers(0, 256, 5000, dtype=np.uint8)
    return list(build_file([data], chunk_size=1024))


def _car(roots: list[CID], blocks: list[Block]) -> bytes:
    return b"".join(bytes(part) for part in write_car(roots, blocks))


def _read(stream: bytes, step: int, **kw: int) -> tuple[list[CID] | None, list[Block]]:
    reader = CarReader(**kw)
    out: list[Block] = []
    for i in range(0, len(stream), step):
        out += reader.feed(stream[i : i + step])
    reader.close()
    return reader.roots, out


def test_header_is_the_dag_cbor_encoding() -> None:
    root = CID.hash(RAW, b"x")
    expected = dag_cbor.encode({"roots": [MFCID.decode(str(root))], "version": 1})
    assert encode_header([root]) == expected
    assert encode_header([]) == dag_cbor.encode({"roots": [], "version": 1})
    many = [CID.hash(RAW, bytes([i])) for i in range(30)]  # array length needs a 1-byte head
    assert encode_header(many) == dag_cbor.encode(
        {"roots": [MFCID.decode(str(c)) for c in many], "version": 1}
    )


@pytest.mark.parametrize("step", [1, 7, 1000, 1 << 20])
def test_round_trip_in_any_feed_size(step: int) -> None:
    blocks = _blocks()
    root = blocks[-1].cid
    roots, got = _read(_car([root], blocks), step)
    assert roots == [root]
    assert [(b.cid, bytes(b.data)) for b in got] == [(b.cid, bytes(b.data)) for b in blocks]


def test_writer_passes_block_data_through_without_copying() -> None:
    blocks = _blocks()
    parts = list(write_car([blocks[-1].cid], blocks))
    for block in blocks:
        assert any(part is block.data for part in parts)


def test_empty_block_and_empty_roots_round_trip() -> None:
    empty = Block(CID.hash(RAW, b""), b"")
    roots, got = _read(_car([], [empty]), 3)
    assert roots == []
    assert [(b.cid, bytes(b.data)) for b in got] == [(empty.cid, b"")]


def test_roots_are_known_as_soon_as_the_header_is_read() -> None:
    root = CID.hash(RAW, b"x")
    stream = _car([root], [Block(root, b"x")])
    reader = CarReader()
    header_len = stream[0] + 1
    assert reader.feed(stream[:header_len]) == []
    assert reader.roots == [root]


def test_truncated_stream_is_refused_at_close() -> None:
    stream = _car([CID.hash(RAW, b"x")], _blocks())
    reader = CarReader()
    reader.feed(stream[:-1])
    with pytest.raises(DAGError, match="truncated"):
        reader.close()
    half_varint = CarReader()
    half_varint.feed(stream[: stream[0] + 1] + b"\x80")
    with pytest.raises(DAGError, match="truncated"):
        half_varint.close()


def test_stream_without_header_is_refused() -> None:
    with pytest.raises(DAGError, match="before its header"):
        CarReader().close()


def test_feed_after_close_is_refused() -> None:
    reader = CarReader()
    reader.feed(_car([], []))
    reader.close()
    with pytest.raises(DAGError, match="after close"):
        reader.feed(b"\x00")


def _frame(header: object) -> bytes:
    raw = dag_cbor.encode(header)
    return encode_varint(len(raw)) + raw


def _header() -> bytes:
    header = encode_header([CID.hash(RAW, b"x")])
    return encode_varint(len(header)) + header


@pytest.mark.parametrize(
    ("stream", "match"),
    [
        (b"\xff" * 10, "too long"),
        (b"\x81\x00", "non-minimal"),
        (b"\x00", "header length 0"),
        (b"\xff\xff\xff\x7f", "header length"),
        (b"\x01\xff", "not valid dag-cbor"),
        (b"\x01\x01", "not a map"),
        (_frame({"version": 2}), "CAR version 2"),
        (_frame({"version": True, "roots": []}), "version True"),
        (_frame({"version": 1, "roots": [], "x": 0}), "header keys"),
        (_frame({"version": 1, "roots": [1]}), "list of CIDs"),
        (_header() + b"\x00", "empty CAR section"),
        (_header() + b"\x02\x01\x55", "bad CID"),
        (_header() + b"\xff" * 10, "too long"),
    ],
)
def test_malformed_streams_are_refused(stream: bytes, match: str) -> None:
    with pytest.raises(DAGError, match=match):
        _read(stream, 1)


def test_blocks_over_the_limit_are_refused_before_allocation() -> None:
    big = Block(CID.hash(RAW, bytes(100)), bytes(100))
    stream = _car([big.cid], [big])
    assert _read(stream, 50, max_block_size=100)[1][0].cid == big.cid
    with pytest.raises(DAGError, match="over the 99-byte"):
        _read(stream, 50, max_block_size=99)
    # A section length far past the limit is refused from its varint alone.
    with pytest.raises(DAGError, match="block limit"):
        CarReader(max_block_size=1 << 20).feed(_header() + encode_varint(1 << 40))


def test_sections_inside_an_immutable_chunk_are_not_copied() -> None:
    blocks = _blocks()
    stream = _car([blocks[-1].cid], blocks)
    got = CarReader().feed(stream)
    assert len(got) == len(blocks)
    assert all(isinstance(b.data, memoryview) and b.data.obj is stream for b in got)


def test_sections_from_a_mutable_chunk_are_copied() -> None:
    blocks = _blocks()
    stream = bytearray(_car([blocks[-1].cid], blocks))
    got = CarReader().feed(stream)
    stream[:] = bytes(len(stream))  # a caller reusing its read buffer
    assert [bytes(b.data) for b in got] == [bytes(b.data) for b in blocks]
