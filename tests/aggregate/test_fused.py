"""The numba kernel: when it runs, when it steps aside, and that it gives the NumPy path's bits."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, _fused, aggregate, sum_
from gradstore.errors import AggregationError

Grad = dict[str, np.ndarray[Any, Any]]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count the numba kernel's calls (one per work chunk), with the size threshold kept."""
    monkeypatch.delenv(_fused.ENV, raising=False)
    compiled = _fused.kernel(_fused.MIN_ELEMENTS)
    assert compiled is not None, "the numba kernel did not load"
    counted: list[int] = []

    def counting(*args: Any) -> int:
        counted.append(args[5] - args[4])
        return compiled(*args)

    real: Callable[[int], Any] = _fused.kernel
    monkeypatch.setattr(_fused, "kernel", lambda n: None if real(n) is None else counting)
    yield counted


def big_inputs(n: int, size: int, dtype: str = "<f4", seed: int = 7) -> list[Grad]:
    rng = np.random.default_rng(seed)
    return [{"g": rng.standard_normal(size).astype(dtype)} for _ in range(n)]


def numpy_path(
    inputs: list[Grad], params: AggregationParams, monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> Grad:
    with monkeypatch.context() as patch:
        patch.setenv(_fused.ENV, "0")
        return aggregate(inputs, params, **kw)


@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_large_layouts_take_the_numba_kernel_with_numpys_bits(
    dtype: str, calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 Mi + 5 elements: two chunks, so two threads each run the kernel once.
    inputs = big_inputs(6, (1 << 20) + 5, dtype)
    counts = [3, 1, 4, 1, 5, 9]
    params = AggregationParams("fedavg")
    fused = aggregate(inputs, params, counts, threads=2)
    assert sorted(calls) == [5, 1 << 20]
    expected = numpy_path(inputs, params, monkeypatch, num_samples=counts, threads=2)
    assert fused["g"].dtype == np.dtype(dtype)
    assert fused["g"].tobytes() == expected["g"].tobytes()


def test_small_layouts_stay_on_numpy(calls: list[int]) -> None:
    sum_(big_inputs(3, _fused.MIN_ELEMENTS - 1))
    assert calls == []


def test_tensors_the_kernel_cannot_read_fall_back_one_by_one(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # float16, big-endian and unaligned tensors go through NumPy; the float32 one through numba.
    size = _fused.MIN_ELEMENTS
    rng = np.random.default_rng(3)
    inputs: list[Grad] = []
    for _ in range(3):
        raw = np.empty(size * 8 + 1, np.uint8)[1:]  # one byte off: misaligned for float64
        unaligned = np.frombuffer(raw, np.float64)
        unaligned[:] = rng.standard_normal(size)
        assert not unaligned.flags.aligned
        inputs.append(
            {
                "f32": rng.standard_normal(size).astype("<f4"),
                "half": rng.standard_normal(64).astype("<f2"),
                "swapped": rng.standard_normal(64).astype(">f8"),
                "unaligned": unaligned,
            }
        )
    params = AggregationParams("mean")
    result = aggregate(inputs, params, threads=1)
    assert calls == [size]  # only "f32" ran compiled
    expected = numpy_path(inputs, params, monkeypatch, threads=1)
    for name in expected:
        assert result[name].tobytes() == expected[name].tobytes(), name


def test_nan_and_overflow_are_caught_in_the_compiled_pass(calls: list[int]) -> None:
    inputs = big_inputs(3, _fused.MIN_ELEMENTS)
    inputs[2]["g"][-1] = np.nan  # last element of the last block
    with pytest.raises(AggregationError, match="input 2: tensor 'g' contains NaN or infinity"):
        sum_(inputs)
    big = np.full(_fused.MIN_ELEMENTS, np.finfo(np.float32).max, np.float32)
    with pytest.raises(AggregationError, match="sum: aggregating tensor 'g' overflows"):
        sum_([{"g": big}, {"g": big}])
    assert calls  # both went through numba


def test_signed_zeros_survive_like_on_numpy(
    calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # sum adds x * 1.0 in the kernel: exact, so -0.0 + -0.0 stays -0.0 as on the NumPy path.
    zeros = [{"g": np.full(_fused.MIN_ELEMENTS, -0.0, np.float32)} for _ in range(2)]
    result = sum_(zeros)
    assert calls and np.signbit(result["g"]).all()
    assert (
        result["g"].tobytes()
        == numpy_path(zeros, AggregationParams("sum"), monkeypatch)["g"].tobytes()
    )


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_the_environment_turns_it_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_fused.ENV, value)
    assert _fused.kernel(1 << 40) is None


def test_without_numba_the_numpy_path_is_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(_fused.ENV, raising=False)
    monkeypatch.setitem(sys.modules, "gradstore.aggregate._numba_kernel", None)  # import fails
    _fused._compiled.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=_fused.__name__):
            assert _fused.kernel(1 << 40) is None
        assert "numba unavailable" in caplog.text
        inputs = big_inputs(2, _fused.MIN_ELEMENTS)
        expected = inputs[0]["g"].astype(np.float64) + inputs[1]["g"]
        assert sum_(inputs)["g"].tobytes() == expected.astype(np.float32).tobytes()
    finally:
        _fused._compiled.cache_clear()


def test_prepare_says_whether_inputs_like_these_will_run_compiled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(_fused.ENV, raising=False)
    large = {"w": np.zeros((1024, 1024), np.float32)}
    assert _fused.prepare(large)
    assert not _fused.prepare({"w": np.zeros(16, np.float32)})
    monkeypatch.setenv(_fused.ENV, "0")
    assert not _fused.prepare(large)
