"""numba code of the fused linear kernel; imported by ``_fused`` only when it is wanted.

Inputs arrive as an array of data addresses so that one compiled function serves any
number of inputs (a tuple would compile once per count). The caller keeps the arrays alive.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic
from numba.np.numpy_support import carray

#: Elements per block: the float64 accumulator (16 KiB) stays in L1.
BLOCK = 2048


@intrinsic
def _pointer_like(typingctx: Any, address: Any, like: Any) -> Any:
    """``address`` as a pointer to ``like``'s element type."""
    signature = types.CPointer(like.dtype)(address, like)  # type: ignore[no-untyped-call]

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(sig.return_type))

    return signature, codegen


@numba.njit(inline="always", cache=True)
def _input(addresses: np.ndarray[Any, Any], index: int, like: np.ndarray[Any, Any]) -> Any:
    """Input ``index``: the array of ``like``'s dtype and size at ``addresses[index]``."""
    return carray(_pointer_like(addresses[index], like), like.size)  # type: ignore[call-arg]


@numba.njit(nogil=True, cache=True, error_model="numpy", boundscheck=False)
def combine_range(
    out: np.ndarray[Any, Any],
    addresses: np.ndarray[Any, Any],
    coefs: np.ndarray[Any, Any],
    divisor: float,
    start: int,
    stop: int,
) -> int:
    """``out[start:stop] = (sum_i coefs[i] * x_i) / divisor``; returns how many are NaN/Inf.

    ``x_i`` has ``out``'s dtype and size and starts at ``addresses[i]``. Each element is
    widened to float64, multiplied, added in input order, divided and rounded once.
    """
    acc = np.empty(BLOCK, np.float64)
    bad = 0
    for lo in range(start, stop, BLOCK):
        hi = min(lo + BLOCK, stop)
        a = acc[: hi - lo]
        x = _input(addresses, 0, out)[lo:hi]
        c = coefs[0]
        for j in range(hi - lo):
            a[j] = np.float64(x[j]) * c
        for i in range(1, addresses.size):
            x = _input(addresses, i, out)[lo:hi]
            c = coefs[i]
            for j in range(hi - lo):
                a[j] += np.float64(x[j]) * c
        o = out[lo:hi]
        for j in range(hi - lo):
            o[j] = a[j] / divisor
        for j in range(hi - lo):
            bad += not np.isfinite(o[j])
    return bad
