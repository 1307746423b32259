"""gradstore/2, compressed documents: hand-assembled bytes, every decoder rule, range reads.

Payloads here are written by small packers of the tests' own (not gradstore's encoder),
so a shared mistake cannot hide in both.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from gradstore.errors import InvalidDocumentError, LimitExceededError, MalformedDocumentError
from gradstore.format import (
    Codec,
    CompressedGradient,
    CompressedTensor,
    Gradient,
    Limits,
    decode,
    decode_any,
    encode,
    read_header,
)

INT8 = {"name": "int8", "block": 4}
TOPK = {"name": "topk", "chunk": 8, "k": 2, "index": 12, "values": "int8"}


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def i8(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}b", *values)


def pack12(*positions: int) -> bytes:
    """Positions as 12-bit little-endian fields of one bit string (the test's own packer)."""
    bits = 0
    for j, p in enumerate(positions):
        bits |= p << (12 * j)
    return bits.to_bytes((12 * len(positions) + 7) // 8, "little")


def pack2(*codes: int) -> bytes:
    bits = 0
    for j, c in enumerate(codes):
        bits |= c << (2 * j)
    return bits.to_bytes((2 * len(codes) + 7) // 8, "little")


def bf(value: float) -> bytes:
    """bfloat16 bits of a value that is exactly representable."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    assert bits & 0xFFFF == 0
    return struct.pack("<H", bits >> 16)


def comp(
    docs: Any, codec: Any, tensors: list[Any], meta: Any = None, fmt: str = "gradstore/2"
) -> bytes:
    return docs.build(
        top=[("format", fmt), ("meta", meta or {}), ("codec", codec), ("tensors", tensors)]
    )


# int8, block 4, 6 elements: [0.5, -1, 0, 1] scale 1/127, then [2, -2] scale 2/127
INT8_DATA = f32(1 / 127) + i8(64, -127, 0, 127) + f32(2 / 127) + i8(127, -127)
# topk chunk 8, k 2 (int8 values), 10 elements: chunk 0 keeps positions 1 and 6; the short
# chunk of 2 keeps ceil(2 * 2 / 8) = 1 value, at its position 1
TOPK_DATA = f32(3 / 127) + i8(127, -42) + pack12(1, 6) + f32(0.5 / 127) + i8(-127) + pack12(1)


def int8_doc(docs: Any, data: bytes = INT8_DATA, **kw: Any) -> bytes:
    return comp(docs, kw.pop("codec", INT8), [docs.tensor(shape=(2, 3), data=data, **kw)])


def topk_doc(docs: Any, data: bytes = TOPK_DATA, codec: Any = None) -> bytes:
    return comp(docs, codec or TOPK, [docs.tensor(shape=(10,), data=data)])


def _invalid(buf: bytes, path: str, match: str | None = None) -> InvalidDocumentError:
    for fn in (read_header, decode_any):
        with pytest.raises(InvalidDocumentError, match=match) as info:
            fn(buf)
        assert info.value.path == path, info.value
    return info.value


def test_hand_assembled_documents_decode_to_their_definition(docs: Any) -> None:
    g = decode_any(int8_doc(docs))
    assert isinstance(g, CompressedGradient)
    assert g.codec == Codec("int8", block=4)
    t = g.tensors["w"]
    assert (t.dtype_code, t.shape, t.size) == ("<f4", (2, 3), 6)
    want = [
        np.float64(np.float32(1 / 127)) * 64,
        -np.float64(np.float32(1 / 127)) * 127,
        0.0,
        np.float64(np.float32(1 / 127)) * 127,
        np.float64(np.float32(2 / 127)) * 127,
        -np.float64(np.float32(2 / 127)) * 127,
    ]
    got = t.decompress()
    assert got.dtype == np.float64 and got.shape == (2, 3)
    assert got.reshape(-1).tolist() == want

    g = decode_any(topk_doc(docs))
    assert isinstance(g, CompressedGradient)
    dense = g.tensors["w"].decompress()
    s0, s1 = np.float64(np.float32(3 / 127)), np.float64(np.float32(0.5 / 127))
    expect = np.zeros(10)
    expect[1], expect[6], expect[9] = 127 * s0, -42 * s0, -127 * s1
    assert dense.tolist() == expect.tolist()
    positions, values = g.tensors["w"].sparse(0, 10)
    assert positions.tolist() == [1, 6, 9]
    assert values.tolist() == [127 * s0, -42 * s0, -127 * s1]


def test_two_bit_and_bf16_values_and_16_bit_positions(docs: Any) -> None:
    two = {"name": "topk", "chunk": 8, "k": 3, "index": 16, "values": "2bit"}
    data = f32(0.25, 2.0) + pack2(1, 0, 3) + struct.pack("<3H", 0, 2, 7)
    g = decode_any(comp(docs, two, [docs.tensor(shape=(8,), data=data)]))
    assert isinstance(g, CompressedGradient)
    assert g.tensors["w"].decompress().tolist() == [2.0, 0, 0.25, 0, 0, 0, 0, -2.0]
    bfc = {"name": "topk", "chunk": 4, "k": 2, "index": 12, "values": "bf16"}
    data = bf(1.5) + bf(-3.0) + pack12(0, 3)
    g = decode_any(comp(docs, bfc, [docs.tensor(shape=(4,), data=data)]))
    assert isinstance(g, CompressedGradient)
    assert g.tensors["w"].decompress().tolist() == [1.5, 0, 0, -3.0]


def test_casts_decode_their_values(docs: Any) -> None:
    data = bf(1.0) + bf(-0.0) + bf(2.5)
    g = decode_any(comp(docs, {"name": "bf16"}, [docs.tensor(shape=(3,), data=data)]))
    assert isinstance(g, CompressedGradient)
    out = g.tensors["w"].decompress()
    assert out.tolist() == [1.0, 0.0, 2.5] and np.signbit(out[1])
    data = np.array([65504, -1e-7, 0.1], "<f2").tobytes()
    g = decode_any(comp(docs, {"name": "fp16"}, [docs.tensor(dtype="<f8", shape=(3,), data=data)]))
    assert isinstance(g, CompressedGradient)
    assert (
        g.tensors["w"].decompress().tolist()
        == np.array([65504, -1e-7, 0.1], "<f2").astype(np.float64).tolist()
    )


def test_encode_of_decode_is_the_same_bytes(docs: Any) -> None:
    for doc in (int8_doc(docs), topk_doc(docs)):
        g = decode_any(doc)
        assert encode(g).tobytes() == doc
        assert read_header(doc).format == "gradstore/2"
        assert read_header(doc).codec == g.codec  # type: ignore[union-attr]


def test_decode_refuses_compressed_documents_saying_what_to_call(docs: Any) -> None:
    with pytest.raises(InvalidDocumentError, match="decode_any") as info:
        decode(int8_doc(docs))
    assert info.value.path == "$.format"
    assert isinstance(decode_any(encode(Gradient({"a": np.ones(2)})).tobytes()), Gradient)


def test_the_document_map_and_codec_map_are_exact(docs: Any) -> None:
    t = [docs.tensor(shape=(2, 3), data=INT8_DATA)]
    # gradstore/1 cannot carry a codec, gradstore/2 must
    _invalid(comp(docs, INT8, t, fmt="gradstore/1"), "$")
    _invalid(docs.build(top=[("format", "gradstore/2"), ("meta", {}), ("tensors", t)]), "$.format")
    _invalid(
        docs.build(top=[("format", "gradstore/2"), ("meta", {}), ("tensors", t), ("codec", INT8)]),
        "$",
    )
    _invalid(comp(docs, [1], t), "$.codec")
    _invalid(comp(docs, {"block": 4, "name": "int8"}, t), "$.codec")
    _invalid(comp(docs, {"name": "int4", "block": 4}, t), "$.codec.name", "unknown codec")
    _invalid(comp(docs, {"name": "int8"}, t), "$.codec")
    _invalid(comp(docs, {"name": "int8", "block": 4, "k": 1}, t), "$.codec")
    _invalid(comp(docs, {"name": "int8", "size": 4}, t), "$.codec")
    _invalid(comp(docs, {"name": "int8", "block": 0}, t), "$.codec.block")
    _invalid(comp(docs, {"name": "int8", "block": 65537}, t), "$.codec.block")
    _invalid(comp(docs, {"name": "int8", "block": "4"}, t), "$.codec.block")
    _invalid(comp(docs, {"name": "int8", "block": 4.0}, t), "$.codec.block")
    _invalid(comp(docs, {"name": 8, "block": 4}, t), "$.codec.name")
    _invalid(comp(docs, {"name": "x" * 40, "block": 4}, t), "$.codec.name")


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"k": 0}, "$.codec.k"),
        ({"k": 9}, "$.codec.k"),
        ({"chunk": 0}, "$.codec.chunk"),
        ({"chunk": 5000}, "$.codec.index"),  # 12-bit positions reach 4096
        ({"index": 8}, "$.codec.index"),
        ({"values": "int4"}, "$.codec.values"),
        ({"values": 8}, "$.codec.values"),
    ],
)
def test_topk_parameters_are_checked(docs: Any, change: dict[str, Any], path: str) -> None:
    _invalid(topk_doc(docs, codec={**TOPK, **change}), path)


def test_tensors_must_be_float_and_the_payload_exactly_sized(docs: Any) -> None:
    _invalid(comp(docs, INT8, [docs.tensor(dtype="<i4", shape=(2, 3), data=INT8_DATA)]),
             "$.tensors[0].dtype", "only float")  # fmt: skip
    _invalid(int8_doc(docs, INT8_DATA[:-1]), "$.tensors[0].data", "needs 14")
    _invalid(int8_doc(docs, INT8_DATA + b"\x00"), "$.tensors[0].data")
    _invalid(topk_doc(docs, TOPK_DATA[:-1]), "$.tensors[0].data")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (f32(-1 / 127) + INT8_DATA[4:], "scale"),
        (f32(-0.0) + i8(0, 0, 0, 0) + INT8_DATA[8:], "scale"),
        (f32(float("nan")) + INT8_DATA[4:], "scale"),
        (f32(float("inf")) + INT8_DATA[4:], "scale"),
        (f32(1e-40) + INT8_DATA[4:], "scale"),  # subnormal
        (INT8_DATA[:4] + i8(64, -128, 0, 127) + INT8_DATA[8:], "-128"),
        (f32(0.0) + INT8_DATA[4:], "zero scale"),
        (INT8_DATA[:4] + i8(64, -126, 0, 126) + INT8_DATA[8:], "127"),
    ],
)
def test_int8_payload_rules(docs: Any, data: bytes, match: str) -> None:
    e = _invalid(int8_doc(docs, data), "$.tensors[0].data", match)
    assert "block 0" in str(e)


def test_int8_rules_name_the_block(docs: Any) -> None:
    bad = INT8_DATA[:8] + f32(2 / 127) + i8(126, -120)
    e = _invalid(int8_doc(docs, bad), "$.tensors[0].data")
    assert "block 1" in str(e)
    zeros = INT8_DATA[:8] + f32(0.0) + i8(0, 0)  # an all-zero block has scale +0.0: fine
    g = decode_any(int8_doc(docs, zeros))
    assert isinstance(g, CompressedGradient)
    assert g.tensors["w"].decompress().reshape(-1)[4:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (f32(3 / 127) + i8(127, -42) + pack12(6, 1) + TOPK_DATA[9:], "ascending"),
        (f32(3 / 127) + i8(127, -42) + pack12(1, 1) + TOPK_DATA[9:], "ascending"),
        (f32(3 / 127) + i8(127, -42) + pack12(1, 8) + TOPK_DATA[9:], "outside its chunk"),
        (TOPK_DATA[:9] + f32(0.5 / 127) + i8(-127) + pack12(2), "outside its chunk"),
        (TOPK_DATA[:9] + f32(0.5 / 127) + i8(-127) + b"\x01\x10", "padding"),
        (f32(3 / 127) + i8(126, -42) + TOPK_DATA[6:], "127"),
        (f32(0.0) + i8(127, -42) + TOPK_DATA[6:], "zero scale"),
        (f32(3 / 127) + i8(127, -128) + TOPK_DATA[6:], "-128"),
    ],
)
def test_topk_payload_rules(docs: Any, data: bytes, match: str) -> None:
    _invalid(topk_doc(docs, data), "$.tensors[0].data", match)


@pytest.mark.parametrize(
    ("levels", "codes", "match"),
    [
        ((0.5, 0.25), (1, 0, 3), "lo <= hi"),
        ((-0.0, 2.0), (1, 0, 3), "levels"),
        ((0.25, float("inf")), (1, 0, 3), "levels"),
        ((0.25, 0.25), (1, 0, 3), "level 0"),
        ((0.25, 2.0), (0, 0, 2), "both levels"),
        ((0.0, 2.0), (2, 1, 1), "sign 0"),
        ((0.25, 2.0), (1, 0, 3, 1), "padding"),
    ],
)
def test_two_bit_payload_rules(
    docs: Any, levels: tuple[float, float], codes: tuple[int, ...], match: str
) -> None:
    two = {"name": "topk", "chunk": 8, "k": 3, "index": 16, "values": "2bit"}
    data = f32(*levels) + pack2(*codes) + struct.pack("<3H", 0, 2, 7)
    _invalid(comp(docs, two, [docs.tensor(shape=(8,), data=data)]), "$.tensors[0].data", match)


def test_topk_bf16_zero_is_plus_zero(docs: Any) -> None:
    bfc = {"name": "topk", "chunk": 4, "k": 2, "index": 12, "values": "bf16"}
    data = bf(1.5) + bf(-0.0) + pack12(0, 3)
    _invalid(comp(docs, bfc, [docs.tensor(shape=(4,), data=data)]), "$.tensors[0].data", "-0.0")


def test_a_tiny_document_cannot_stand_for_a_huge_tensor(docs: Any) -> None:
    # 2^28 + 2^16 elements of top-k, one kept per 65536-element chunk: a 20 KB document
    # that stands for just over 1 GiB of float32, over the default limit by its dense size
    codec = {"name": "topk", "chunk": 65536, "k": 1, "index": 16, "values": "bf16"}
    n = (1 << 28) + (1 << 16)
    data = (bf(1.0) + struct.pack("<H", 0)) * (n // 65536)
    doc = comp(docs, codec, [docs.tensor(shape=(n,), data=data)])
    assert len(doc) < 20_000
    for fn in (read_header, decode_any):
        with pytest.raises(LimitExceededError, match="dense bytes"):
            fn(doc)
    # a caller that allows it gets a lazy tensor; nothing dense is allocated by decoding
    g = decode_any(doc, Limits(max_bytes=(1 << 30) + (1 << 18)))
    assert isinstance(g, CompressedGradient)
    assert g.dense_nbytes == 4 * n
    with pytest.raises(LimitExceededError, match="float64"):
        g.decompress()
    assert g.tensors["w"].read(65536, 65538).tolist() == [1.0, 0.0]


def test_compressed_tensor_reads_any_range_like_the_whole() -> None:
    rng = np.random.default_rng(3)
    codec = Codec("topk", chunk=16, k=5, index=12, values="bf16")
    # build a valid payload by hand: keep the 5 first positions of each chunk with value 1.0
    n = 70
    records = []
    for start in range(0, n, 16):
        length = min(16, n - start)
        kept = codec.kept(length)
        records.append(bf(1.0) * kept + pack12(*range(kept)))
    t = CompressedTensor(codec, "<f4", (n,), np.frombuffer(b"".join(records), np.uint8))
    t.check()
    whole = t.decompress()
    for _ in range(200):
        a, b = sorted(rng.integers(0, n + 1, 2))
        assert t.read(int(a), int(b)).tolist() == whole[a:b].tolist()
        pos, vals = t.sparse(int(a), int(b))
        dense = np.zeros(b - a)
        dense[pos] = vals
        assert dense.tolist() == whole[a:b].tolist()


def test_malformed_codec_bytes_are_malformed(docs: Any) -> None:
    doc = int8_doc(docs)
    at = doc.index(b"\xa5block") + 6
    bad = doc[:at] + b"\xcc\x04" + doc[at + 1 :]  # uint8 holding 4: not the smallest form
    with pytest.raises((MalformedDocumentError, InvalidDocumentError)):
        read_header(bad)


def test_check_fits_counts_the_dense_bytes_a_compressed_gradient_stands_for() -> None:
    from gradstore.format import check_fits

    codec = Codec("topk", chunk=16, k=1, index=12, values="bf16")
    n = 64
    payload = np.frombuffer((bf(1.0) + pack12(0)) * (n // 16), np.uint8)
    g = CompressedGradient(codec, {"w": CompressedTensor(codec, "<f8", (n,), payload)})
    size = len(encode(g))
    check_fits(g, size, Limits(max_bytes=8 * n))
    with pytest.raises(LimitExceededError, match="dense bytes"):
        check_fits(g, size, Limits(max_bytes=8 * n - 1))  # the document itself is far smaller
    with pytest.raises(LimitExceededError, match="max_rank"):
        check_fits(g, size, Limits(max_rank=0))
