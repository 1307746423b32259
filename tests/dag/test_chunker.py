"""chunks(): Kubo's size-N splitter over a stream of buffers, zero-copy where it can be."""

from __future__ import annotations

import numpy as np
import pytest

from gradstore.dag import CHUNK_SIZE, chunks


def _concat(pieces: list[bytes]) -> bytes:
    return b"".join(pieces)


@pytest.mark.parametrize(
    "lengths",
    [
        [10],
        [4, 4],
        [3, 0, 5, 0, 0, 9],
        [1] * 13,
        [0, 0],
        [],
        [8],
        [7, 1, 8, 16, 2],
    ],
)
def test_chunks_cut_the_concatenation_every_size_bytes(lengths: list[int]) -> None:
    seed = 1234
    rng = np.random.default_rng(seed)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    whole = _concat(pieces)
    got = [bytes(c) for c in chunks(pieces, size=4)]
    assert got == [whole[i : i + 4] for i in range(0, len(whole), 4)], f"seed={seed}"
    assert all(len(c) > 0 for c in got)  # never an empty chunk, the last is the remainder


def test_aligned_chunks_are_zero_copy_views() -> None:
    data = np.arange(3 * 256, dtype=np.uint8)
    got = list(chunks([data], size=256))
    assert len(got) == 3
    for i, c in enumerate(got):
        assert np.shares_memory(np.frombuffer(c, np.uint8), data)
        assert bytes(c) == data[i * 256 : (i + 1) * 256].tobytes()


def test_straddling_chunk_is_a_fresh_copy_and_the_rest_stay_views() -> None:
    a = np.full(6, 1, dtype=np.uint8)
    b = np.full(10, 2, dtype=np.uint8)
    got = list(chunks([a, b], size=4))
    assert [bytes(c) for c in got] == [b"\1" * 4, b"\1\1\2\2", b"\2" * 4, b"\2" * 4]
    assert np.shares_memory(np.frombuffer(got[0], np.uint8), a)
    straddler = np.frombuffer(got[1], np.uint8)
    assert not np.shares_memory(straddler, a) and not np.shares_memory(straddler, b)
    assert np.shares_memory(np.frombuffer(got[2], np.uint8), b)
    # Each straddling chunk has its own buffer: keeping one never sees a later one's bytes.
    got2 = list(chunks([b"ab", b"cd", b"ef", b"gh"], size=3))
    assert [bytes(c) for c in got2] == [b"abc", b"def", b"gh"]


def test_multidimensional_and_typed_arrays_are_cut_as_their_bytes() -> None:
    arr = np.arange(12, dtype="<f4").reshape(3, 4)
    got = b"".join(bytes(c) for c in chunks([arr, memoryview(b"xyz")], size=5))
    assert got == arr.tobytes() + b"xyz"


def test_non_contiguous_buffers_are_refused() -> None:
    arr = np.arange(16, dtype=np.uint8).reshape(4, 4)[:, ::2]
    with pytest.raises(TypeError, match="C-contiguous"):
        list(chunks([arr], size=4))


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        list(chunks([b"abc"], size=0))


def test_default_size_is_one_mebibyte() -> None:
    assert CHUNK_SIZE == 1 << 20
    data = np.zeros(CHUNK_SIZE + 5, dtype=np.uint8)
    assert [len(c) for c in chunks([data])] == [CHUNK_SIZE, 5]
