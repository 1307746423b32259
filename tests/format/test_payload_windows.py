"""The decoder checks compressed payloads window by window: what it holds beside a document
is bounded by a window, not a multiple of the payload, and a bad record in any window is
still refused and named (issue 23, R2).

Payloads are the tests' own records (test_compressed's packers), repeated.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest

from gradstore.errors import InvalidDocumentError
from gradstore.format import (
    CHECK_SCRATCH_BYTES,
    CompressedGradient,
    Limits,
    decode_any,
    read_header,
)
from gradstore.format._payload import CHECK_WINDOW

from .test_compressed import TOPK, bf, comp, f32, i8, pack2, pack12

MiB = 1 << 20
BIG = Limits(max_bytes=1 << 34, max_elements=1 << 34)

# topk, 2-bit values, 12-bit positions, keeping all 64 of a chunk's elements: the costliest
# payload to check per byte (a 1.5-byte position unpacks to 8 bytes of int64, then its diff)
TWO_BIT_ALL = {"name": "topk", "chunk": 64, "k": 64, "index": 12, "values": "2bit"}
TWO_BIT_RECORD = f32(0.25, 2.0) + pack2(*[1, 0] * 32) + pack12(*range(64))
INT8_ALL = {"name": "topk", "chunk": 64, "k": 64, "index": 12, "values": "int8"}
VALUES = i8(127, *range(-63, 0))  # 64 int8 values, the first of magnitude 127
INT8_RECORD = f32(1 / 127) + VALUES + pack12(*range(64))
INT8_BLOCKS = {"name": "int8", "block": 64}
INT8_BLOCK = f32(1 / 127) + VALUES


def _doc(docs: Any, codec: Any, data: bytes, elements: int) -> bytes:
    return comp(docs, codec, [docs.tensor(shape=(elements,), data=data)])


def _peak(buf: bytes) -> int:
    """Peak bytes traced while the document's header (every payload rule) is checked."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        read_header(buf, BIG)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("codec", "record"),
    [(TWO_BIT_ALL, TWO_BIT_RECORD), (INT8_ALL, INT8_RECORD), (INT8_BLOCKS, INT8_BLOCK)],
    ids=["topk-2bit", "topk-int8", "int8"],
)
def test_checking_a_large_payload_holds_a_window_not_a_multiple_of_it(
    docs: Any, codec: Any, record: bytes
) -> None:
    """A 24 MiB payload is checked within CHECK_SCRATCH_BYTES (20 MiB): checked whole, the
    2-bit one held ~15 times its size (360 MiB), the int8 topk one ~11 times."""
    count = 24 * MiB // len(record)
    peak = _peak(_doc(docs, codec, record * count, 64 * count))
    assert peak <= CHECK_SCRATCH_BYTES, f"{peak / MiB:.1f} MiB"
    small = _peak(_doc(docs, codec, record * (count // 8), 64 * (count // 8)))
    assert peak <= small + MiB  # past a window, it does not grow with the payload


# TOPK (chunk 8, k 2, int8 values) records of 9 bytes: a window holds CHECK_WINDOW // 9
GOOD = f32(3 / 127) + i8(127, -42) + pack12(1, 6)
FAR = 3 * (CHECK_WINDOW // len(GOOD)) + 17  # a record in the fourth window


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (f32(3 / 127) + i8(127, -42) + pack12(6, 1), "ascending"),
        (f32(3 / 127) + i8(127, -42) + pack12(1, 1), "ascending"),
        (f32(3 / 127) + i8(127, -42) + pack12(1, 8), "outside its chunk"),
        (f32(3 / 127) + i8(126, -42) + pack12(1, 6), "127"),
        (f32(0.0) + i8(127, -42) + pack12(1, 6), "zero scale"),
        (f32(3 / 127) + i8(127, -128) + pack12(1, 6), "-128"),
        (f32(float("inf")) + i8(127, -42) + pack12(1, 6), "scale"),
    ],
)
def test_a_bad_record_past_the_first_window_is_refused_and_named(
    docs: Any, bad: bytes, match: str
) -> None:
    data = GOOD * FAR + bad + GOOD * 5
    buf = comp(docs, TOPK, [docs.tensor(shape=(8 * (FAR + 6),), data=data)])
    for fn in (read_header, decode_any):
        with pytest.raises(InvalidDocumentError, match=match) as info:
            fn(buf)
        assert f"chunk {FAR}:" in str(info.value) and info.value.path == "$.tensors[0].data"


def test_an_int8_block_past_the_first_window_is_named(docs: Any) -> None:
    far = 2 * (CHECK_WINDOW // len(INT8_BLOCK)) + 3
    bad = f32(1 / 127) + i8(126, *range(-63, 0))
    buf = _doc(docs, INT8_BLOCKS, INT8_BLOCK * far + bad + INT8_BLOCK, 64 * (far + 2))
    with pytest.raises(InvalidDocumentError, match=f"block {far}: a non-zero scale"):
        read_header(buf)


@pytest.mark.parametrize("codec", ["bf16", "topk"])
def test_a_nan_past_the_first_window_is_seen(docs: Any, codec: str) -> None:
    """``is_finite`` (what the coordinator refuses a NaN by) also looks window by window."""
    if codec == "bf16":
        spec: Any = {"name": "bf16"}
        good, nan, group = bf(1.5), b"\xc0\x7f", 1
    else:
        spec = {"name": "topk", "chunk": 4, "k": 1, "index": 12, "values": "bf16"}
        good, nan, group = bf(1.5) + pack12(2), b"\xc0\x7f" + pack12(2), 4
    far = 3 * CHECK_WINDOW // len(good) + 5
    for data, finite in ((good * (far + 2), True), (good * far + nan + good, False)):
        g = decode_any(_doc(docs, spec, data, group * (far + 2)))
        assert isinstance(g, CompressedGradient)
        assert g.tensors["w"].is_finite() is finite
        values = g.tensors["w"].read(group * far, group * (far + 1))
        assert bool(np.isfinite(values).all()) is finite
