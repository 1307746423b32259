"""bfloat16 and float8 aggregation: float64 accumulation, one rounding to nearest-even, bit-exact.

The reference here shares nothing with the code under test: element values are decoded
from their bits by formula, accumulated one Python float (IEEE float64) at a time in the
documented order, and rounded by looking up the nearest representable value (ties: the
even bit pattern). ml_dtypes' own float64 -> bfloat16/float8 cast rounds twice (through
float32), which the double-rounding tests below catch.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from fractions import Fraction
from functools import cache
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate, aggregate_with_info
from gradstore.aggregate._rounding import NARROW
from gradstore.errors import AggregationError

Grad = dict[str, np.ndarray[Any, Any]]
SEED = 4242

# name -> (exponent bits, fraction bits, has infinities)
FORMATS = {"bfloat16": (8, 7, True), "float8_e4m3fn": (4, 3, False), "float8_e5m2": (5, 2, True)}
NAMES = list(FORMATS)


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(getattr(ml_dtypes, name))


def _value(name: str, code: int) -> float:
    """The value of a bit pattern, by the format's definition (NaN for NaN patterns)."""
    ebits, mbits, has_inf = FORMATS[name]
    total = 1 + ebits + mbits
    sign = -1.0 if code >> (total - 1) else 1.0
    exp = (code >> mbits) & ((1 << ebits) - 1)
    frac = code & ((1 << mbits) - 1)
    bias = (1 << (ebits - 1)) - 1
    if has_inf and exp == (1 << ebits) - 1:
        return sign * math.inf if frac == 0 else math.nan
    if not has_inf and exp == (1 << ebits) - 1 and frac == (1 << mbits) - 1:
        return math.nan  # e4m3fn: S.1111.111 is NaN, everything else is finite
    if exp == 0:
        return sign * math.ldexp(frac, 1 - bias - mbits)
    return sign * math.ldexp((1 << mbits) + frac, exp - bias - mbits)


@cache
def _table(name: str) -> tuple[list[float], list[int]]:
    """Positive finite values in order with their codes, plus the first value past the max."""
    ebits, mbits, _ = FORMATS[name]
    pairs = sorted(
        (v, c)
        for c in range(1 << (ebits + mbits))  # sign bit clear
        if math.isfinite(v := _value(name, c))
    )
    values, codes = [v for v, _ in pairs], [c for _, c in pairs]
    # The next value after the max (an infinity or NaN pattern): rounding up to it overflows.
    values.append(values[-1] + (values[-1] - values[-2]))
    codes.append(codes[-1] + 1)
    return values, codes


def round_ref(name: str, x: float) -> float:
    """``x`` rounded to the nearest value of the format, ties to the even bit pattern."""
    if math.isnan(x):
        return math.nan
    values, codes = _table(name)
    a = abs(x)
    i = bisect_left(values, a)
    if i == len(values):
        r = math.inf
    elif values[i] == a or i == 0:
        r = values[i]
    else:
        below, above = Fraction(a) - Fraction(values[i - 1]), Fraction(values[i]) - Fraction(a)
        if below != above:
            r = values[i - 1] if below < above else values[i]
        else:
            r = values[i - 1] if codes[i - 1] % 2 == 0 else values[i]
    if r > values[-2]:  # past the max: overflow (e4m3fn has no infinity: NaN)
        r = math.inf if FORMATS[name][2] else math.nan
    return math.copysign(r, x)


def _elements(a: np.ndarray[Any, Any]) -> list[float]:
    """Each element's value decoded from its bits (not through ml_dtypes' casts)."""
    name = str(a.dtype)
    bits = a.reshape(-1).view(np.uint16 if a.dtype.itemsize == 2 else np.uint8)
    return [_value(name, int(c)) for c in bits]


def _from_values(name: str, values: list[float], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """An array holding exactly ``values`` (each must be representable)."""
    out = np.array(values, np.float64).astype(_dtype(name)).reshape(shape)
    assert [v for v in _elements(out) if v == v] == [v for v in values if v == v]
    return out


def ref_linear(
    inputs: list[Grad], coefs: list[float] | None, divisor: float | None, rounded: bool = True
) -> dict[str, list[float]]:
    """acc = c0*x0; acc += ci*xi in input order; acc / divisor; one rounding (unless not
    ``rounded``: the float64 values)."""
    out = {}
    for name in inputs[0]:
        cols = [_elements(x[name]) for x in inputs]
        fmt = str(inputs[0][name].dtype)
        result = []
        for j in range(len(cols[0])):
            acc = cols[0][j] if coefs is None else coefs[0] * cols[0][j]
            for i in range(1, len(cols)):
                acc += cols[i][j] if coefs is None else coefs[i] * cols[i][j]
            if divisor is not None:
                acc /= divisor
            result.append(round_ref(fmt, acc) if rounded else acc)
        out[name] = result
    return out


def ref_order_mean(inputs: list[Grad], first: int, stop: int) -> dict[str, list[float]]:
    """Per element: sort, add positions first..stop-1 in order, divide, round, zero as +0."""
    out = {}
    for name in inputs[0]:
        cols = [_elements(x[name]) for x in inputs]
        fmt = str(inputs[0][name].dtype)
        result = []
        for j in range(len(cols[0])):
            ordered = sorted(col[j] for col in cols)[first:stop]
            acc = ordered[0]
            for v in ordered[1:]:
                acc += v
            if len(ordered) > 1:
                acc /= len(ordered)
            result.append(round_ref(fmt, acc) + 0.0)
        out[name] = result
    return out


def _same_bits(got: Grad, want: dict[str, list[float]], context: str) -> None:
    assert got.keys() == want.keys()
    for name, values in want.items():
        mine = _elements(got[name])
        for j, (a, b) in enumerate(zip(mine, values, strict=True)):
            same = (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
            assert same, f"{context}: tensor {name!r} element {j}: got {a!r}, reference {b!r}"


def make_inputs(fmt: str, n: int, seed: int) -> list[Grad]:
    """Inputs of mixed magnitudes (subnormals included) whose sums stay in range."""
    rng = np.random.default_rng(seed)
    dt = _dtype(fmt)
    values, _ = _table(fmt)
    top = values[-2] / (4 * n)
    tiny = values[1]  # the smallest subnormal (values[0] is 0)
    out = []
    for _ in range(n):
        w = rng.standard_normal((40, 37)) * np.exp2(rng.integers(-6, 6, (40, 37)))
        s = rng.integers(-8, 9, 300) * tiny  # subnormal region
        big = rng.uniform(-top, top, 50)
        out.append(
            {"w": w.astype(dt), "s": s.astype(dt), "big": big.astype(dt), "z": np.zeros(0, dt)}
        )
    return out


def test_the_rounding_table_matches_ml_dtypes_finfo() -> None:
    for fmt, (ebits, mbits, has_inf) in FORMATS.items():
        assert ml_dtypes.finfo(_dtype(fmt)).nexp == ebits
        info = ml_dtypes.finfo(_dtype(fmt))
        spec = NARROW[fmt]
        assert (spec.mantissa, spec.min_exponent, spec.max) == (mbits, info.minexp, float(info.max))
        assert math.isinf(spec.overflow) == has_inf
        assert _table(fmt)[0][-2] == spec.max and _table(fmt)[0][1] == float(
            info.smallest_subnormal
        )


@pytest.mark.usefixtures("linear_kernel")
@pytest.mark.parametrize("fmt", NAMES)
@pytest.mark.parametrize("method", ["sum", "mean", "fedavg", "weighted"])
def test_linear_methods_are_bit_exact_against_the_reference_loop(fmt: str, method: str) -> None:
    n = 4
    inputs = make_inputs(fmt, n, SEED)
    counts = [3, 1, 7, 2]
    weights = (0.5, 0.125, 0.3, 2.0)
    params = AggregationParams(method, weights=weights if method == "weighted" else None)
    got = aggregate(inputs, params, counts if method == "fedavg" else None)
    coefs, divisor = {
        "sum": (None, None),
        "mean": (None, float(n)),
        "fedavg": ([float(c) for c in counts], float(sum(counts))),
        "weighted": (list(weights), math.fsum(weights)),
    }[method]
    assert all(a.dtype == _dtype(fmt) for a in got.values())
    _same_bits(got, ref_linear(inputs, coefs, divisor), f"{method} {fmt}")
    again = aggregate(inputs, params, counts if method == "fedavg" else None, threads=3)
    assert all(again[k].tobytes() == got[k].tobytes() for k in got)


@pytest.mark.parametrize("fmt", NAMES)
@pytest.mark.parametrize(("method", "n", "first", "stop"), [
    ("median", 5, 2, 3), ("median", 4, 1, 3), ("trimmed_mean", 6, 1, 5),
])  # fmt: skip
def test_median_and_trimmed_mean_are_bit_exact(
    fmt: str, method: str, n: int, first: int, stop: int
) -> None:
    inputs = make_inputs(fmt, n, SEED + n)
    params = AggregationParams(method, trim_ratio=0.2 if method == "trimmed_mean" else None)
    got = aggregate(inputs, params)
    _same_bits(got, ref_order_mean(inputs, first, stop), f"{method} of {n} {fmt}")


@pytest.mark.parametrize("fmt", NAMES)
def test_multikrum_is_the_mean_of_the_selected_inputs(fmt: str) -> None:
    inputs = make_inputs(fmt, 7, SEED + 7)
    got, info = aggregate_with_info(inputs, AggregationParams("multikrum", byzantine=1, select=3))
    assert info.selected is not None and len(info.selected) == 3
    chosen = [inputs[i] for i in info.selected]
    _same_bits(got, ref_linear(chosen, None, 3.0), f"multikrum {fmt}")
    single = aggregate(inputs, AggregationParams("krum", byzantine=1))
    assert any(all(single[k].tobytes() == x[k].tobytes() for k in x) for x in inputs)


@pytest.mark.parametrize("fmt", NAMES)
def test_the_one_rounding_is_not_two(fmt: str) -> None:
    """fedavg of 1 and 1 + ulp with counts N, N + 1: just above the midpoint, by 2**-35.

    Rounded once it goes up; a detour through float32 lands on the midpoint first and then
    goes to the even neighbour, 1.0. ml_dtypes' casts did that before 0.7, so they are not
    used.
    """
    mbits = FORMATS[fmt][1]
    one_up = 1.0 + 2.0**-mbits
    big = 1 << 30
    inputs = [
        {"w": _from_values(fmt, [1.0, -1.0], (2,))},
        {"w": _from_values(fmt, [one_up, -one_up], (2,))},
    ]
    got = aggregate(inputs, AggregationParams("fedavg"), [big, big + 1])
    assert _elements(got["w"]) == [one_up, -one_up]
    exact = (big * 1.0 + (big + 1) * one_up) / (2 * big + 1)
    twice = np.array([exact]).astype(np.float32).astype(_dtype(fmt))  # the double rounding
    assert twice.astype(np.float64)[0] == 1.0
    if fmt == "bfloat16":  # and as sum: 1 + 2**-8 + 2**-30 is nearer 1 + 2**-7 than 1
        parts = [{"w": _from_values(fmt, [v], (1,))} for v in (1.0, 2.0**-8, 2.0**-30)]
        assert _elements(aggregate(parts, AggregationParams("sum"))["w"]) == [1.0 + 2.0**-7]


@pytest.mark.parametrize("fmt", NAMES)
def test_ties_go_to_the_even_pattern_and_overflow_is_refused(fmt: str) -> None:
    mbits = FORMATS[fmt][1]
    ulp = 2.0**-mbits
    # mean of 1 and 1 + ulp is exactly halfway: even is 1.0; of 1 + ulp and 1 + 2 ulp: 1 + 2 ulp
    a = _from_values(fmt, [1.0, 1.0 + ulp], (2,))
    b = _from_values(fmt, [1.0 + ulp, 1.0 + 2 * ulp], (2,))
    got = aggregate([{"w": a}, {"w": b}], AggregationParams("mean"))
    assert _elements(got["w"]) == [1.0, 1.0 + 2 * ulp]
    top = _from_values(fmt, [NARROW[fmt].max], (1,))
    with pytest.raises(AggregationError, match="sum: aggregating tensor 'w' overflows its dtype"):
        aggregate([{"w": top}, {"w": top}], AggregationParams("sum"))


@pytest.mark.parametrize("fmt", NAMES)
def test_nan_inputs_are_named(fmt: str) -> None:
    nan = np.array([np.nan], np.float64).astype(_dtype(fmt))
    ok = _from_values(fmt, [1.0], (1,))
    for method in ("mean", "median"):
        with pytest.raises(AggregationError, match="input 2: tensor 'w' contains NaN or infinity"):
            aggregate([{"w": ok}, {"w": ok}, {"w": nan}], AggregationParams(method))


def test_clipping_rounds_once_too() -> None:
    inputs = make_inputs("bfloat16", 3, SEED + 3)
    got, info = aggregate_with_info(
        inputs, AggregationParams("mean", clip_input_norm=1.0, clip_output_norm=0.1)
    )
    assert info.input_scales is not None and info.output_scale is not None
    assert info.output_scale < 1.0
    means = ref_linear(inputs, list(info.input_scales), 3.0, rounded=False)
    norm = math.sqrt(math.fsum(v * v for vs in means.values() for v in vs))
    assert info.output_norm == pytest.approx(norm, rel=1e-15)  # of the float64 mean
    # round/4: the float64 mean, scaled in float64, rounded once
    want = {
        k: [round_ref("bfloat16", v * info.output_scale) for v in vs] for k, vs in means.items()
    }
    _same_bits(got, want, "clipped mean")


def test_older_records_clip_the_rounded_output() -> None:
    inputs = make_inputs("bfloat16", 3, SEED + 3)
    params = AggregationParams(
        "mean", clip_input_norm=1.0, clip_output_norm=0.1, output_clip="rounded"
    )
    got, info = aggregate_with_info(inputs, params)
    assert info.input_scales is not None and info.output_scale is not None
    means = ref_linear(inputs, list(info.input_scales), 3.0)
    # round/2 and round/3: the rounded mean, scaled in float64, rounded once more
    want = {
        k: [round_ref("bfloat16", v * info.output_scale) for v in vs] for k, vs in means.items()
    }
    _same_bits(got, want, "clipped mean")


def test_dtypes_are_named_in_refusals() -> None:
    bf = np.ones(2, ml_dtypes.bfloat16)
    with pytest.raises(AggregationError, match="has dtype <f4, input 0 has bfloat16"):
        aggregate([{"w": bf}, {"w": np.ones(2, "<f4")}], AggregationParams("sum"))
    with pytest.raises(AggregationError, match="has dtype float8_e5m2, input 0 has float8_e4m3fn"):
        aggregate(
            [{"w": np.ones(2, ml_dtypes.float8_e4m3fn)}, {"w": np.ones(2, ml_dtypes.float8_e5m2)}],
            AggregationParams("sum"),
        )
    fnuz = np.ones(2, ml_dtypes.float8_e4m3fnuz)  # a float8 the format does not hold
    with pytest.raises(AggregationError, match="dtype float8_e4m3fnuz; sum aggregates floating"):
        aggregate([{"w": fnuz}], AggregationParams("sum"))
