"""Global L2 norms and norm clipping (of each input, or of the aggregate).

A norm is taken over all tensors of one gradient, in tensor-name order then element
order: the square root of a float64 sum of squares. How the squares are summed is part of
the record's version (``NormSum``): round/4 records add them one at a time, in order (a
rule anyone can implement); round/2 and round/3 records summed each block of 65,536
squares with NumPy's pairwise sum and added the blocks in order. Clipping multiplies by
``min(1, bound / norm)``.

Output clipping is also part of the record's version (``OutputClip``): round/4 takes the
norm of the float64 aggregate and rounds the scaled values once to the dtype
(``clip_then_round``); round/2 and round/3 rounded the aggregate first, took the norm of
the rounded values and rounded the scaled values again (``clip_output_into``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import numpy as np

from ..errors import AggregationError
from ..format import all_finite, is_float
from ._checks import NonFiniteResult, Tensors, dtype_name
from ._rounding import round_into

#: Elements per block when squaring or scaling.
BLOCK: Final = 1 << 16

_F64: Final = np.dtype(np.float64)

#: How a norm's squares are summed: ``sequential`` (round/4: one at a time, in order) or
#: ``blocked-pairwise`` (round/2 and round/3: NumPy's pairwise sum per ``BLOCK``).
NormSum = Literal["sequential", "blocked-pairwise"]
NORM_SUMS: Final[tuple[NormSum, ...]] = ("sequential", "blocked-pairwise")

#: When output clipping rounds: ``float64`` (round/4: the norm of the float64 aggregate, then
#: one rounding of the scaled values) or ``rounded`` (round/2 and round/3: the norm of the
#: aggregate rounded to its dtype, whose scaled values are then rounded a second time).
OutputClip = Literal["float64", "rounded"]
OUTPUT_CLIPS: Final[tuple[OutputClip, ...]] = ("float64", "rounded")


def global_norm(tensors: Tensors, rule: NormSum = "sequential") -> float:
    """The L2 norm of one gradient over all its tensors, in float64 (NaN/Inf if it holds any)."""
    squares = SquareSum(rule)
    for name in sorted(tensors):
        squares.add(np.ravel(tensors[name]))
    return squares.norm()


def pairwise_sum(a: np.ndarray[Any, Any]) -> float:
    """NumPy 2.4's pairwise summation of a contiguous float64 array, written out so that it
    does not depend on the NumPy installed (2.5 sums differently): old records' norms need it.

    Below 8 elements a running sum from 0.0; up to 128, eight running sums over the whole
    groups of 8, combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the rest in order;
    above, the two halves (the first a multiple of 8 long) summed apart and added.
    """
    n = a.size
    if n >= 256 and n & (n - 1) == 0:  # a power of two (a whole BLOCK): every split halves
        groups = a.reshape(-1, 128)
        r = groups[:, 0:8].copy()
        for i in range(8, 128, 8):
            np.add(r, groups[:, i : i + 8], out=r)
        low = (r[:, 0] + r[:, 1]) + (r[:, 2] + r[:, 3])
        sums = low + ((r[:, 4] + r[:, 5]) + (r[:, 6] + r[:, 7]))
        while sums.size > 1:
            sums = sums[0::2] + sums[1::2]
        return float(sums[0])
    if n < 8:
        total = 0.0
        for v in a.tolist():
            total = total + v
        return total
    if n <= 128:
        whole = n - n % 8
        r = a[0:8].copy()
        for i in range(8, whole, 8):
            np.add(r, a[i : i + 8], out=r)
        total = float(((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])))
        for v in a[whole:].tolist():
            total = total + v
        return total
    half = n // 2
    half -= half % 8
    return pairwise_sum(a[:half]) + pairwise_sum(a[half:])


class SquareSum:
    """The float64 sum of squares behind :func:`global_norm`, fed in tensor-name order.

    ``sequential``: ``total = total + float64(x)**2`` for every element in order (a running
    sum: ``np.add.accumulate``, seeded with the total so far). ``blocked-pairwise``: each
    ``BLOCK`` of squares is summed with NumPy's pairwise sum and the blocks are added in
    order. Either way, pieces that start at multiples of ``BLOCK`` within their tensor give
    the same bits as one call over the whole tensor.
    """

    def __init__(self, rule: NormSum = "sequential") -> None:
        if rule not in NORM_SUMS:
            raise AggregationError(f"unknown norm summation {rule!r}")
        self.rule = rule
        self.total = 0.0
        self._buf = np.empty(BLOCK, _F64)

    def add(self, flat: np.ndarray[Any, Any]) -> None:
        sequential = self.rule == "sequential"
        with np.errstate(over="ignore", invalid="ignore"):
            for lo in range(0, flat.size, BLOCK):
                part = flat[lo : lo + BLOCK]
                squares = self._buf[: part.size]
                np.square(part, out=squares, dtype=_F64)
                if sequential:
                    squares[0] += self.total  # the running sum goes on from the total
                    np.add.accumulate(squares, out=squares)
                    self.total = float(squares[-1])
                else:
                    self.total += pairwise_sum(squares)

    def norm(self) -> float:
        return math.sqrt(self.total)


def clip_output_into(
    result: dict[str, np.ndarray[Any, Any]], bound: float, method: str, rule: NormSum
) -> tuple[float, float]:
    """Scale ``result`` in place so its global norm is at most ``bound``: (norm, scale)."""
    norm = global_norm(result, rule)
    if not math.isfinite(norm):
        raise AggregationError(f"{method}: the aggregate's L2 norm overflows float64")
    scale = clip_scale(norm, bound)
    if scale != 1.0:
        scale_into(result, scale, result)
    return norm, scale


def clip_then_round(
    result: dict[str, np.ndarray[Any, Any]],
    out: dict[str, np.ndarray[Any, Any]],
    bound: float,
    method: str,
    rule: NormSum,
    positive_zeros: bool = False,
) -> tuple[float, float]:
    """``out = dtype(result * scale)``, rounded once: ``result`` is the float64 aggregate,
    whose global norm sets the scale (1.0 within ``bound``); returns (norm, scale).

    ``positive_zeros`` (median, trimmed_mean): a zero written is +0.0, also where a tiny
    negative value rounds to zero. Raises NonFiniteResult naming a tensor whose rounded
    values overflow their dtype."""
    norm = global_norm(result, rule)
    if not math.isfinite(norm):
        raise AggregationError(f"{method}: the aggregate's L2 norm overflows float64")
    scale = clip_scale(norm, bound)
    with np.errstate(over="ignore", invalid="ignore"):
        scale_into(result, scale, out)  # x * 1.0 is exact: unclipped values round as they are
    for name, array in out.items():
        if positive_zeros:
            np.add(array, 0, out=array)  # -0.0 + 0 is +0.0; every other value stays
        if not all_finite(array):
            raise NonFiniteResult(name)
    return norm, scale


def clip_scale(norm: float, bound: float) -> float:
    """The factor that brings ``norm`` down to ``bound``; 1.0 when it is already within."""
    return 1.0 if norm <= bound else bound / norm


def input_scales(norms: Sequence[float], bound: float) -> list[float]:
    """Each input's clip factor from its global norm (``clip_scale``), as a flat round and
    a tree's leaf take them; AggregationError naming an input whose norm is not finite."""
    for index, norm in enumerate(norms):
        if not math.isfinite(norm):
            raise AggregationError(f"input {index}: its L2 norm is not finite")
    return [clip_scale(norm, bound) for norm in norms]


def input_norms(inputs: Sequence[Tensors], rule: NormSum = "sequential") -> list[float]:
    """Each input's global norm; AggregationError naming an input with NaN/Inf."""
    norms = []
    for index, tensors in enumerate(inputs):
        for name in sorted(tensors):
            dtype = np.asarray(tensors[name]).dtype
            if not is_float(dtype):
                raise AggregationError(
                    f"input {index}: tensor {name!r} has dtype {dtype_name(dtype)}; "
                    "only floating-point tensors are clipped"
                )
        norm = global_norm(tensors, rule)
        if not math.isfinite(norm):
            bad = [name for name in sorted(tensors) if not all_finite(np.asarray(tensors[name]))]
            if bad:
                raise AggregationError(f"input {index}: tensor {bad[0]!r} contains NaN or infinity")
            raise AggregationError(f"input {index}: its L2 norm overflows float64")
        norms.append(norm)
    return norms


def scale_into(
    src: Mapping[str, np.ndarray[Any, Any]], scale: float, out: Mapping[str, np.ndarray[Any, Any]]
) -> None:
    """``out[name] = dtype(float64(src[name]) * scale)`` block by block; ``out`` may be ``src``."""
    factor = np.float64(scale)
    buf = np.empty(BLOCK, _F64)
    for name, array in src.items():
        flat, dst = np.ravel(array), out[name].reshape(-1)
        for lo in range(0, flat.size, BLOCK):
            part = buf[: min(BLOCK, flat.size - lo)]
            np.multiply(flat[lo : lo + BLOCK], factor, out=part, dtype=_F64)
            round_into(dst[lo : lo + BLOCK], part)


def clip_inputs(
    inputs: Sequence[Tensors], max_norm: float
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Each input scaled so its global norm is at most ``max_norm`` (inputs within it untouched).

    A standalone helper: :func:`aggregate` with ``clip_input_norm`` does not round the scaled
    inputs to their dtype; it folds each scale into the float64 accumulation.
    """
    bound = _bound(max_norm)
    clipped = []
    for tensors, norm in zip(inputs, input_norms(inputs), strict=True):
        scale = clip_scale(norm, bound)
        if scale == 1.0:
            clipped.append(dict(tensors))
        else:
            out = {name: np.empty(array.shape, array.dtype) for name, array in tensors.items()}
            scale_into(tensors, scale, out)
            clipped.append(out)
    return clipped


def clip_output(tensors: Tensors, max_norm: float) -> dict[str, np.ndarray[Any, Any]]:
    """``tensors`` scaled so the global norm is at most ``max_norm`` (up to dtype rounding)."""
    bound = _bound(max_norm)
    scale = clip_scale(input_norms([tensors])[0], bound)
    if scale == 1.0:
        return dict(tensors)
    out = {name: np.empty(array.shape, array.dtype) for name, array in tensors.items()}
    scale_into(tensors, scale, out)
    return out


def _bound(max_norm: float) -> float:
    bound = float(max_norm)
    if not (math.isfinite(bound) and bound > 0):
        raise AggregationError(f"clipping norm must be finite and > 0, got {max_norm}")
    return bound
