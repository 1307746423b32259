"""Every codec: its stated error bound, its selection and rounding rules, canonical bytes.

The bounds are docs/spec.md's (section 2.4); each test computes them from the
input with plain NumPy/Python, independently of the encoder.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gradstore.compress import compress, compress_array, parse_spec
from gradstore.errors import CompressionError
from gradstore.format import Codec, CompressedGradient, Gradient, decode_any, encode

Array = np.ndarray[Any, Any]
SETTINGS = settings(
    max_examples=300, derandomize=True, database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


@st.composite
def arrays(draw: Any, max_size: int = 300) -> Array:
    """float32/float64 arrays: normal draws, heavy ties, zeros, tiny and subnormal values."""
    size = draw(st.integers(0, max_size))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    kind = draw(st.sampled_from(["normal", "ties", "zeros", "tiny", "wide", "floats"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "normal":
        x = rng.standard_normal(size)
    elif kind == "ties":
        x = rng.integers(-3, 4, size).astype(np.float64) / 4
    elif kind == "zeros":
        x = np.zeros(size)
        x[rng.random(size) < 0.1] = -0.0
    elif kind == "tiny":
        x = rng.standard_normal(size) * 1e-38
    elif kind == "wide":
        x = rng.standard_normal(size) * 10.0 ** rng.integers(-30, 30, size)
    else:
        x = np.array(
            draw(st.lists(st.floats(-1e4, 1e4, width=32), min_size=size, max_size=size)),
            np.float64,
        )
    return x.astype(dtype)


def _codecs() -> Any:
    group = st.integers(1, 40)
    return st.one_of(
        st.just(Codec("bf16")),
        st.just(Codec("fp16")),
        st.builds(lambda b: Codec("int8", block=b), group),
        st.builds(
            lambda c, k, idx, v: Codec("topk", chunk=c, k=1 + k % c, index=idx, values=v),
            group,
            st.integers(0, 39),
            st.sampled_from([12, 16]),
            st.sampled_from(["bf16", "int8", "2bit"]),
        ),
    )


def check_bound(codec: Codec, x: Array, out: Array) -> None:
    """Assert the design's per-element bound of ``codec`` between ``x`` and ``out``."""
    x = x.astype(np.float64)
    err = np.abs(out - x)
    if codec.name == "bf16":
        assert (err <= np.maximum(2.0**-8 * np.abs(x), 2.0**-134)).all()
    elif codec.name == "fp16":
        assert (err <= np.maximum(2.0**-11 * np.abs(x), 2.0**-25)).all()
    elif codec.name == "int8":
        for lo in range(0, x.size, codec.group):
            block, e = x[lo : lo + codec.group], err[lo : lo + codec.group]
            m = float(np.abs(block).max())
            assert (e <= m / 254 * (1 + 2.0**-23)).all() or (
                (out[lo : lo + codec.group] == 0).all() and (e <= m).all()
            )
    else:
        for lo in range(0, x.size, codec.group):
            chunk, got = x[lo : lo + codec.group], out[lo : lo + codec.group]
            kept = _largest(chunk, codec.kept(chunk.size))
            dropped = np.setdiff1d(np.arange(chunk.size), kept)
            assert (got[dropped] == 0).all() and not (np.signbit(got) & (got == 0)).any()
            mags = np.abs(chunk[kept])
            if dropped.size:
                assert np.abs(chunk[dropped]).max() <= mags.min()
            e = np.abs(got[kept] - chunk[kept])
            if codec.values == "bf16":
                assert (e <= np.maximum(2.0**-8 * mags, 2.0**-134)).all()
            elif codec.values == "int8":
                m = float(mags.max())
                assert (e <= m / 254 * (1 + 2.0**-23)).all() or ((e <= m).all() and m < 1e-36)
            else:
                a, b = float(mags.min()), float(mags.max())
                # lo and hi are rounded to float32: relatively above its normal range, by
                # half its subnormal step (2^-150) below it (b = 1.257e-39 in float64 found it)
                assert (e <= (b - a) / 2 + max(2.0**-24 * b, 2.0**-150)).all()


def _largest(chunk: Array, kept: int) -> Array:
    """Positions of the ``kept`` largest magnitudes, ties to the lower position (by sorting)."""
    order = sorted(range(chunk.size), key=lambda i: (-abs(float(chunk[i])), i))
    return np.array(sorted(order[:kept]), np.int64)


@SETTINGS
@given(arrays(), _codecs())
def test_round_trip_within_the_stated_bound(x: Array, codec: Codec) -> None:
    assume(codec.name != "fp16" or x.size == 0 or np.abs(x).max() < 65504)
    t = compress_array(x, codec, "x")
    t.check()
    out = t.decompress()
    assert out.dtype == np.float64 and out.shape == x.shape
    check_bound(codec, x, out)
    if codec.sparse:  # the kept positions are exactly the largest magnitudes
        pos, _ = t.sparse(0, x.size)
        want = [lo + p for lo in range(0, x.size, codec.group)
                for p in _largest(x[lo : lo + codec.group], codec.kept(min(codec.group, x.size - lo)))]  # fmt: skip
        assert pos.tolist() == want


@SETTINGS
@given(arrays(max_size=120), _codecs())
def test_canonical_bytes(x: Array, codec: Codec) -> None:
    assume(codec.name != "fp16" or x.size == 0 or np.abs(x).max() < 65504)
    g = Gradient({"x": x.reshape(-1, 1) if x.size % 2 else x, "y": x[::-1].copy()}, {"r": 1})
    doc = encode(compress(g, codec)).tobytes()
    assert encode(compress(g, codec)).tobytes() == doc  # the same input: the same bytes
    again = decode_any(doc)
    assert isinstance(again, CompressedGradient)
    assert encode(again).tobytes() == doc  # encode(decode(x)) == x
    # the byte order of the input does not matter, only its values
    swapped = {n: a.astype(a.dtype.newbyteorder(">")) for n, a in g.tensors.items()}
    assert encode(compress(Gradient(swapped, {"r": 1}), codec)).tobytes() == doc


def test_bf16_rounds_once_from_float64() -> None:
    # through float32 this would round twice and give 1.0
    x = np.array([1 + 2**-8 + 2**-30, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-30)])
    out = compress_array(x, Codec("bf16"), "x").decompress()
    assert out.tolist() == [1 + 2**-7, 1.0, 1 + 2**-6, -(1 + 2**-7)]
    # float32 input: the same values as ml_dtypes' own cast (which is exact from float32)
    y = np.random.default_rng(1).standard_normal(10_000).astype(np.float32)
    want = y.astype(ml_dtypes.bfloat16).astype(np.float64)
    assert compress_array(y, Codec("bf16"), "y").decompress().tobytes() == want.tobytes()


def test_fp16_matches_numpys_correct_cast_and_keeps_minus_zero() -> None:
    y = np.random.default_rng(2).standard_normal(10_000) * 100
    y[0] = -0.0
    out = compress_array(y, Codec("fp16"), "y").decompress()
    assert out.tobytes() == y.astype(np.float16).astype(np.float64).tobytes()
    assert np.signbit(out[0])


def test_int8_quantizes_by_the_definition() -> None:
    x = np.array([127.0, -63.5, 0.5, 1.5, 2.5, -0.0, 0.0, 126.5], np.float32)
    t = compress_array(x, Codec("int8", block=8), "x")
    q = t.payload[4:].view(np.int8)
    assert t.payload[:4].view("<f4")[0] == 1.0
    assert q.tolist() == [127, -64, 0, 2, 2, 0, 0, 126]  # ties to even
    tiny = compress_array(np.array([1e-37, -1e-37], np.float32), Codec("int8", block=2), "t")
    assert tiny.payload.tolist() == [0] * 6  # a scale below float32's normals: zeros


def test_topk_keeps_the_largest_and_ties_go_to_the_lower_position() -> None:
    x = np.array([1, -3, 3, 2, -3, 0, 0, 3], np.float64)
    t = compress_array(x, Codec("topk", chunk=8, k=3, index=12, values="bf16"), "x")
    assert t.sparse(0, 8)[0].tolist() == [1, 2, 4]
    zeros = compress_array(np.zeros(8), Codec("topk", chunk=8, k=2, index=12, values="bf16"), "z")
    assert zeros.sparse(0, 8)[0].tolist() == [0, 1]
    assert not np.signbit(zeros.decompress()).any()
    negzero = compress_array(
        -np.zeros(8), Codec("topk", chunk=8, k=2, index=12, values="bf16"), "z"
    )
    assert not np.signbit(negzero.decompress()).any()  # kept zeros are written +0.0
    # a short last chunk keeps ceil(k * length / chunk)
    t = compress_array(
        np.arange(1.0, 11.0), Codec("topk", chunk=8, k=3, index=12, values="bf16"), "x"
    )
    assert t.sparse(0, 10)[0].tolist() == [5, 6, 7, 9]


def test_two_bit_levels_follow_the_definition() -> None:
    v = np.array([1.0, -2.0, 8.0, -9.0])
    t = compress_array(v, Codec("topk", chunk=4, k=4, index=16, values="2bit"), "v")
    lo, hi = t.payload[:8].view("<f4").tolist()
    assert (lo, hi) == (1.5, 8.5)  # mid = 5: {1, 2} and {8, 9}
    assert t.decompress().tolist() == [1.5, -1.5, 8.5, -8.5]
    same = compress_array(
        np.array([3.0, -3.0]), Codec("topk", chunk=2, k=2, index=12, values="2bit"), "s"
    )
    assert same.payload[:8].view("<f4").tolist() == [3.0, 3.0]
    assert same.decompress().tolist() == [3.0, -3.0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn"])
def test_narrow_inputs_stand_for_their_own_dtype(dtype: str) -> None:
    dt = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
    x = np.random.default_rng(4).standard_normal(64).astype(dt)
    for spec in ("bf16", "int8", "topk:0.25"):
        t = compress(Gradient({"x": x}), spec).tensors["x"]
        assert t.dtype == dt
        check_bound(parse_spec(spec), x.astype(np.float64), t.decompress())


def test_what_cannot_be_compressed_is_refused_by_name() -> None:
    with pytest.raises(CompressionError, match=r"'i'.*only float"):
        compress({"i": np.arange(3)}, "int8")
    with pytest.raises(CompressionError, match=r"'n'.*NaN"):
        compress({"n": np.array([1.0, np.nan])}, "topk:0.5")
    with pytest.raises(CompressionError, match=r"'n'.*NaN"):
        compress({"n": np.array([np.inf], np.float32)}, "bf16")
    with pytest.raises(CompressionError, match=r"'f'.*float16's range"):
        compress({"f": np.array([70000.0])}, "fp16")
    with pytest.raises(CompressionError, match=r"'b'.*bfloat16's range"):
        compress({"b": np.array([1e39])}, "bf16")
    with pytest.raises(CompressionError, match=r"'b'.*bfloat16's range"):
        compress({"b": np.array([3.4e38], np.float32)}, "bf16")
    with pytest.raises(CompressionError, match=r"'s'.*int8 scale"):
        compress({"s": np.array([1e300, 1.0])}, "int8")
    with pytest.raises(CompressionError, match="not a NumPy array"):
        compress({"l": [1.0, 2.0]}, "int8")  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("spec", "codec"),
    [
        ("bf16", Codec("bf16")),
        (" FP16 ", Codec("fp16")),
        ("int8", Codec("int8", block=4096)),
        ("int8:256", Codec("int8", block=256)),
        ("int8:block=256", Codec("int8", block=256)),
        ("topk:0.015", Codec("topk", chunk=4096, k=61, index=12, values="bf16")),
        ("topk:0.015,values=int8", Codec("topk", chunk=4096, k=61, index=12, values="int8")),
        ("topk:k=64,values=2bit", Codec("topk", chunk=4096, k=64, index=12, values="2bit")),
        ("topk:0.01,chunk=8192", Codec("topk", chunk=8192, k=82, index=16, values="bf16")),
        ("topk:0.5,chunk=4,index=16", Codec("topk", chunk=4, k=2, index=16, values="bf16")),
        ("topk:1e-9", Codec("topk", chunk=4096, k=1, index=12, values="bf16")),
    ],
)
def test_specs(spec: str, codec: Codec) -> None:
    assert parse_spec(spec) == codec
    assert parse_spec(str(codec)) == codec  # a codec's text is a spec of itself


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "non-empty"),
        ("zstd", "unknown codec"),
        ("bf16:3", "no argument"),
        ("int8:0", "block"),
        ("int8:x", "whole number"),
        ("int8:4,block=4", "twice"),
        ("topk", "needs a ratio"),
        ("topk:0", "ratio"),
        ("topk:1.5", "ratio"),
        ("topk:nan", "ratio"),
        ("topk:abc", "not a number"),
        ("topk:0.1,k=3", "not both"),
        ("topk:0.1,values=int4", "values"),
        ("topk:0.1,index=12,chunk=8192", "16-bit"),
        ("topk:0.1,foo=1", "no option"),
        ("topk:0.1,values", "KEY=VALUE"),
        ("topk:0.1,values=int8,values=bf16", "twice"),
    ],
)
def test_bad_specs_are_refused(spec: str, match: str) -> None:
    with pytest.raises(CompressionError, match=match):
        parse_spec(spec)


def test_a_ratio_keeps_at_least_one() -> None:
    assert parse_spec("topk:0.0001,chunk=16").k == 1
    assert math.isclose(parse_spec("topk:0.015").k / 4096, 0.015, rel_tol=0.01)


EDGES = {  # each dtype's largest value, and values just below the points where codecs round up
    "<f2": [65504.0, 65408.0, 65407.0, 65280.0],
    "<f4": [float(np.finfo(np.float32).max), float(np.finfo(np.float32).max) * (1 - 2**-20)],
    "bfloat16": [float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)],
    "float8_e4m3fn": [448.0, 416.0],
    "float8_e5m2": [57344.0, 49152.0],
}


@pytest.mark.parametrize("code", list(EDGES))
@pytest.mark.parametrize(
    "spec", ["bf16", "fp16", "int8", "int8:4", "topk:0.5", "topk:0.5,values=int8",
             "topk:0.5,values=2bit"],
)  # fmt: skip
def test_what_compress_accepts_decompresses_within_its_dtype(spec: str, code: str) -> None:
    """The promise `get` relies on: a compressed tensor comes back, rounded once to its
    declared dtype, without an infinity (or NaN) that was never stored; else compress refuses."""
    from gradstore.aggregate._rounding import round_into
    from gradstore.format import numpy_dtype

    dt = numpy_dtype(code)
    assert dt is not None
    for edge in EDGES[code]:
        x = np.array([edge, -edge / 3, edge / 7, 1.0, -edge], dt)
        try:
            t = compress({"x": x}, spec).tensors["x"]
        except CompressionError as exc:
            assert "'x'" in str(exc)
            continue
        out = np.empty(x.shape, dt)
        with np.errstate(over="ignore"):
            round_into(out, t.decompress())
        assert np.isfinite(out.astype(np.float64)).all(), (spec, code, edge, out)


def test_the_two_codecs_that_round_past_a_dtype_refuse_only_there() -> None:
    f16 = np.array([65504.0, 1.0], np.float16)
    with pytest.raises(CompressionError, match=r"'h'.*65536, beyond float16's largest"):
        compress({"h": f16}, "bf16")
    with pytest.raises(CompressionError, match=r"'h'.*65536"):
        compress({"h": f16}, "topk:0.5")
    back = compress({"h": f16}, "int8").tensors["h"].decompress()  # 65504 * (1 + 2^-25)
    assert back.astype(np.float16)[0] == 65504.0  # rounds back to float16's largest, not inf
    ok = compress({"h": np.array([65280.0], np.float16)}, "bf16").tensors["h"]
    assert ok.decompress().tolist() == [65280.0]  # just below the tie: kept
    f32 = np.array([np.finfo(np.float32).max, 1.0], np.float32)
    for spec in ("int8", "topk:0.5,values=int8", "topk:0.5,values=2bit"):
        with pytest.raises(CompressionError, match=r"'m'.*float32's largest"):
            compress({"m": f32}, spec)


def test_2bit_values_in_float32s_subnormal_range_stay_within_the_stated_bound() -> None:
    # float64 1.2573e-39 is subnormal in float32: its level rounds by 2^-150 absolute, not 2^-24
    x = np.array([1.25730221e-39])
    codec = parse_spec("topk:1,values=2bit")
    check_bound(codec, x, compress_array(x, codec, "x").decompress())
