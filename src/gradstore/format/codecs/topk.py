"""``topk``: per chunk of ``chunk`` elements, the ``k`` largest magnitudes and where they are.

A chunk of L elements keeps ``ceil(k * L / chunk)`` of them. Its record is a header
(nothing for ``bf16`` values, a float32 scale for ``int8``, two float32 levels ``lo, hi``
for ``2bit``), the kept values in the order of their positions, then the positions,
strictly ascending, 12-bit packed or 16-bit little-endian; bits that pad a byte are zero.
Every element not kept is +0.0, so a range costs work in proportion to what it keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ...errors import CompressionError, InvalidDocumentError
from ._records import f32, fail, rows, windows
from .base import DEFAULT_GROUP, MAX_GROUP, Codec, int_in, spec_int
from .int8 import check_int8

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]

#: How ``topk`` writes its kept values.
VALUE_FORMATS: Final = ("bf16", "int8", "2bit")

#: Index widths ``topk`` may pack positions in, and the largest chunk each can address.
INDEX_BITS: Final = {12: 1 << 12, 16: 1 << 16}

#: Bytes of a record's header, by value format: none, a scale, or two levels.
_HEADER: Final = {"bf16": 0, "int8": 4, "2bit": 8}


@dataclass(frozen=True)
class TopK(Codec):
    """Chunked top-k: ``k`` of every ``chunk`` elements kept, with their positions."""

    name = "topk"
    text_params: ClassVar[frozenset[str]] = frozenset({"values"})
    sparse = True
    spec_help = "topk:RATIO[,values=bf16|int8|2bit][,chunk=N][,index=12|16]"
    spec_example = "topk:0.015,values=int8"

    chunk: int
    k: int
    index: int
    values: str

    def __post_init__(self) -> None:
        int_in("chunk", self.chunk, 1, MAX_GROUP)
        int_in("k", self.k, 1, self.chunk)
        index = self.index
        if not isinstance(index, int) or isinstance(index, bool) or index not in INDEX_BITS:
            raise InvalidDocumentError(
                f"index must be 12 or 16 (bits per position), got {self.index!r}",
                "$.codec.index",
            )
        if self.chunk > INDEX_BITS[index]:
            raise InvalidDocumentError(
                f"a chunk of {self.chunk} elements needs 16-bit positions", "$.codec.index"
            )
        if not isinstance(self.values, str) or self.values not in VALUE_FORMATS:
            raise InvalidDocumentError(
                f"values must be one of {', '.join(VALUE_FORMATS)}, got {self.values!r}",
                "$.codec.values",
            )

    @classmethod
    def from_spec(cls, spec: str, argument: str | None, options: Mapping[str, str]) -> Codec:
        """``topk:RATIO`` (or ``k=``), with ``chunk=`` (default 4096), ``values=`` (default
        bf16) and ``index=`` (default 12 when the chunk allows it). A ratio becomes
        ``k = max(1, round(ratio * chunk))`` (halves up), so the document records an exact
        count, not a float."""
        chunk = spec_int(spec, "chunk", options.get("chunk"), DEFAULT_GROUP)
        if argument is not None and "k" in options:
            raise CompressionError(f"{spec!r}: give a ratio or k=, not both")
        if argument is None and "k" not in options:
            raise CompressionError(f"{spec!r}: topk needs a ratio (topk:0.015) or k=COUNT")
        if argument is not None:
            try:
                ratio = float(argument)
            except ValueError:
                raise CompressionError(
                    f"{spec!r}: the ratio {argument!r} is not a number"
                ) from None
            if not (math.isfinite(ratio) and 0 < ratio <= 1):
                raise CompressionError(f"{spec!r}: the ratio must be in (0, 1], got {argument}")
            k = max(1, min(chunk, math.floor(ratio * chunk + 0.5)))
        else:
            k = spec_int(spec, "k", options["k"], 0)
        index = spec_int(spec, "index", options.get("index"), 12 if chunk <= 4096 else 16)
        values = options.get("values", "bf16").lower()
        return cls(chunk=chunk, k=k, index=index, values=values)

    # -- layout ----------------------------------------------------------------------
    @property
    def group(self) -> int:
        return self.chunk

    def kept(self, length: int) -> int:
        """How many of a chunk's ``length`` elements it keeps: ceil(k * length / chunk)."""
        return (self.k * length + self.chunk - 1) // self.chunk

    def kept_elements(self, count: int) -> int:
        """``k`` of every whole chunk of a tensor of ``count`` elements, and ``kept(L)`` of
        its last L < ``chunk`` (what ``k`` alone, a per-chunk count, does not say)."""
        full, rest = divmod(count, self.chunk)
        return full * self.k + self.kept(rest)

    def header_nbytes(self) -> int:
        """Bytes before a record's values: none (bf16), a scale (int8), two levels (2bit)."""
        return _HEADER[self.values]

    def value_nbytes(self, kept: int) -> int:
        """Bytes of ``kept`` values."""
        if self.values == "bf16":
            return 2 * kept
        if self.values == "int8":
            return kept
        return (kept + 3) // 4

    def index_nbytes(self, kept: int) -> int:
        """Bytes of ``kept`` positions."""
        return (3 * kept + 1) // 2 if self.index == 12 else 2 * kept

    def record_nbytes(self, length: int) -> int:
        kept = self.kept(length)
        return self.header_nbytes() + self.value_nbytes(kept) + self.index_nbytes(kept)

    # -- checks ----------------------------------------------------------------------
    def validate(self, payload: Array, count: int, path: str) -> None:

        for window, length, where in windows(self, payload, count):
            self._check(window, self.kept(length), length, where, path)

    def _check(self, records: Array, kept: int, length: int, where: int, path: str) -> None:
        import numpy as np

        header = self.header_nbytes()
        values = records[:, header : header + self.value_nbytes(kept)]
        raw_index = records[:, header + self.value_nbytes(kept) :]
        positions, pad = _positions(raw_index, kept, self.index == 12)
        fail("the padding bits of its positions must be zero", pad, where, "chunk", path)
        ascending = np.asarray((np.diff(positions, axis=1) > 0).all(axis=1))
        fail("positions must be strictly ascending", ~ascending, where, "chunk", path)
        fail(
            f"a position is outside its chunk of {length} elements",
            positions[:, -1] >= length,
            where,
            "chunk",
            path,
        )
        if self.values == "bf16":
            bits = np.ascontiguousarray(values).view("<u2")
            fail(
                "a zero value is written -0.0 (write +0.0)",
                (bits == 0x8000).any(axis=1),
                where,
                "chunk",
                path,
            )
        elif self.values == "int8":
            check_int8(records[:, :4], values.view(np.int8), where, path, "chunk")
        else:
            _check_levels(records[:, :8], values, kept, where, path)

    def finite(self, payload: Array, count: int) -> bool:
        """Scales and levels are finite by ``validate``'s rules: only bfloat16 values are
        looked at, by their exponent bits."""
        if self.values != "bf16":
            return True
        import numpy as np

        for window, length, _ in windows(self, payload, count):
            bits = np.ascontiguousarray(window[:, : self.value_nbytes(self.kept(length))])
            if ((bits.view("<u2") & 0x7F80) == 0x7F80).any():
                return False
        return True

    # -- decompression -----------------------------------------------------------------
    def read(self, buf: Array, count: int, first: int, start: int, stop: int, out: Array) -> Array:
        positions, values = self.sparse_range(buf, count, first, start, stop)
        out.fill(0.0)
        out[positions] = values
        return out

    def entries(self, buf: Array, count: int, first: int, stop: int) -> tuple[Array, Array]:
        import numpy as np

        positions: list[Array] = []
        values: list[Array] = []
        for offset, n, length, start in self.runs(count, first, stop):
            kept = self.kept(length)
            records = rows(buf, offset, n, self.record_nbytes(length))
            header = self.header_nbytes() + self.value_nbytes(kept)
            pos, _ = _positions(records[:, header:], kept, self.index == 12)
            pos += (start + length * np.arange(n, dtype=np.int64))[:, None]
            positions.append(pos.reshape(-1))
            values.append(self._values(records, kept).reshape(-1))
        if not positions:
            return np.empty(0, np.int64), np.empty(0, np.float64)
        if len(positions) == 1:
            return positions[0], values[0]
        return np.concatenate(positions), np.concatenate(values)

    def _values(self, records: Array, kept: int) -> Array:
        """The kept values of each record, exactly as float64: (n, kept)."""
        import numpy as np

        header = self.header_nbytes()
        values = records[:, header : header + self.value_nbytes(kept)]
        if self.values == "bf16":
            bits = np.ascontiguousarray(values).view("<u2").astype(np.uint32) << 16
            with np.errstate(invalid="ignore"):  # a signalling NaN widens to a quiet one
                return bits.view(np.float32).astype(np.float64)
        if self.values == "int8":
            scales = f32(records[:, :4]).astype(np.float64)
            return np.multiply(values.view(np.int8), scales, dtype=np.float64)
        levels = f32(records[:, :8]).astype(np.float64)
        codes = _codes(values)[:, :kept]
        magnitude = np.where((codes & 1) != 0, levels[:, 1:2], levels[:, 0:1])
        return np.where((codes & 2) != 0, -magnitude, magnitude)


def _check_levels(raw: Array, packed: Array, kept: int, where: int, path: str) -> None:
    """The 2-bit rules: levels finite, >= +0.0, lo <= hi, each used as it must be."""
    import numpy as np

    levels = f32(raw)
    lo, hi = levels[:, 0], levels[:, 1]
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(levels).all(axis=1) & ~np.signbit(levels).any(axis=1) & (lo <= hi)
    fail("its levels must be finite, >= +0.0 and lo <= hi", ~ok, where, "chunk", path)
    codes = _codes(packed)
    fail(
        "the padding bits of its codes must be zero",
        (codes[:, kept:] != 0).any(axis=1),
        where,
        "chunk",
        path,
    )
    codes = codes[:, :kept]
    high = (codes & 1) != 0
    uses_high = high.any(axis=1)
    fail("lo == hi, so every code uses level 0", (lo == hi) & uses_high, where, "chunk", path)
    fail(
        "lo < hi, so both levels are used",
        (lo < hi) & ~(uses_high & (~high).any(axis=1)),
        where,
        "chunk",
        path,
    )
    zero = np.where(high, hi[:, None] == 0, lo[:, None] == 0)
    fail(
        "a code of level 0.0 must have sign 0",
        (zero & ((codes & 2) != 0)).any(axis=1),
        where,
        "chunk",
        path,
    )


def _codes(packed: Array) -> Array:
    """2-bit codes, four per byte, the first in the lowest bits: (n, 4 * bytes) uint8."""
    n = packed.shape[0]
    return ((packed[:, :, None] >> _shifts2()) & 3).reshape(n, -1)


@cache
def _shifts2() -> Array:
    import numpy as np

    shifts = np.array([0, 2, 4, 6], np.uint8)
    shifts.setflags(write=False)
    return shifts


def _positions(raw: Array, kept: int, twelve: bool) -> tuple[Array, Array]:
    """Positions (n, kept) int64 from their packed bytes, and which records have pad bits set."""
    import numpy as np

    n = raw.shape[0]
    if not twelve:
        return np.ascontiguousarray(raw).view("<u2").astype(np.int64), np.zeros(n, bool)
    b = raw.astype(np.int64)
    pairs = kept // 2
    trip = b[:, : 3 * pairs].reshape(n, pairs, 3)
    out = np.empty((n, kept), np.int64)
    out[:, 0 : 2 * pairs : 2] = trip[:, :, 0] | ((trip[:, :, 1] & 0xF) << 8)
    out[:, 1 : 2 * pairs : 2] = (trip[:, :, 1] >> 4) | (trip[:, :, 2] << 4)
    if kept % 2:
        tail = b[:, 3 * pairs : 3 * pairs + 2]
        out[:, -1] = tail[:, 0] | ((tail[:, 1] & 0xF) << 8)
        return out, (tail[:, 1] >> 4) != 0
    return out, np.zeros(n, bool)
