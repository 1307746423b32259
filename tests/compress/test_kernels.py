"""The compiled encoders write exactly the bytes of the NumPy definitions."""

from __future__ import annotations

import numpy as np
import pytest

from gradstore.compress import _fast, compress_array
from gradstore.format import Codec

N = 3 * (1 << 16) + 123  # over the size that takes the compiled path, with a short tail


def _inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    ties = rng.integers(-4, 5, N).astype(np.float32)  # many equal magnitudes
    halves = (rng.integers(-254, 255, N) / 2).astype(np.float64)  # x / scale ends in .5
    halves[::4096] = 127.0  # block max 127: scale 1.0, quotients exactly .5
    wide = (rng.standard_normal(N) * 10.0 ** rng.integers(-20, 20, N)).astype(np.float64)
    zeros = np.zeros(N, np.float32)
    zeros[1000:9000] = rng.standard_normal(8000)
    return [rng.standard_normal(N).astype(np.float32), ties, halves, wide, zeros]


@pytest.mark.parametrize(
    "codec",
    [
        Codec("int8", block=4096),
        Codec("int8", block=1000),
        Codec("topk", chunk=4096, k=61, index=12, values="int8"),
        Codec("topk", chunk=4096, k=300, index=16, values="2bit"),
        Codec("topk", chunk=777, k=5, index=12, values="bf16"),
    ],
)
def test_numba_and_numpy_write_the_same_bytes(
    codec: Codec, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _fast._kernels() is None:
        pytest.fail("numba is a dependency: its kernels must load")
    for x in _inputs():
        monkeypatch.setenv("GRADSTORE_NUMBA", "1")
        assert _fast.kernels_for(x.size) is not None
        fast = compress_array(x, codec, "x")
        monkeypatch.setenv("GRADSTORE_NUMBA", "0")
        assert _fast.kernels_for(x.size) is None
        slow = compress_array(x, codec, "x")
        assert fast.payload.tobytes() == slow.payload.tobytes()
