"""A compressed gradient in memory: each tensor's codec payload, decoded only when read.

Nothing is decompressed by decoding a gradstore/2 document: a ``CompressedTensor`` holds
its payload (a view into the document buffer) and decompresses ranges on request, to
float64, exactly as docs/spec.md (section 2.3) defines it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidDocumentError, LimitExceededError
from ._dtype_codes import FLOATS, ITEMSIZE
from ._dtypes import numpy_dtype
from ._gradient import Gradient, _same_meta
from ._limits import DEFAULT_LIMITS
from ._payload import payload_finite, read_range, sparse_range, validate
from .codecs import Codec

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, eq=False)
class CompressedTensor:
    """One tensor as a codec payload: ``dtype``/``shape`` are the dense tensor's it stands for.

    ``payload`` is a 1-D uint8 array of exactly ``codec.payload_nbytes(size)`` bytes.
    Build them with ``gradstore.compress``; ``encode`` checks the payload's rules.
    """

    codec: Codec
    dtype_code: str
    shape: tuple[int, ...]
    payload: Array = field(repr=False)

    def __post_init__(self) -> None:
        if self.dtype_code not in FLOATS:
            raise InvalidDocumentError(
                f"dtype {self.dtype_code!r}: only float tensors are compressed "
                f"({', '.join(FLOATS)})"
            )
        payload = np.asarray(self.payload)
        if payload.dtype != np.uint8 or payload.ndim != 1 or not payload.flags.c_contiguous:
            raise InvalidDocumentError("a payload is a contiguous 1-D uint8 array")
        want = self.codec.payload_nbytes(self.size)
        if payload.size != want:
            raise InvalidDocumentError(
                f"the payload is {payload.size} bytes; {self.codec} of {self.size} elements "
                f"needs {want}"
            )
        object.__setattr__(self, "payload", payload)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def size(self) -> int:
        """Elements of the dense tensor."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def dtype(self) -> np.dtype[Any]:
        """The dense tensor's dtype (bfloat16 and float8 need ``ml_dtypes``)."""
        dt = numpy_dtype(self.dtype_code)
        assert dt is not None
        return dt

    @property
    def nbytes(self) -> int:
        """Bytes of the payload."""
        return int(self.payload.size)

    @property
    def dense_nbytes(self) -> int:
        """Bytes of the dense tensor it stands for."""
        return self.size * ITEMSIZE[self.dtype_code]

    def read(self, start: int, stop: int, out: Array | None = None) -> Array:
        """Elements ``start..stop`` (C order) decompressed to float64."""
        first, lo, hi = self.codec.span(self.size, start, stop)
        return read_range(self.codec, self.payload[lo:hi], self.size, first, start, stop, out)

    def sparse(self, start: int, stop: int) -> tuple[Array, Array]:
        """Sparse codecs (``topk``) only: the kept entries of ``start..stop`` (positions relative to start)."""
        if not self.codec.sparse:
            raise ValueError(f"{self.codec.name} is not a sparse codec")
        first, lo, hi = self.codec.span(self.size, start, stop)
        return sparse_range(self.codec, self.payload[lo:hi], self.size, first, start, stop)

    def is_finite(self) -> bool:
        """Whether every value decompresses to a finite number (no NaN or infinity).

        Scales and levels are finite by the decoder's rules, so only bfloat16 and float16
        values are looked at, by their exponent bits, a bounded window at a time.
        """
        return payload_finite(self.codec, self.payload, self.size)

    def decompress(self) -> Array:
        """The whole tensor, float64, in its shape."""
        return self.read(0, self.size).reshape(self.shape)

    def check(self, path: str = "$") -> None:
        """Raise InvalidDocumentError unless the payload follows every rule of its codec."""
        validate(self.codec, self.payload, self.size, path)


@dataclass(eq=False)
class CompressedGradient:
    """Tensor name -> ``CompressedTensor`` (all with ``codec``), plus ``meta``."""

    codec: Codec
    tensors: dict[str, CompressedTensor]
    meta: dict[str, Any] = field(default_factory=dict)

    __hash__ = None  # type: ignore[assignment]  # mutable container

    @property
    def nbytes(self) -> int:
        """Bytes of all payloads."""
        return sum(t.nbytes for t in self.tensors.values())

    @property
    def dense_nbytes(self) -> int:
        """Bytes of the dense tensors it stands for."""
        return sum(t.dense_nbytes for t in self.tensors.values())

    def decompress(self, *, max_bytes: int = DEFAULT_LIMITS.max_bytes) -> Gradient:
        """The dense gradient, every tensor float64 (the exact decompressed values).

        Refuses (LimitExceededError) to allocate more than ``max_bytes`` of float64.
        """
        need = 8 * sum(t.size for t in self.tensors.values())
        if need > max_bytes:
            raise LimitExceededError(
                f"decompressing needs {need} bytes of float64, over max_bytes={max_bytes}",
                "max_bytes",
            )
        return Gradient({n: t.decompress() for n, t in self.tensors.items()}, dict(self.meta))

    def __eq__(self, other: object) -> bool:
        """Equal when they encode to the same document."""
        if not isinstance(other, CompressedGradient):
            return NotImplemented
        if self.codec != other.codec or self.tensors.keys() != other.tensors.keys():
            return False
        for name, a in self.tensors.items():
            b = other.tensors[name]
            if (a.codec, a.dtype_code, a.shape) != (b.codec, b.dtype_code, b.shape):
                return False
            if not np.array_equal(a.payload, b.payload):
                return False
        return _same_meta(self.meta, other.meta)

    def __repr__(self) -> str:
        parts = [
            f"{n!r}: {t.dtype_code}[{'x'.join(map(str, t.shape)) or 'scalar'}]"
            for n, t in sorted(
                self.tensors.items(), key=lambda kv: kv[0].encode("utf-8", "surrogatepass")
            )
        ]
        return (
            f"CompressedGradient(codec={self.codec}, tensors={{{', '.join(parts)}}}, "
            f"nbytes={self.nbytes}, dense_nbytes={self.dense_nbytes})"
        )
