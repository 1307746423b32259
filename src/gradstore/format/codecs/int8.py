"""``int8``: per block of ``block`` elements, a float32 scale then one int8 per element.

A value is ``float64(scale) * q``, exact. The rules: a scale is +0.0 or a finite normal
positive float32; q is in -127..127; a zero scale has all-zero values, a non-zero one a
value of magnitude 127 (scale = max |x| / 127). ``topk``'s int8 values follow them too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import CompressionError
from ._records import MIN_NORMAL32, f32, fail, rows, windows
from .base import DEFAULT_GROUP, MAX_GROUP, Codec, int_in, spec_int

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Int8(Codec):
    """Blockwise int8: ``block`` elements (1 to 65,536) share a float32 scale."""

    name = "int8"
    spec_help = "int8[:BLOCK]"
    spec_example = "int8:4096"

    block: int

    def __post_init__(self) -> None:
        int_in("block", self.block, 1, MAX_GROUP)

    @classmethod
    def from_spec(cls, spec: str, argument: str | None, options: Mapping[str, str]) -> Codec:
        if argument is not None and "block" in options:
            raise CompressionError(f"{spec!r}: the block size is given twice")
        return cls(block=spec_int(spec, "block", argument or options.get("block"), DEFAULT_GROUP))

    @property
    def group(self) -> int:
        return self.block

    def record_nbytes(self, length: int) -> int:
        return 4 + length

    def validate(self, payload: Array, count: int, path: str) -> None:
        import numpy as np

        for window, _, where in windows(self, payload, count):
            check_int8(window[:, :4], window[:, 4:].view(np.int8), where, path)

    def finite(self, payload: Array, count: int) -> bool:
        return True  # a valid scale is finite, and so is every product with it

    def read(self, buf: Array, count: int, first: int, start: int, stop: int, out: Array) -> Array:
        import numpy as np

        g = self.block
        end = min(count, -(-stop // g) * g)
        direct = first == start and end == stop
        dense = out if direct else np.empty(end - first, np.float64)
        for offset, n, length, at in self.runs(count, first, stop):
            records = rows(buf, offset, n, 4 + length)
            scales = f32(records[:, :4]).astype(np.float64)
            target = dense[at - first : at - first + n * length].reshape(n, length)
            np.multiply(records[:, 4:].view(np.int8), scales, out=target, dtype=np.float64)
        if not direct:
            out[:] = dense[start - first : stop - first]
        return out


def check_int8(raw_scales: Array, q: Array, where: int, path: str, what: str = "block") -> None:
    """The int8 rules for records whose (n, 4) scale bytes are ``raw_scales`` and whose
    (n, m) values are ``q``; the first record is number ``where`` (a ``what``)."""
    import numpy as np

    scales = f32(raw_scales)[:, 0]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(scales) & ~np.signbit(scales) & ((scales == 0) | (scales >= MIN_NORMAL32))
    fail("its scale must be +0.0 or a finite normal float32 > 0", ~ok, where, what, path)
    fail("holds -128 (int8 values are -127..127)", (q == -128).any(axis=1), where, what, path)
    peak = np.abs(q).max(axis=1) if q.shape[1] else np.zeros(q.shape[0], np.int8)
    fail("a zero scale with non-zero values", (scales == 0) & (peak != 0), where, what, path)
    fail(
        "a non-zero scale needs a value of magnitude 127 (scale = max |x| / 127)",
        (scales != 0) & (peak != 127),
        where,
        what,
        path,
    )
