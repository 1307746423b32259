"""median and trimmed_mean, coordinate-wise, a block of elements at a time.

Each block of the n inputs is copied into an (n, B) work array and sorted per column by a
min/max comparator network (``_network``); only the rows the result needs are computed.
median takes the middle row (for even n, the mean of the two middle rows, as np.median);
trimmed_mean drops k rows per side and averages the rest in float64, in sorted order.
A zero result is written as +0.0 (min/max may order -0.0 and +0.0 either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from ._blocks import Scratch, blocks, chunks, run
from ._checks import Flat, Layout, NonFiniteResult
from ._network import selection_network, sort_rows
from ._rounding import narrow_format, round_into

#: Elements per block on one thread: (n + 1) rows of 16 Ki elements stay in L2 for a round's n.
BLOCK: Final = 1 << 14

#: Elements per block with several threads: a comparator is two short NumPy calls, so small
#: blocks leave the threads queueing for the GIL; longer rows amortise it (measured best).
THREADED_BLOCK: Final = 1 << 17

_F64: Final = np.dtype(np.float64)


def order_mean(
    flats: Sequence[Flat],
    layout: Layout,
    first: int,
    stop: int,
    scales: Sequence[float] | None,
    threads: int,
) -> dict[str, np.ndarray[Any, Any]]:
    """Per element, the float64 mean of the sorted values at positions ``first..stop-1``.

    ``scales`` (input clipping) multiplies input i by scales[i] in float64 first. Raises
    NonFiniteResult if any input value in a block is NaN/Inf.
    """
    n = len(flats)
    network = selection_network(n, tuple(range(first, stop)))
    out = layout.empty()
    out_flat = {name: array.reshape(-1) for name, array in out.items()}
    factors = None if scales is None else [np.float64(s) for s in scales]
    scratch = Scratch()
    size = BLOCK if threads <= 1 else THREADED_BLOCK

    def work(name: str, start: int, end: int) -> None:
        dtype = layout.dtypes[name]
        if (
            factors is not None
            or narrow_format(dtype) is not None
            or any(flat[name].dtype != dtype for flat in flats)
        ):
            # scaled inputs, bfloat16/float8, and decompressed (float64) inputs are sorted
            # and averaged in float64, exactly (a narrower copy would round them)
            dtype = _F64
        buf = scratch.get("rows", (n + 1, size), dtype)
        finite_buf = scratch.get("finite", (size,), np.dtype(np.bool_))
        acc_buf = scratch.get("acc", (size,), _F64)
        for lo, hi in blocks(start, end, size):
            width = hi - lo
            rows = [buf[i, :width] for i in range(n + 1)]
            for i in range(n):
                if factors is None:
                    np.copyto(rows[i], flats[i][name][lo:hi])
                else:
                    np.multiply(flats[i][name][lo:hi], factors[i], out=rows[i], dtype=_F64)
            # row by row into a contiguous mask: NumPy 2.4's SIMD isfinite wrote a strided
            # (n, 1) output wrongly from n = 16 on, refusing one-element tensors as NaN
            finite = finite_buf[:width]
            for i in range(n):
                if not np.isfinite(rows[i], out=finite).all():
                    raise NonFiniteResult(name)
            rows = sort_rows(rows, network)
            dst = out_flat[name][lo:hi]
            if stop - first == 1:
                round_into(dst, rows[first])
            else:
                acc = acc_buf[:width]
                np.copyto(acc, rows[first])
                for i in range(first + 1, stop):
                    np.add(acc, rows[i], out=acc, dtype=_F64)
                round_into(dst, acc, stop - first)
            np.add(dst, 0, out=dst)
            if not np.isfinite(dst).all():
                raise NonFiniteResult(name)

    run(work, chunks(layout), threads)
    return out
