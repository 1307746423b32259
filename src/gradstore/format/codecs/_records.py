"""What the codecs' payload methods share: records as NumPy rows, a bounded window of them
at a time, float32 fields, and the error naming the first bad record.

NumPy is imported only inside ``f32``: these work on arrays they are given, so the codec
modules import this at their top and still load no NumPy to name a codec.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ...errors import InvalidDocumentError

if TYPE_CHECKING:
    import numpy as np

    from .base import Codec

    Array = np.ndarray[Any, Any]

#: Payload bytes checked at a time, so what the checks hold stays bounded whatever the
#: document's size (checked whole, a topk payload cost up to 16 times its size at once).
CHECK_WINDOW: Final = 1 << 20

#: The most ``validate`` holds beside a payload: up to ~16 bytes per byte of its window (a
#: 12-bit position of 1.5 bytes unpacks to 8 bytes of int64, then to its difference).
CHECK_SCRATCH_BYTES: Final = 20 * CHECK_WINDOW

#: The smallest normal float32 (2^-126): a non-zero scale is at least this.
MIN_NORMAL32: Final = float.fromhex("0x1p-126")


def rows(buf: Array, offset: int, n: int, size: int) -> Array:
    """``n`` records of ``size`` bytes from ``offset``: an (n, size) uint8 view."""
    return buf[offset : offset + n * size].reshape(n, size)


def f32(raw: Array) -> Array:
    """Little-endian float32s from an (n, 4m) uint8 view."""
    import numpy as np

    return np.ascontiguousarray(raw).view("<f4")


def windows(codec: Codec, payload: Array, count: int) -> Iterator[tuple[Array, int, int]]:
    """``(rows, elements per record, index of the first record)``: the payload's records,
    at most ``CHECK_WINDOW`` bytes of them at a time (at least one)."""
    for offset, n, length, first in codec.runs(count, 0, count):
        size = codec.record_nbytes(length)
        step = max(1, CHECK_WINDOW // size)
        for lo in range(0, n, step):
            yield (
                rows(payload, offset + lo * size, min(step, n - lo), size),
                length,
                (first // codec.group + lo),
            )


def fail(message: str, bad: Array, where: int, what: str, path: str) -> None:
    """Raise for the first True of ``bad`` (one per record), if any."""
    if bad.any():
        index = where + int(bad.argmax())
        raise InvalidDocumentError(f"{what} {index}: {message}", path)
