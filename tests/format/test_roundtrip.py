"""Encode/decode round trips, normalisation, canonical bytes, alignment and zero-copy."""

from __future__ import annotations

import io

import msgpack
import numpy as np
import pytest

import gradstore.format as fmt
from gradstore.format import (
    DTYPES,
    EXTENDED,
    Gradient,
    Limits,
    decode,
    dtype_code,
    encode,
    numpy_dtype,
    read_header,
)

SEED = 20240601


def _random(dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dt = numpy_dtype(dtype)
    assert dt is not None
    if dtype in EXTENDED:  # every bit pattern: NaNs, infinities, -0 and subnormals too
        raw = rng.integers(0, 256, size=(*shape, dt.itemsize), dtype=np.uint8)
        return raw.view(dt).reshape(shape)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)


def test_public_api_is_complete_and_sorted() -> None:
    # ruff (RUF022) keeps __all__ sorted; this checks that it names everything exported.
    assert set(fmt.__all__) == set(fmt._HOMES)
    for name in fmt.__all__:
        assert getattr(fmt, name) is not None, name
    assert fmt.FORMAT_ID == "gradstore/1"


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(dtype: str) -> None:
    rng = np.random.default_rng(SEED)
    g = Gradient({"x": _random(dtype, (3, 5), rng), "s": _random(dtype, (), rng)}, {"k": dtype})
    out = decode(encode(g).tobytes())
    assert out == g
    assert dtype_code(out.tensors["x"].dtype) == dtype
    assert out.tensors["x"].dtype == numpy_dtype(dtype)
    assert out.tensors["x"].tobytes() == g.tensors["x"].tobytes()
    assert out.tensors["s"].shape == ()
    assert out.meta == {"k": dtype}
    if dtype not in EXTENDED:  # NaN != NaN: the extended floats' bytes are compared above
        np.testing.assert_array_equal(out.tensors["x"], g.tensors["x"])


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 4, 2), (1,), (2, 3, 4)])
def test_round_trip_shapes_including_scalars_and_empty(shape: tuple[int, ...]) -> None:
    a = np.arange(int(np.prod(shape)), dtype="<f8").reshape(shape)
    out = decode(encode(Gradient({"t": a})).tobytes())
    assert out.tensors["t"].shape == shape
    np.testing.assert_array_equal(out.tensors["t"], a)


def test_numpy_scalar_is_a_0d_tensor() -> None:
    doc = encode(Gradient({"n": np.float32(2.5)})).tobytes()
    assert doc == encode(Gradient({"n": np.array(2.5, dtype="<f4")})).tobytes()
    assert decode(doc).tensors["n"].shape == ()


def test_big_endian_input_gives_the_little_endian_document() -> None:
    rng = np.random.default_rng(SEED)
    for dtype in ("<f2", "<f4", "<f8", "<i2", "<u4", "<i8"):
        le = _random(dtype, (4, 3), rng)
        be = le.astype(np.dtype(dtype).newbyteorder(">"))
        assert encode(Gradient({"a": be})).tobytes() == encode(Gradient({"a": le})).tobytes()
        assert Gradient({"a": be}) == Gradient({"a": le})


def test_non_contiguous_input_gives_the_contiguous_document() -> None:
    rng = np.random.default_rng(SEED)
    base = rng.standard_normal((6, 8)).astype("<f4")
    for view in (base.T, base[::2, 1::3], np.asfortranarray(base), base[:, ::-1]):
        twin = np.ascontiguousarray(view)
        assert encode(Gradient({"v": view})).tobytes() == encode(Gradient({"v": twin})).tobytes()
        np.testing.assert_array_equal(
            decode(encode(Gradient({"v": view})).tobytes()).tensors["v"], twin
        )


def test_bool_bytes_other_than_0_1_are_written_as_0_1() -> None:
    odd = np.array([0, 1, 2, 255], dtype=np.uint8).view(bool)
    doc = encode(Gradient({"m": odd})).tobytes()
    assert doc == encode(Gradient({"m": np.array([False, True, True, True])})).tobytes()
    assert decode(doc).tensors["m"].tolist() == [False, True, True, True]


def test_equal_gradients_give_identical_bytes_whatever_the_insertion_order() -> None:
    rng = np.random.default_rng(SEED)
    names = ["z", "a", "é", "B", "layer.10", "layer.2", "Ω", "a0"]
    arrays = {n: rng.standard_normal(3).astype("<f4") for n in names}
    meta = {"round": 7, "peer": "did:key:z6Mk", "nested": {"b": 1, "a": [1.5, None]}, "kind": "g"}
    first = encode(Gradient(arrays, meta)).tobytes()
    for trial in range(5):
        order = np.random.default_rng(SEED + trial).permutation(len(names))
        shuffled = {names[i]: arrays[names[i]] for i in order}
        meta2 = dict(reversed(list(meta.items())))
        assert encode(Gradient(shuffled, meta2)).tobytes() == first
    decoded_names = [t.name for t in read_header(first).tensors]
    assert decoded_names == sorted(names, key=lambda s: s.encode())


def test_every_data_field_starts_at_a_multiple_of_64() -> None:
    rng = np.random.default_rng(SEED)
    tensors = {}
    for i in range(40):  # names and shapes of varied lengths move every header around
        shape = tuple(int(d) for d in rng.integers(0, 5, size=int(rng.integers(0, 4))))
        tensors["t" * int(rng.integers(1, 40)) + str(i)] = _random(DTYPES[i % 12], shape, rng)
    tensors["big"] = np.zeros(70_000, dtype="|u1")  # a bin32 data header
    tensors["mid"] = np.zeros(300, dtype="|u1")  # a bin16 data header
    doc = encode(Gradient(tensors, {"m": "x" * 100}))
    raw = doc.tobytes()
    header = read_header(raw)
    assert len(header.tensors) == len(tensors)
    for t in header.tensors:
        assert t.offset % 64 == 0
        np.testing.assert_array_equal(
            np.frombuffer(raw, t.dtype, t.nbytes // np.dtype(t.dtype).itemsize, t.offset),
            np.asarray(tensors[t.name]).reshape(-1),
        )
    assert decode(raw) == Gradient(tensors, {"m": "x" * 100})


def test_document_is_what_msgpack_itself_writes() -> None:
    # Re-packing the generic msgpack reading of our bytes must give the same bytes:
    # every int, str, bin, array and map is in msgpack's smallest form.
    rng = np.random.default_rng(SEED)
    g = Gradient(
        {f"p{i}": rng.standard_normal((i, 3)).astype("<f4") for i in range(20)},
        {"int": [0, 127, 128, 255, 256, 65536, 2**32, 2**64 - 1, -1, -32, -33, -129, -(2**63)],
         "s": ["", "x" * 31, "x" * 32, "x" * 256, "x" * 70_000], "b": [b"", b"y" * 300],
         "f": [0.0, -0.0, 1e300], "n": None, "t": True, "list16": list(range(16)),
         "map16": {str(i): i for i in range(16)}},
    )  # fmt: skip
    raw = encode(g).tobytes()
    assert msgpack.packb(msgpack.unpackb(raw, raw=False), use_bin_type=True) == raw
    assert decode(raw, Limits(max_meta_bytes=1 << 20)) == g


def test_streamed_pieces_are_memoryviews_sharing_the_arrays() -> None:
    a = np.arange(1000, dtype="<f8")
    b = np.arange(10, dtype="|i1")
    doc = encode(Gradient({"a": a, "b": b}))
    pieces = list(doc)
    assert all(isinstance(p, memoryview) and p.format == "B" for p in pieces)
    assert sum(p.nbytes for p in pieces) == doc.size == len(doc.tobytes())
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), a) for p in pieces)
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), b) for p in pieces)
    assert b"".join(doc) == b"".join(doc)  # iterable more than once


def test_write_to_writes_the_document() -> None:
    g = Gradient({"a": np.arange(100, dtype="<u2")}, {"round": 1})
    doc = encode(g)
    f = io.BytesIO()
    assert doc.write_to(f) == doc.size
    assert f.getvalue() == doc.tobytes()


class _Trickle(io.RawIOBase):
    """A raw file that accepts at most 7 bytes per write, like a slow pipe."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: object) -> int:
        chunk = bytes(memoryview(b)[:7])  # type: ignore[arg-type]
        self.buf += chunk
        return len(chunk)


def test_write_to_finishes_short_writes() -> None:
    doc = encode(Gradient({"a": np.arange(50, dtype="<f4")}))
    f = _Trickle()
    doc.write_to(f)
    assert bytes(f.buf) == doc.tobytes()


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "ndarray"])
def test_decode_is_zero_copy(kind: str) -> None:
    rng = np.random.default_rng(SEED)
    g = Gradient({"w": rng.standard_normal((256, 256)).astype("<f4"), "b": np.ones(3, "|b1")})
    raw = encode(g).tobytes()
    buf = {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "ndarray": np.frombuffer(raw, np.uint8).copy(),
    }[kind]
    out = decode(buf)
    assert out == g
    backing = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, np.uint8)
    for arr in out.tensors.values():
        assert np.shares_memory(arr, backing)
    # read-only buffers give read-only arrays; writable ones stay writable
    assert out.tensors["w"].flags.writeable == (kind in ("bytearray", "ndarray"))


def test_decode_accepts_a_document_inside_a_larger_aligned_buffer() -> None:
    raw = encode(Gradient({"w": np.arange(5, dtype="<i4")})).tobytes()
    store = np.zeros(len(raw) + 64, np.uint8)
    store[64:] = np.frombuffer(raw, np.uint8)
    out = decode(store[64:])
    assert out.tensors["w"].tolist() == [0, 1, 2, 3, 4]


def test_decode_refuses_non_buffers_and_strided_arrays() -> None:
    raw = encode(Gradient({"w": np.arange(5, dtype="<i4")})).tobytes()
    with pytest.raises(TypeError):
        decode(raw.hex())
    with pytest.raises(TypeError):
        decode(np.frombuffer(raw * 2, np.uint8)[::2])


def test_read_header_describes_the_tensors() -> None:
    g = Gradient({"w": np.zeros((2, 3), "<f8"), "b": np.zeros(4, "<f4")}, {"round": 3})
    raw = encode(g).tobytes()
    h = read_header(raw)
    assert h.size == len(raw)
    assert h.meta == {"round": 3}
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in h.tensors] == [
        ("b", "<f4", (4,), 16),
        ("w", "<f8", (2, 3), 48),
    ]


def test_gradient_equality_repr_and_nbytes() -> None:
    a = Gradient({"w": np.array([1.0, 2.0], "<f4")}, {"r": 1})
    assert a == Gradient({"w": np.array([1.0, 2.0], ">f4")}, {"r": 1})
    assert a != Gradient({"w": np.array([1.0, 2.0], "<f8")}, {"r": 1})  # dtype
    assert a != Gradient({"w": np.array([[1.0, 2.0]], "<f4")}, {"r": 1})  # shape
    assert a != Gradient({"w": np.array([1.0, 3.0], "<f4")}, {"r": 1})  # bytes
    assert a != Gradient({"w": np.array([1.0, 2.0], "<f4")}, {"r": 1.0})  # 1 and 1.0 encode apart
    assert a != Gradient({"v": np.array([1.0, 2.0], "<f4")}, {"r": 1})  # name
    assert Gradient({"z": np.array([0.0])}) != Gradient({"z": np.array([-0.0])})
    nan = np.array([np.nan], "<f8")
    assert Gradient({"n": nan}) == Gradient({"n": nan.copy()})  # same bytes, same document
    assert a.nbytes == 8
    text = repr(Gradient({"w": np.zeros((3, 4), "<f4"), "s": np.float64(1)}, {"round": 2}))
    assert "'w': <f4[3x4]" in text and "'s': <f8[scalar]" in text and "round" in text
    assert "0." not in text  # no data in the repr
    with pytest.raises(TypeError):
        hash(a)
