"""FileAssembler: verified reassembly in parent-first orders, dedup, and every refusal."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gradstore.dag import (
    CID,
    DAG_PB,
    RAW,
    Block,
    CarReader,
    FileAssembler,
    PBLink,
    block_links,
    build_file,
    chunks,
    decode_pbnode,
    encode_pbnode,
    encode_unixfs_file,
    layout,
    write_car,
)
from gradstore.errors import DAGError, IntegrityError, LimitExceededError

SEED = 99


def _data(n: int, seed: int = SEED) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _small_dag(data: bytes, chunk: int, max_links: int) -> list[Block]:
    leaves = (Block(CID.hash(RAW, c), bytes(c)) for c in chunks([data], chunk))
    return list(layout(leaves, max_links=max_links))


def _node(children: list[tuple[CID, int]], filesize: int | None = None) -> Block:
    sizes = [size for _, size in children]
    data = encode_unixfs_file(sum(sizes) if filesize is None else filesize, sizes)
    raw = encode_pbnode([PBLink(cid, "", size) for cid, size in children], data)
    return Block(CID.hash(DAG_PB, raw), raw)


def _leaf(data: bytes) -> Block:
    return Block(CID.hash(RAW, data), data)


def _preorder(blocks: list[Block]) -> list[Block]:
    """Kubo's dag/export order: depth-first, parent first, each CID once."""
    by_cid = {b.cid: b for b in blocks}
    seen: set[CID] = set()
    out: list[Block] = []
    stack = [blocks[-1].cid]
    while stack:
        cid = stack.pop()
        if cid in seen:
            continue
        seen.add(cid)
        out.append(by_cid[cid])
        stack.extend(reversed(block_links(by_cid[cid])))
    return out


def _assemble_by_wanted(blocks: list[Block], seed: int, max_size: int) -> FileAssembler:
    """Block-by-block fetching: repeatedly add a random block from wanted()."""
    by_cid = {b.cid: b for b in blocks}
    asm = FileAssembler(blocks[-1].cid, max_size)
    rng = random.Random(seed)
    while not asm.done:
        wanted = sorted(asm.wanted(), key=str)
        asm.add(by_cid[rng.choice(wanted)])
    return asm


def test_preorder_reassembly_of_a_two_level_file() -> None:
    data = _data(1030 * 1024 + 3)
    blocks = list(build_file([data], chunk_size=1024))
    asm = FileAssembler(blocks[-1].cid, max_size=len(data))
    assert asm.wanted() == {blocks[-1].cid}
    for block in _preorder(blocks):
        assert not asm.done
        asm.add(block)
    assert asm.done and asm.wanted() == set()
    out = asm.result()
    assert out.dtype == np.uint8 and out.ndim == 1
    assert np.array_equal(out, data), f"seed={SEED}"


def test_the_buffer_may_be_the_callers_of_exactly_the_declared_size() -> None:
    """``allocate`` gives the buffer (a coordinator's spill file, mapped): the file's bytes
    land in it; one of another size is refused before a leaf is placed."""
    data = _data(5 * 1024 + 7)
    blocks = list(build_file([data], chunk_size=1024))
    given = bytearray(len(data))
    asm = FileAssembler(blocks[-1].cid, max_size=len(data), allocate=lambda n: memoryview(given))
    for block in _preorder(blocks):
        asm.add(block)
    assert given == data.tobytes() and asm.view().obj is given
    short = FileAssembler(
        blocks[-1].cid, max_size=len(data), allocate=lambda n: memoryview(given)[1:]
    )
    with pytest.raises(ValueError, match="gave a buffer of"):
        short.add(blocks[-1])


@pytest.mark.parametrize("seed", range(5))
def test_shuffled_parent_first_order(seed: int) -> None:
    data = _data(20 * 1024 + 1, seed)
    blocks = list(build_file([data], chunk_size=1024))
    assert np.array_equal(_assemble_by_wanted(blocks, seed, len(data)).result(), data)


def test_zero_filled_file_is_sent_once_per_distinct_block() -> None:
    # 2050 equal chunks: root -> [N, N, M]; N holds 1024 copies of one zero leaf.
    data = np.zeros(2050 * 64, dtype=np.uint8)
    blocks = list(build_file([data], chunk_size=64))
    sent = _preorder(blocks)
    assert len(sent) == 4  # root, N, the zero leaf, M
    asm = FileAssembler(blocks[-1].cid, max_size=len(data))
    for block in sent:
        asm.add(block)
    assert asm.done
    assert np.array_equal(asm.result(), data)


@pytest.mark.parametrize("seed", range(20))
def test_repeated_subtrees_in_any_parent_first_order(seed: int) -> None:
    # A 3-letter alphabet, 1-byte chunks and fanout 2 repeat leaves and subtrees at many depths.
    rng = np.random.default_rng(seed)
    data = rng.choice(np.frombuffer(b"ab\0", np.uint8), size=int(rng.integers(2, 60))).tobytes()
    blocks = _small_dag(data, chunk=1, max_links=2)
    asm = _assemble_by_wanted(blocks, seed, len(data))
    assert asm.result().tobytes() == data, f"seed={seed}"
    asm2 = FileAssembler(blocks[-1].cid, len(data))
    for block in _preorder(blocks):
        asm2.add(block)
    assert asm2.result().tobytes() == data, f"seed={seed}"


def test_single_chunk_and_empty_files_are_raw_roots() -> None:
    for payload in (b"hello world", b""):
        leaf = _leaf(payload)
        asm = FileAssembler(str(leaf.cid), max_size=100)
        asm.add(leaf)
        assert asm.done and asm.result().tobytes() == payload


def test_reassembly_from_a_car_stream_fed_in_pieces() -> None:
    data = _data(10 * 1024 + 5)
    blocks = list(build_file([data], chunk_size=1024))
    stream = b"".join(bytes(p) for p in write_car([blocks[-1].cid], _preorder(blocks)))
    reader = CarReader()
    asm: FileAssembler | None = None
    for i in range(0, len(stream), 333):
        for block in reader.feed(stream[i : i + 333]):
            if asm is None:
                assert reader.roots is not None
                asm = FileAssembler(reader.roots[0], max_size=len(data))
            asm.add(block)
    reader.close()
    assert asm is not None and np.array_equal(asm.result(), data)


def test_a_flipped_byte_is_an_integrity_error_naming_the_cid() -> None:
    data = _data(3 * 1024)
    blocks = list(build_file([data], chunk_size=1024))
    root, leaves = blocks[-1], blocks[:-1]
    asm = FileAssembler(root.cid, max_size=len(data))
    asm.add(root)
    bad = bytearray(leaves[1].data)
    bad[17] ^= 0x01
    with pytest.raises(IntegrityError, match=str(leaves[1].cid)) as info:
        asm.add(Block(leaves[1].cid, bytes(bad)))
    assert info.value.cid == str(leaves[1].cid)
    assert leaves[1].cid in asm.wanted()
    for leaf in (leaves[0], leaves[2]):
        asm.add(leaf)
    with pytest.raises(DAGError, match="incomplete"):
        asm.result()
    asm.add(leaves[1])  # the genuine block still fits: the bad one wrote nothing
    assert np.array_equal(asm.result(), data)


def test_a_corrupt_root_is_refused_before_allocation() -> None:
    root = _node([(CID.hash(RAW, b"x"), 1)] * 2)
    asm = FileAssembler(root.cid, max_size=10)
    with pytest.raises(IntegrityError):
        asm.add(Block(root.cid, bytes(root.data[:-1]) + b"\x02"))
    assert not asm.done
    with pytest.raises(DAGError, match="incomplete"):
        asm.result()


def test_missing_blocks_leave_the_result_unavailable() -> None:
    data = _data(3 * 1024)
    blocks = list(build_file([data], chunk_size=1024))
    asm = FileAssembler(blocks[-1].cid, max_size=len(data))
    with pytest.raises(DAGError, match="incomplete"):
        asm.result()
    asm.add(blocks[-1])
    asm.add(blocks[0])
    assert not asm.done
    assert asm.wanted() == {blocks[1].cid, blocks[2].cid}
    with pytest.raises(DAGError, match="2 block"):
        asm.result()


def test_declared_size_over_the_limit_allocates_nothing() -> None:
    # The root claims 2**50 bytes: allocating first would raise MemoryError, not this.
    huge = _node([(CID.hash(RAW, b"x"), 1 << 50)])
    asm = FileAssembler(huge.cid, max_size=1 << 30)
    with pytest.raises(LimitExceededError, match="over the 1073741824-byte limit"):
        asm.add(huge)
    leaf = _leaf(b"abcdef")
    raw_root = FileAssembler(leaf.cid, max_size=5)
    with pytest.raises(LimitExceededError):
        raw_root.add(leaf)


def test_unwanted_blocks_are_refused() -> None:
    leaf = _leaf(b"a")
    root = _node([(leaf.cid, 1)])
    asm = FileAssembler(root.cid, max_size=10)
    with pytest.raises(DAGError, match="unexpected block"):
        asm.add(leaf)  # not wanted before its parent arrives
    asm.add(root)
    with pytest.raises(DAGError, match="unexpected block"):
        asm.add(_leaf(b"b"))
    asm.add(leaf)
    asm.add(leaf)  # a repeat of a placed block changes nothing
    assert asm.result().tobytes() == b"a"


LEAF_A = _leaf(b"aaaa")


def _malformed_cases() -> list[tuple[list[Block], str]]:
    directory = Block(
        CID.hash(DAG_PB, encode_pbnode([], b"\x08\x01")), encode_pbnode([], b"\x08\x01")
    )
    no_data = Block(CID.hash(DAG_PB, encode_pbnode([], None)), encode_pbnode([], None))
    counts = encode_pbnode(
        [PBLink(LEAF_A.cid, "", 4), PBLink(LEAF_A.cid, "", 4)], encode_unixfs_file(4, [4])
    )
    no_filesize = encode_pbnode([PBLink(LEAF_A.cid, "", 4)], b"\x08\x02\x20\x04")
    inner = _node([(LEAF_A.cid, 4)])
    cbor_link = CID.hash(0x71, b"\xa0")
    return [
        ([_node([(LEAF_A.cid, 4)], filesize=5)], "filesize 5 != data 0 \\+ sum of blocksizes 4"),
        ([_node([(LEAF_A.cid, 3)]), LEAF_A], "has 4 bytes, its parent declares 3"),
        ([Block(CID.hash(DAG_PB, counts), counts)], "2 links but 1 blocksizes"),
        ([directory], "DIRECTORY, not a File"),
        ([no_data], "no UnixFS data"),
        ([Block(CID.hash(DAG_PB, no_filesize), no_filesize)], "no filesize"),
        ([_node([(inner.cid, 5)], filesize=5), inner], "declares filesize 4, its parent"),
        ([_node([(cbor_link, 4)])], "links to a dag-cbor block"),
        ([Block(CID.hash(DAG_PB, b"\x0a\x00\x12\x00"), b"\x0a\x00\x12\x00")], "Links after Data"),
    ]


@pytest.mark.parametrize(("sent", "match"), _malformed_cases())
def test_malformed_unixfs_is_refused(sent: list[Block], match: str) -> None:
    asm = FileAssembler(sent[0].cid, max_size=1 << 20)
    with pytest.raises(DAGError, match=match):
        for block in sent:
            asm.add(block)


def test_a_repeated_child_with_a_conflicting_size_is_refused() -> None:
    # The leaf is placed once (4 bytes), then a later node claims the same CID holds 3.
    first = _node([(LEAF_A.cid, 4)])
    second = _node([(LEAF_A.cid, 3)])
    root = _node([(first.cid, 4), (second.cid, 3)])
    asm = FileAssembler(root.cid, max_size=100)
    asm.add(root)
    asm.add(first)
    asm.add(LEAF_A)
    with pytest.raises(DAGError, match="its parent declares 3"):
        asm.add(second)


def test_dag_cbor_root_is_not_a_file() -> None:
    block = Block(CID.hash(0x71, b"\xa0"), b"\xa0")
    with pytest.raises(DAGError, match="not part of a UnixFS file"):
        FileAssembler(block.cid, max_size=10).add(block)


def test_too_many_links_and_too_deep_are_refused() -> None:
    wide = _node([(LEAF_A.cid, 4)] * 5)
    with pytest.raises(DAGError, match="more than 4 links"):
        FileAssembler(wide.cid, max_size=100, max_links=4).add(wide)
    chain = [_node([(LEAF_A.cid, 4)])]
    for _ in range(4):
        chain.append(_node([(chain[-1].cid, 4)]))
    asm = FileAssembler(chain[-1].cid, max_size=100, max_depth=3)
    with pytest.raises(DAGError, match="deeper than 3"):
        for block in reversed(chain):
            asm.add(block)


def test_the_link_limit_is_checked_while_parsing_not_after() -> None:
    # A hostile node: 4 good links, then a malformed one, then megabytes of links. The limit
    # must stop the parse at link 5, before the bad link (or the rest) is ever read.
    links_only = encode_pbnode([PBLink(LEAF_A.cid, "", 4)] * 4, None)
    bad_link = b"\x12\x02\xff\xff"
    hostile = links_only + bad_link + links_only * 10_000
    with pytest.raises(DAGError, match="more than 4 links"):
        decode_pbnode(hostile, max_links=4)
    with pytest.raises(DAGError, match="link"):  # without a limit the bad link is reached
        decode_pbnode(hostile)
    block = Block(CID.hash(0x70, hostile), hostile)
    with pytest.raises(DAGError, match="more than 4 links"):
        FileAssembler(block.cid, max_size=100, max_links=4).add(block)


def test_a_dag_that_expands_far_beyond_its_size_is_refused() -> None:
    # Each level doubles the placements of one empty leaf: 2**30 placements for 0 bytes.
    empty = _leaf(b"")
    level = _node([(empty.cid, 0)] * 2)
    blocks = [level]
    for _ in range(29):
        blocks.append(_node([(blocks[-1].cid, 0)] * 2))
    asm = FileAssembler(blocks[-1].cid, max_size=100, max_links=2)
    with pytest.raises(DAGError, match="too many blocks"):
        for block in reversed(blocks):
            asm.add(block)


def test_leaf_spans_tile_the_file_and_verify_in_place() -> None:
    """What the store's `cat` path relies on: spans cover every byte once, each hashed in place."""
    rng = np.random.default_rng(99)
    data = rng.integers(0, 256, 3 * (1 << 20) + 12345, dtype=np.uint8)
    blocks = list(build_file([memoryview(data)]))
    root = blocks[-1]
    for flip in (None, (1 << 20) + 5):
        asm = FileAssembler(root.cid, len(data))
        assert asm.leaf_spans() is None  # nothing known before the root
        asm.add(root)
        spans = asm.leaf_spans()
        assert spans is not None
        assert [s.offset for s in spans] == [i << 20 for i in range(4)]
        assert sum(s.size for s in spans) == len(data)
        assert [s.cid for s in spans] == [b.cid for b in blocks[:-1]]
        assert asm.buffer is not None
        buf = np.frombuffer(asm.buffer, np.uint8)  # (a memoryview: written as an array here)
        buf[:] = data
        if flip is not None:
            buf[flip] ^= 1
        for s in spans:
            if flip is not None and s.offset <= flip < s.offset + s.size:
                with pytest.raises(IntegrityError) as info:
                    asm.verify_in_place(s)
                assert info.value.cid == str(s.cid)
            else:
                asm.verify_in_place(s)
        assert asm.done == (flip is None)
        if flip is None:
            assert bytes(asm.result()) == data.tobytes()


def test_repeated_leaves_get_one_span_per_place() -> None:
    zeros = np.zeros(3 << 20, dtype=np.uint8)  # three identical leaves, one CID
    blocks = list(build_file([memoryview(zeros)]))
    asm = FileAssembler(blocks[-1].cid, len(zeros))
    asm.add(blocks[-1])
    spans = asm.leaf_spans()
    assert spans is not None and len(spans) == 3 and len({s.cid for s in spans}) == 1
    assert asm.buffer is not None
    asm.buffer[:] = bytes(len(asm.buffer))
    for s in spans:
        assert not asm.done
        asm.verify_in_place(s)
    assert asm.done


def test_a_declared_size_costs_no_memory_until_bytes_arrive() -> None:
    """The coordinator and ranged readers take only a root to learn a document's size: a
    root declaring 1 GiB must not make the process hold 1 GiB (nor zero-fill it)."""
    import resource

    leaves = [CID.hash(RAW, i.to_bytes(4, "little")) for i in range(1024)]
    data = encode_unixfs_file(1024 << 20, [1 << 20] * 1024)
    node = encode_pbnode([PBLink(c, "", 1 << 20) for c in leaves], data)
    root = Block(CID.hash(DAG_PB, node), node)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    asm = FileAssembler(root.cid, max_size=2 << 30)
    asm.add(root)
    assert asm.buffer is not None and asm.buffer.nbytes == 1024 << 20
    assert len(asm.wanted()) == 1024
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grew < 64 << 10, f"peak memory grew {grew >> 10} MiB for a 1 GiB declaration"


def test_a_small_buffer_comes_from_the_heap_and_a_large_one_is_mapped() -> None:
    # a fresh mapping's every page is a fault when first written (0.8 ms of CPU a MiB here):
    # a coordinator's inputs of 1 MiB go into bytearrays, whose pages the heap already had
    import mmap

    from gradstore.dag.assemble import anonymous_buffer

    assert isinstance(anonymous_buffer(1 << 20).obj, bytearray)
    assert isinstance(anonymous_buffer((4 << 20) - 1).obj, bytearray)
    assert isinstance(anonymous_buffer(4 << 20).obj, mmap.mmap)
