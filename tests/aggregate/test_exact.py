"""accumulate = "exact": each element's terms summed exactly and rounded once, so the bits
do not depend on the inputs' order or on how partial sums group them (issue 22's tree).

The reference is Python's exact rational arithmetic: ``Fraction`` sums the binary64 terms
exactly and ``float(Fraction)`` (an integer division) rounds once, to nearest with ties to
even; ``math.fsum`` must agree wherever it does not overflow on the way.
"""

from __future__ import annotations

import asyncio
import importlib
import math
import random
import struct
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradstore.aggregate import (
    MAX_PARTIAL_COMPONENTS,
    AggregationParams,
    InMemory,
    Layout,
    _exact_kernel,
    _fused,
    aggregate,
    aggregate_partials,
    aggregate_streamed,
    aggregate_with_info,
    combine_exact,
    exact_combine,
    exact_partial,
    exact_partial_streamed,
    global_norm,
    linear_terms,
    splittable,
)
from gradstore.aggregate._checks import NonFiniteResult
from gradstore.aggregate._clip import clip_scale
from gradstore.aggregate._rounding import round_into
from gradstore.errors import AggregationError, PartialSumError

MAX = np.finfo(np.float64).max
TINY = 5e-324  # 2**-1074, the smallest subnormal
HALF_ULP_OF_MAX = 2.0**970


def reference(terms: Sequence[float]) -> float:
    """The exact sum of the binary64 ``terms``, rounded once (inf beyond the range)."""
    exact = sum((Fraction(t) for t in terms), Fraction(0))
    if exact == 0:
        return -0.0 if all(math.copysign(1.0, t) < 0 for t in terms) else 0.0
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


def bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def column(values: Sequence[float]) -> list[dict[str, np.ndarray[Any, Any]]]:
    """One input per value, each a float64 tensor of one element."""
    return [{"g": np.array([v], np.float64)} for v in values]


def layout_of(size: int, dtype: Any = np.float64) -> Layout:
    return Layout.of([("g", np.dtype(dtype), (size,))])


def exact_sum(values: Sequence[float]) -> float:
    """combine_exact over one-element inputs, no coefficients, no division."""
    try:
        out = combine_exact(column(values), layout_of(1), None, None, 1)
    except NonFiniteResult:
        return math.inf
    return float(out["g"][0])


ADVERSARIAL: list[list[float]] = [
    [1e300, 1.0, -1e300],  # cancellation: 1, where the float64 loop gives 0
    [1.0, 1e300, -1e300, 1e-300],
    [2.0**53, 1.0],  # a tie: to even, 2**53
    [2.0**53, 1.0, TINY],  # the sticky bit breaks it: up
    [2.0**53 + 2, 1.0],  # a tie: to even, 2**53 + 4
    [1.0, 2.0**-53],  # a tie below 1: stays 1
    [1.0, 2.0**-53, 2.0**-1000],  # sticky far below: up
    [-1.0, -(2.0**-53), -(2.0**-1000)],  # the same, negative
    [1.0, -(2.0**-54), -TINY],  # just below half an ulp under 1 (ulp 2**-53 there)
    [TINY, TINY],  # subnormals
    [2.0**-1022, -TINY],  # the largest subnormal
    [2.0**-1022, -(2.0**-1023)],
    [-TINY, TINY, -TINY],
    [MAX, MAX, -MAX],  # no overflow on the way (fsum raises here)
    [MAX, -MAX, MAX],
    [MAX, HALF_ULP_OF_MAX],  # a tie at the top: MAX is odd, so it rounds to 2**1024: inf
    [MAX, HALF_ULP_OF_MAX, -TINY],  # just below the tie: MAX
    [-MAX, -MAX],  # overflow: -inf
    [-0.0, -0.0],  # -0.0 only when every term is -0.0
    [-0.0],
    [-0.0, 0.0],
    [1.0, -1.0],
    [-1.0, 1.0],
    [0.1] * 10,
    [1e16, 1.0, -1e16, 1.0, 1e-16],
    [3.0 * 2.0**1000, -(2.0**-1074), 2.0**-1074 * 7],
    [float.fromhex("0x1.fffffffffffffp+1023") / 3, float.fromhex("0x1p-1074") * 3],
]


@pytest.mark.parametrize("values", ADVERSARIAL, ids=lambda v: ",".join(map(repr, v))[:40])
def test_exact_sum_matches_the_rational_reference(values: list[float]) -> None:
    want = reference(values)
    got = exact_sum(values)
    if math.isinf(want):
        assert math.isinf(got)
        return
    assert bits(got) == bits(want), (values, got, want)
    try:
        fsum = math.fsum(values)
    except OverflowError:  # intermediate overflow: fsum gives up where the exact sum does not
        return
    assert got == fsum


def _random_value(rng: random.Random) -> float:
    """A binary64 anywhere in the range: a random mantissa at a random exponent."""
    kind = rng.random()
    if kind < 0.05:
        return rng.choice([0.0, -0.0])
    mantissa = rng.getrandbits(53) | (1 << 52) if kind > 0.1 else rng.getrandbits(52)
    exponent = rng.randint(-1074, 971 - 40)
    value = math.ldexp(mantissa, exponent)
    return -value if rng.random() < 0.5 else value


def test_random_columns_match_the_reference_element_by_element() -> None:
    rng = random.Random(20261206)
    n, size = 9, 3000
    columns = [[_random_value(rng) for _ in range(n)] for _ in range(size)]
    # a few columns with a narrow spread, where carries and cancellations are common
    for e in range(0, size, 7):
        base = rng.randint(-1070, 900)
        columns[e] = [math.ldexp(rng.uniform(-1, 1), base + rng.randint(0, 60)) for _ in range(n)]
    inputs = [{"g": np.array([c[i] for c in columns], np.float64)} for i in range(n)]
    out = combine_exact(inputs, layout_of(size), None, None, 2)["g"]
    want = np.array([reference(c) for c in columns], np.float64)
    assert out.tobytes() == want.tobytes()


def test_coefficients_and_divisor_round_as_the_spec_says() -> None:
    rng = np.random.default_rng(5)
    n, size = 6, 4097
    inputs = [{"g": rng.standard_normal(size).astype(np.float32)} for _ in range(n)]
    coefs = [float(c) for c in rng.integers(1, 10**6, n)]
    divisor = float(sum(coefs))
    out = combine_exact(inputs, layout_of(size, np.float32), coefs, divisor, 1)["g"]
    for e in range(0, size, 97):
        terms = [float(np.float64(x["g"][e]) * c) for x, c in zip(inputs, coefs, strict=True)]
        want = np.float32(np.float64(reference(terms)) / divisor)
        assert out[e].tobytes() == want.tobytes(), e


def groupings(n: int, rng: random.Random) -> Iterator[list[list[int]]]:
    """A few ways of cutting a shuffled ``range(n)`` into groups."""
    for _ in range(4):
        order = list(range(n))
        rng.shuffle(order)
        cuts = sorted(rng.sample(range(1, n), rng.randint(0, n - 1))) if n > 1 else []
        yield [order[a:b] for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    yield [[i] for i in range(n)]  # every input its own leaf


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=150, deadline=None)
@given(
    columns=st.lists(st.lists(finite, min_size=1, max_size=12), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_order_and_grouping_gives_the_same_bits(
    columns: list[list[float]], seed: int
) -> None:
    n = max(len(c) for c in columns)
    padded = [c + [-0.0] * (n - len(c)) for c in columns]  # -0.0 adds nothing, keeps the sign
    inputs = [{"g": np.array([c[i] for c in padded], np.float64)} for i in range(n)]
    layout = layout_of(len(padded))
    want = np.array([reference(c) for c in padded])
    overflow = not np.isfinite(want).all()
    try:
        flat = combine_exact(inputs, layout, None, None, 1)["g"]
    except NonFiniteResult:
        assert overflow
        return
    assert flat.tobytes() == want.tobytes()
    rng = random.Random(seed)
    for groups in groupings(n, rng):
        try:
            partials = [exact_partial([inputs[i] for i in group], layout, None) for group in groups]
        except AggregationError:  # a group's own sum beyond binary64's range
            continue
        for p in partials:
            assert 1 <= p["g"].shape[0] <= MAX_PARTIAL_COMPONENTS
        rng.shuffle(partials)
        got = exact_combine(partials, layout, None)["g"]
        assert got.tobytes() == flat.tobytes(), groups


def test_a_partial_is_the_canonical_expansion() -> None:
    values = [1e300, 1.0, 1e-300, -(2.0**-1074)]
    partial = exact_partial(column(values), layout_of(1), None)["g"][:, 0]
    exact = sum((Fraction(v) for v in values), Fraction(0))
    assert sum((Fraction(float(c)) for c in partial), Fraction(0)) == exact
    assert [float(c) for c in partial] == [1e300, 1.0, 1e-300, -(2.0**-1074)]
    # each component is the rest rounded once: no two overlap
    rest = exact
    for c in partial:
        assert float(c) == float(rest)
        rest -= Fraction(float(c))


def test_negative_zero_survives_partials() -> None:
    negzero = {"g": np.array([-0.0, -0.0, 1.0, -0.0], np.float64)}
    other = {"g": np.array([-0.0, 0.0, -1.0, -0.0], np.float64)}
    wide = {"g": np.array([-0.0, -0.0, 1e-300, -0.0], np.float64)}
    layout = layout_of(4)
    p1 = exact_partial([negzero], layout, None)
    p2 = exact_partial([other, wide], layout, None)  # -1 + 1e-300 needs two components
    assert p2["g"].shape[0] == 2 and [bits(v) for v in p2["g"][:, 3]] == [bits(-0.0)] * 2
    got = exact_combine([p1, p2], layout, None)["g"]
    flat = combine_exact([negzero, other, wide], layout, None, None, 1)["g"]
    assert got.tobytes() == flat.tobytes()
    assert [bits(v) for v in got] == [bits(-0.0), bits(0.0), bits(1e-300), bits(-0.0)]
    # a partial with two components pads the other elements' rows with their zero's sign
    deep = exact_partial([{"g": np.array([1.0, -0.0])}, {"g": np.array([1e-200, -0.0])}],
                         layout_of(2), None)["g"]  # fmt: skip
    assert deep.shape == (2, 2) and [bits(v) for v in deep[:, 1]] == [bits(-0.0)] * 2


def test_hostile_partials_are_refused_before_any_arithmetic() -> None:
    layout = layout_of(3)
    good = {"g": np.zeros((1, 3))}
    cases: list[tuple[Any, str]] = [
        ({"g": np.zeros((MAX_PARTIAL_COMPONENTS + 1, 3))}, "components"),
        ({"g": np.zeros((0, 3))}, "components"),
        ({"g": np.array([[0.0, np.nan, 0.0]])}, "NaN or infinity"),
        ({"g": np.array([[0.0, np.inf, 0.0]])}, "NaN or infinity"),
        ({"g": np.zeros((1, 4))}, "shape"),
        ({"g": np.zeros(3)}, "shape"),
        ({"g": np.zeros((1, 3), np.float32)}, "float64"),
        ({"g": [[0.0, 0.0, 0.0]]}, "float64"),
        ({"g": good["g"], "h": good["g"]}, "tensors"),
        ({}, "tensors"),
    ]
    for partial, message in cases:
        with pytest.raises(PartialSumError, match=message) as caught:
            exact_combine([good, partial], layout, None)
        assert caught.value.index == 1
    with pytest.raises(AggregationError, match="no partial"):
        exact_combine([], layout, None)


def test_non_canonical_partials_still_sum_exactly() -> None:
    # overlapping components (a careless or hostile leaf): the root sums what it is given
    layout = layout_of(1)
    partial = {"g": np.array([[1.0], [1.0], [2.0**-60], [-(2.0**-60)], [3.0]])}
    assert exact_combine([partial], layout, None)["g"][0] == 5.0
    big = {"g": np.full((MAX_PARTIAL_COMPONENTS, 1), MAX)}
    with pytest.raises(AggregationError, match="overflows"):
        exact_combine([big], layout, None)


def test_a_partial_beyond_binary64_is_refused() -> None:
    with pytest.raises(AggregationError, match="overflows"):
        exact_partial(column([MAX, MAX]), layout_of(1), None)
    inputs = column([1.0, 2.0])
    inputs[1]["g"][0] = np.nan
    with pytest.raises(AggregationError, match="input 1"):
        exact_partial(inputs, layout_of(1), None)


@pytest.mark.parametrize("dtype", ["<f2", "<f4", "<f8", "bfloat16", "float8_e4m3fn"])
def test_every_dtype_and_both_kernels_paths(dtype: str) -> None:
    # float32/float64 are read in place; the narrow floats are widened a block at a time
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, dtype)) if not dtype.startswith("<") else np.dtype(dtype)
    rng = np.random.default_rng(11)
    size = 5000
    inputs = [{"g": (rng.standard_normal(size) * 4).astype(dt)} for _ in range(5)]
    layout = layout_of(size, dt)
    flat = combine_exact(inputs, layout, None, 5.0, 2)["g"]
    sums = np.array([reference([float(x["g"][e]) for x in inputs]) for e in range(size)])
    want = np.empty(size, dt)
    round_into(want, sums, 5.0)  # the rounding of docs/spec.md, section 6.9
    assert flat.tobytes() == want.tobytes()
    partials = [exact_partial(inputs[:2], layout, None), exact_partial(inputs[2:], layout, None)]
    assert exact_combine(partials, layout, 5.0)["g"].tobytes() == flat.tobytes()


def test_the_python_kernel_gives_the_compiled_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    # numba off (GRADSTORE_NUMBA=0, or numba not loading): the same functions run as Python
    rng = random.Random(7)
    columns = [[_random_value(rng) for _ in range(5)] for _ in range(300)]
    columns += [v for v in ADVERSARIAL if math.isfinite(reference(v))]
    n = max(len(c) for c in columns)
    padded = [c + [-0.0] * (n - len(c)) for c in columns]
    inputs = [{"g": np.array([c[i] for c in padded], np.float64)} for i in range(n)]
    layout = layout_of(len(padded))
    assert _exact_kernel.COMPILED, "numba is a dependency: its kernel must load"
    fast = combine_exact(inputs, layout, None, None, 1)["g"]
    fast_partial = exact_partial(inputs[:3], layout, None)["g"]
    monkeypatch.setenv(_fused.ENV, "0")
    try:
        assert not importlib.reload(_exact_kernel).COMPILED
        slow = combine_exact(inputs, layout, None, None, 1)["g"]
        slow_partial = exact_partial(inputs[:3], layout, None)["g"]
    finally:
        monkeypatch.delenv(_fused.ENV)
        assert importlib.reload(_exact_kernel).COMPILED
    assert slow.tobytes() == fast.tobytes()
    assert slow_partial.tobytes() == fast_partial.tobytes()
    assert fast.tobytes() == np.array([reference(c) for c in padded]).tobytes()


SAMPLES = [3, 1, 4, 1, 5, 9]


@pytest.mark.parametrize(
    "kw",
    [
        {"method": "sum"},
        {"method": "mean"},
        {"method": "fedavg"},
        {"method": "weighted", "weights": (1.0, 2.0, 0.5, 3.0, 1.5, 0.25)},
        {"method": "mean", "clip_input_norm": 30.0, "clip_output_norm": 5.0},
    ],
    ids=lambda kw: "-".join(map(str, kw.values())),
)
def test_methods_in_exact_mode_do_not_depend_on_input_order(kw: dict[str, Any]) -> None:
    rng = np.random.default_rng(3)
    scale = np.float32(2.0) ** rng.integers(-30, 30, 20_000).astype(np.float32)
    inputs = [
        {
            "w": (rng.standard_normal(20_000) * scale).astype(np.float32),
            "d": rng.standard_normal(5000) * scale[:5000],  # float64: the modes' bits differ
        }
        for _ in range(6)
    ]
    params = AggregationParams(**kw, accumulate="exact")
    assert params.to_record()["accumulate"] == "exact"
    want = aggregate(inputs, params, SAMPLES)
    ordered = aggregate(inputs, AggregationParams(**kw), SAMPLES)
    assert want["d"].tobytes() != ordered["d"].tobytes()  # the modes differ here
    order = [4, 1, 5, 0, 3, 2]
    weights = kw.get("weights")
    shuffled = AggregationParams(
        **{**kw, **({"weights": tuple(weights[i] for i in order)} if weights else {})},
        accumulate="exact",
    )
    got = aggregate([inputs[i] for i in order], shuffled, [SAMPLES[i] for i in order])
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    layout = Layout.of((name, a.dtype, a.shape) for name, a in inputs[0].items())
    for window_bytes in (1 << 30, 1 << 16):
        streamed, _ = asyncio.run(
            aggregate_streamed(
                [InMemory(t) for t in inputs], layout, params, SAMPLES, window_bytes=window_bytes
            )
        )
        assert all(streamed[k].tobytes() == want[k].tobytes() for k in want)


def test_the_parameter_and_its_record() -> None:
    assert AggregationParams("mean").to_record() == {}
    # "ordered" is the default: a record leaves it out, so existing records and CIDs stay
    assert AggregationParams("mean", accumulate="ordered").to_record() == {}
    exact = AggregationParams("fedavg", accumulate="exact")
    assert exact.to_record() == {"accumulate": "exact"}
    assert AggregationParams.from_record("fedavg", exact.to_record()) == exact
    assert exact.accumulate == "exact" and AggregationParams("median").accumulate is None
    for method in ("median", "trimmed_mean", "krum", "multikrum"):
        with pytest.raises(AggregationError, match="does not apply"):
            AggregationParams(method, accumulate="exact")
    with pytest.raises(AggregationError, match="accumulate must be one of"):
        AggregationParams("sum", accumulate="kahan")


def test_a_streamed_partial_is_the_in_memory_one() -> None:
    # a leaf reads its inputs from its node a window at a time: the same arrays
    rng = np.random.default_rng(9)
    shapes = {"big": (70_001,), "small": (3, 5), "empty": (0,), "z": ()}
    inputs = []
    for i in range(5):
        tensors = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        tensors["big"][::3] = -0.0  # -0.0 everywhere on these elements: rows keep the sign
        tensors["big"][1::1000] *= np.float32(2.0**-120) if i % 2 else np.float32(2.0**100)
        inputs.append(tensors)
    layout = Layout.of((name, a.dtype, a.shape) for name, a in inputs[0].items())
    coefs = [3.0, 1.0, 4.0, 1.0, 5.0]
    want = exact_partial(inputs, layout, coefs)
    assert want["big"].shape[0] >= 2  # the spread values need a second component
    for window_bytes in (1 << 30, 1 << 16):
        got = asyncio.run(
            exact_partial_streamed(
                [InMemory(t) for t in inputs], layout, coefs, window_bytes=window_bytes
            )
        )
        assert list(got) == list(want)
        assert all(got[k].tobytes() == want[k].tobytes() for k in want)
        assert all(got[k].shape == want[k].shape for k in want)
    flat = combine_exact(inputs, layout, coefs, 14.0, 1)
    root = exact_combine(
        [
            exact_partial(inputs[:2], layout, coefs[:2]),
            exact_partial(inputs[2:], layout, coefs[2:]),
        ],
        layout,
        14.0,
    )
    assert all(root[k].tobytes() == flat[k].tobytes() for k in flat)


@pytest.mark.parametrize(
    "kw",
    [
        {"method": "sum"},
        {"method": "fedavg"},
        {"method": "weighted", "weights": (1.0, 2.0, 0.5, 3.0, 1.5, 0.25)},
        {"method": "mean", "clip_input_norm": 30.0, "clip_output_norm": 5.0},
        {"method": "fedavg", "clip_output_norm": 0.5},
    ],
    ids=lambda kw: "-".join(map(str, kw.values())),
)
def test_a_tree_root_gives_the_flat_rounds_bits_and_info(kw: dict[str, Any]) -> None:
    rng = np.random.default_rng(21)
    inputs = [
        {"w": (rng.standard_normal((40, 50)) * 4).astype(np.float32), "b": rng.standard_normal(7)}
        for _ in range(6)
    ]
    layout = Layout.of((name, a.dtype, a.shape) for name, a in inputs[0].items())
    params = AggregationParams(**kw, accumulate="exact")
    want, want_info = aggregate_with_info(inputs, params, SAMPLES)
    bound = kw.get("clip_input_norm")
    scales = [clip_scale(global_norm(t), bound) for t in inputs] if bound else None
    partials = []
    for group in ([4, 0, 2], [3], [5, 1]):  # any groups, in any order
        own = {**kw, "weights": tuple(kw["weights"][i] for i in group)} if "weights" in kw else kw
        coefs, _ = linear_terms(
            AggregationParams(**own, accumulate="exact"),
            [SAMPLES[i] for i in group],
            None if scales is None else [scales[i] for i in group],
        )
        partials.append(exact_partial([inputs[i] for i in group], layout, coefs))
    got, info = aggregate_partials(partials, layout, params, SAMPLES)
    assert list(got) == list(want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    assert info.weights == want_info.weights
    assert (info.output_norm, info.output_scale) == (want_info.output_norm, want_info.output_scale)


def test_only_exact_linear_methods_split() -> None:
    for params in (AggregationParams("median"), AggregationParams("krum", byzantine=1)):
        with pytest.raises(AggregationError, match="cannot be split"):
            splittable(params)
    with pytest.raises(AggregationError, match='only with accumulate = "exact"'):
        splittable(AggregationParams("fedavg"))
    assert splittable(AggregationParams("mean", accumulate="exact")).exact
