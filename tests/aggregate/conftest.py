"""Fixtures for the aggregators: run a test once per linear kernel (NumPy and numba)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gradstore.aggregate import _fused


@pytest.fixture(params=["numpy", "numba"])
def linear_kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Force sum/mean/fedavg/weighted onto one kernel, whatever the tensors' size.

    numba is a dependency, so its kernel must load here: a missing one fails the test
    rather than quietly testing the NumPy path twice.
    """
    if request.param == "numpy":
        monkeypatch.setenv(_fused.ENV, "0")
        assert _fused.kernel(1 << 40) is None
    else:
        monkeypatch.delenv(_fused.ENV, raising=False)
        monkeypatch.setattr(_fused, "MIN_ELEMENTS", 0)
        assert _fused.kernel(0) is not None, "the numba kernel did not load"
    yield request.param
