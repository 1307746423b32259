"""sum, mean, fedavg and weighted: one float64 accumulator per block, inputs added in order.

For every element: ``acc = c[0] * x[0]; acc += c[i] * x[i]`` for i = 1..n-1 in input order,
then ``acc / divisor``, then one rounding to the inputs' dtype. With no coefficients
(sum, mean) the multiplications are skipped. Nothing else rounds, so the aggregate is
bit-for-bit reproducible from the same inputs in the same order.

Large layouts run the numba-compiled kernel of ``_fused`` (same operations, same bits);
the NumPy path below serves small layouts, other dtypes (bfloat16 and float8 included:
``_rounding`` rounds them), and machines without numba.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np

from . import _fused
from ._blocks import Scratch, blocks, chunks, run
from ._checks import Flat, Layout, NonFiniteResult
from ._rounding import round_into

#: Elements per block: two float64 buffers of 512 KiB stay in a 2 MiB L2 cache with the inputs.
BLOCK: Final = 1 << 16

_F64: Final = np.dtype(np.float64)
_BOOL: Final = np.dtype(np.bool_)


def combine(
    flats: Sequence[Flat],
    layout: Layout,
    coefs: Sequence[float] | None,
    divisor: float | None,
    threads: int,
) -> dict[str, np.ndarray[Any, Any]]:
    """``(sum_i coefs[i] * x_i) / divisor`` per element, accumulated in float64, in input order.

    ``coefs`` None means all ones; ``divisor`` None means no division. Raises
    NonFiniteResult if any output element is NaN/Inf (an input held one, or it overflowed).
    """
    out = layout.empty()
    out_flat = {name: array.reshape(-1) for name, array in out.items()}
    numpy_work = _numpy_kernel(flats, out_flat, coefs, divisor)
    fused = _fused.kernel(sum(layout.size(name) for name in layout.names))
    if fused is None:
        run(numpy_work, chunks(layout), threads)
        return out
    addresses = {
        name: np.array([flat[name].ctypes.data for flat in flats], np.intp)
        for name in layout.names
        if _fused.usable([flat[name] for flat in flats] + [out_flat[name]])
        # the kernel reads every input as the output's dtype: decompressed (float64) inputs
        # of a float32 layout take the NumPy path
        and all(flat[name].dtype == out_flat[name].dtype for flat in flats)
    }
    factors = np.array([1.0] * len(flats) if coefs is None else coefs, np.float64)
    scale = 1.0 if divisor is None else float(divisor)  # x * 1.0 and x / 1.0 are exact

    def work(name: str, start: int, stop: int) -> None:
        if name not in addresses:
            numpy_work(name, start, stop)
        elif fused(out_flat[name], addresses[name], factors, scale, start, stop):
            raise NonFiniteResult(name)

    run(work, chunks(layout), threads)
    return out


def _numpy_kernel(
    flats: Sequence[Flat],
    out_flat: dict[str, np.ndarray[Any, Any]],
    coefs: Sequence[float] | None,
    divisor: float | None,
) -> Callable[[str, int, int], None]:
    """The NumPy form of the kernel: ``work(name, start, stop)`` fills ``out_flat[name][start:stop]``."""
    factors = None if coefs is None else [np.float64(c) for c in coefs]
    scratch = Scratch()

    def work(name: str, start: int, stop: int) -> None:
        acc_buf = scratch.get("acc", (BLOCK,), _F64)
        tmp_buf = scratch.get("tmp", (BLOCK,), _F64)
        finite_buf = scratch.get("finite", (BLOCK,), _BOOL)
        for lo, hi in blocks(start, stop, BLOCK):
            acc, tmp = acc_buf[: hi - lo], tmp_buf[: hi - lo]
            # Each x is widened exactly to float64 inside the ufunc (its cast buffer stays
            # in L1), then multiplied or added in float64: one call per step, no extra pass.
            first = flats[0][name][lo:hi]
            if factors is None:
                np.copyto(acc, first)
            else:
                np.multiply(first, factors[0], acc)
            for index in range(1, len(flats)):
                x = flats[index][name][lo:hi]
                if factors is None:
                    np.add(acc, x, acc, dtype=_F64)
                else:
                    np.multiply(x, factors[index], tmp)
                    np.add(acc, tmp, acc)
            dst = out_flat[name][lo:hi]
            round_into(dst, acc, divisor)  # divided in float64, rounded once on the way out
            finite = finite_buf[: hi - lo]
            np.isfinite(dst, finite)
            if not finite.all():
                raise NonFiniteResult(name)

    return work
