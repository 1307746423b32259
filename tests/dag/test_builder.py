"""build_file / layout / file_cid: the balanced layout, streaming order, and Tsize/blocksizes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from gradstore.dag import (
    CID,
    DAG_PB,
    RAW,
    Block,
    block_links,
    build_file,
    chunks,
    decode_pbnode,
    decode_unixfs,
    file_cid,
    layout,
)

SEED = 20250101


def _data(n: int, seed: int = SEED) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _shape(blocks: list[Block]) -> object:
    """The tree under the last block as nested lists of leaf lengths."""
    by_cid = {b.cid: b for b in blocks}

    def walk(cid: CID) -> object:
        block = by_cid[cid]
        if cid.codec == RAW:
            return len(block.data)
        return [walk(c) for c in block_links(block)]

    return walk(blocks[-1].cid)


def _leaves(n: int) -> list[Block]:
    return [Block(CID.hash(RAW, bytes([i])), bytes([i])) for i in range(n)]


@pytest.mark.parametrize(
    ("n", "shape"),
    [
        (1, 1),  # one chunk: the leaf is the root
        (2, [1, 1]),
        (3, [1, 1, 1]),
        (4, [[1, 1, 1], [1]]),  # full: depth grows; a one-child node is kept, not collapsed
        (9, [[1, 1, 1], [1, 1, 1], [1, 1, 1]]),
        (10, [[[1, 1, 1], [1, 1, 1], [1, 1, 1]], [[1]]]),
        (13, [[[1, 1, 1], [1, 1, 1], [1, 1, 1]], [[1, 1, 1], [1]]]),
    ],
)
def test_balanced_layout_shape(n: int, shape: object) -> None:
    blocks = list(layout(iter(_leaves(n)), max_links=3))
    assert _shape(blocks) == shape


def test_internal_node_sizes_follow_kubo() -> None:
    blocks = list(layout(iter(_leaves(4)), max_links=3))
    by_cid = {b.cid: b for b in blocks}
    root = decode_pbnode(blocks[-1].data)
    assert root.data is not None
    fs = decode_unixfs(root.data)
    assert (fs.type, fs.filesize, fs.blocksizes, fs.data) == (2, 4, (3, 1), None)
    assert (fs.mode, fs.mtime) == (None, None)
    for link in root.links:
        child = by_cid[link.hash]
        assert link.name == ""
        child_tsize = sum(x.tsize or 0 for x in decode_pbnode(child.data).links)
        assert link.tsize == len(child.data) + child_tsize  # dag-pb: own bytes + children's Tsizes


def test_blocks_stream_children_before_parents_and_root_last() -> None:
    data = _data(1030 * 1024 + 17)
    blocks = list(build_file([data], chunk_size=1024))  # 1031 chunks: two levels
    position = {b.cid: i for i, b in enumerate(blocks)}
    assert len(position) == len(blocks)  # random data: no repeated block
    for i, block in enumerate(blocks):
        for child in block_links(block):
            assert position[child] < i
    root = blocks[-1]
    assert root.cid.codec == DAG_PB
    assert position[root.cid] == len(blocks) - 1
    shape = _shape(blocks)
    assert isinstance(shape, list)
    assert [len(x) for x in shape] == [1024, 7]
    # The raw leaves, in order, are the input.
    leaves = b"".join(bytes(b.data) for b in blocks if b.cid.codec == RAW)
    assert leaves == data.tobytes(), f"seed={SEED}"


def test_build_file_is_lazy() -> None:
    def pieces() -> Iterator[bytes]:
        yield b"a" * 10
        raise AssertionError("read past the first leaf")

    first = next(iter(build_file(pieces(), chunk_size=4)))
    assert bytes(first.data) == b"aaaa"
    assert first.cid == CID.hash(RAW, b"aaaa")


def test_leaves_are_zero_copy_slices_of_the_input() -> None:
    data = _data(4096)
    blocks = list(build_file([data], chunk_size=1024))
    leaf = blocks[0]
    assert np.shares_memory(np.frombuffer(leaf.data, np.uint8), data)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_file_cid_equals_build_file_root_for_any_thread_count(threads: int) -> None:
    data = _data(3 * (1 << 20) + 5)
    pieces = [data[:1000], data[1000:2_500_000], data[2_500_000:]]
    expected = list(build_file([data]))[-1].cid
    assert file_cid(pieces, threads=threads) == expected
    assert list(build_file(pieces, threads=threads))[-1].cid == expected


def test_chunk_boundaries_do_not_depend_on_pieces() -> None:
    data = _data(5000)
    splits = [data[:1], data[1:1024], data[1024:1025], data[1025:]]
    assert [b.cid for b in build_file(splits, chunk_size=1024)] == [
        b.cid for b in build_file([data.tobytes()], chunk_size=1024)
    ]


def test_identical_chunks_give_identical_leaves() -> None:
    zeros = np.zeros(4 * 1024, dtype=np.uint8)
    blocks = list(build_file([zeros], chunk_size=1024))
    leaves = [b.cid for b in blocks if b.cid.codec == RAW]
    assert len(leaves) == 4 and len(set(leaves)) == 1
    assert block_links(blocks[-1]) == leaves


def test_layout_refuses_degenerate_fanout() -> None:
    with pytest.raises(ValueError, match="max_links"):
        list(layout(iter(_leaves(3)), max_links=1))


def test_chunks_and_build_file_agree_on_leaf_count() -> None:
    data = _data(10_000)
    n_chunks = len(list(chunks([data], 1024)))
    assert sum(b.cid.codec == RAW for b in build_file([data], chunk_size=1024)) == n_chunks
