"""Sorting networks: order statistics of n rows with elementwise min/max, no per-column sort.

Sorting each coordinate's n values with np.sort/np.partition along the input axis pays a
per-column overhead; a comparator network instead runs whole rows through SIMD
``np.minimum``/``np.maximum``, which is many times faster for the small n of a round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np


class Comparator(NamedTuple):
    """Wires ``low`` < ``high``: afterwards ``low`` holds the min, ``high`` the max.

    ``keep_low``/``keep_high`` say which result a later step still needs.
    """

    low: int
    high: int
    keep_low: bool
    keep_high: bool


def batcher_pairs(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort network for any n (Knuth, TAOCP 5.3.4), as wire pairs."""
    pairs: list[tuple[int, int]] = []
    p = 1
    while p < n:
        k = p
        while k >= 1:
            for j in range(k % p, n - k, 2 * k):
                for i in range(min(k, n - j - k)):
                    if (i + j) // (2 * p) == (i + j + k) // (2 * p):
                        pairs.append((i + j, i + j + k))
            k //= 2
        p *= 2
    return pairs


@lru_cache(maxsize=64)
def selection_network(n: int, wanted: tuple[int, ...]) -> tuple[Comparator, ...]:
    """The comparators of Batcher's network that the sorted positions ``wanted`` depend on."""
    needed = set(wanted)
    kept: list[Comparator] = []
    for low, high in reversed(batcher_pairs(n)):
        keep_low, keep_high = low in needed, high in needed
        if keep_low or keep_high:
            kept.append(Comparator(low, high, keep_low, keep_high))
            needed |= {low, high}
    kept.reverse()
    return tuple(kept)


def apply_network(values: list[int], network: Iterable[Comparator]) -> list[int]:
    """Run ``network`` over plain numbers (for tests: the 0-1 principle check)."""
    out = list(values)
    for c in network:
        lo, hi = min(out[c.low], out[c.high]), max(out[c.low], out[c.high])
        if c.keep_low:
            out[c.low] = lo
        if c.keep_high:
            out[c.high] = hi
    return out


def sort_rows(rows: Sequence[np.ndarray], network: Sequence[Comparator]) -> list[np.ndarray]:
    """Run ``network`` over ``rows[:-1]`` column by column (the last row is scratch) and return
    them in order: where a comparator keeps both results, rows swap as views, never copied."""
    rows = list(rows)
    spare = rows.pop()
    for c in network:
        a, b = rows[c.low], rows[c.high]
        if c.keep_low and c.keep_high:
            np.minimum(a, b, out=spare)
            np.maximum(a, b, out=b)
            rows[c.low], spare = spare, a
        elif c.keep_low:
            np.minimum(a, b, out=a)
        else:
            np.maximum(a, b, out=b)
    return rows
