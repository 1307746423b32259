"""A codec and its parameters (the ``codec`` map of a gradstore/2 document), and its layout.

A compressed tensor's payload is a run of records: one per element for ``bf16``/``fp16``,
one per block for ``int8``, one per chunk for ``topk`` (docs/design.md, "Compressed
updates"). Every full record has the same size, so the bytes of any range of records are
one slice of the payload, found here without reading it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..errors import InvalidDocumentError
from ._pack import map_header, pack_int, pack_str

#: Codec names, in the order the design lists them.
CODECS: Final = ("bf16", "fp16", "int8", "topk")

#: How ``topk`` writes its kept values.
VALUE_FORMATS: Final = ("bf16", "int8", "2bit")

#: Index widths ``topk`` may pack positions in, and the largest chunk each can address.
INDEX_BITS: Final = {12: 1 << 12, 16: 1 << 16}

#: The largest ``int8`` block and ``topk`` chunk.
MAX_GROUP: Final = 1 << 16

#: The parameters each codec has, in the order its map writes them (after ``name``).
PARAMS: Final[dict[str, tuple[str, ...]]] = {
    "bf16": (),
    "fp16": (),
    "int8": ("block",),
    "topk": ("chunk", "k", "index", "values"),
}

_HEADER: Final = {"bf16": 0, "int8": 4, "2bit": 8}


@dataclass(frozen=True, slots=True)
class Codec:
    """A codec with its parameters; only the ones ``PARAMS`` lists for ``name`` are set.

    Raises InvalidDocumentError (a ValueError) naming the ``$.codec`` field that is wrong.
    """

    name: str
    block: int | None = None
    chunk: int | None = None
    k: int | None = None
    index: int | None = None
    values: str | None = None

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise InvalidDocumentError(
                f"unknown codec {self.name!r}; known: {', '.join(CODECS)}", "$.codec.name"
            )
        wanted = PARAMS[self.name]
        for field in ("block", "chunk", "k", "index", "values"):
            value = getattr(self, field)
            if field not in wanted:
                if value is not None:
                    raise InvalidDocumentError(
                        f"codec {self.name} has no parameter {field!r}", f"$.codec.{field}"
                    )
            elif value is None:
                raise InvalidDocumentError(
                    f"codec {self.name} needs parameter {field!r}", f"$.codec.{field}"
                )
        if self.name == "int8":
            _int_in("block", self.block, 1, MAX_GROUP)
        elif self.name == "topk":
            _int_in("chunk", self.chunk, 1, MAX_GROUP)
            assert self.chunk is not None
            _int_in("k", self.k, 1, self.chunk)
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

    # -- naming ----------------------------------------------------------------------
    def fields(self) -> dict[str, Any]:
        """The codec map: ``name`` first, then the parameters in their order."""
        return {"name": self.name, **{p: getattr(self, p) for p in PARAMS[self.name]}}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Codec:
        """The codec a map names (key order free: round records sort keys their own way)."""
        if not isinstance(fields, Mapping):
            raise InvalidDocumentError(f"a codec is a map, got {type(fields).__name__}", "$.codec")
        name = fields.get("name")
        if not isinstance(name, str) or name not in CODECS:
            raise InvalidDocumentError(f"unknown codec {name!r:.40}", "$.codec.name")
        extra = set(fields) - {"name", *PARAMS[name]}
        if extra:
            raise InvalidDocumentError(
                f"codec {name} has no parameter {sorted(extra)[0]!r:.40}", "$.codec"
            )
        return cls(name, **{p: fields.get(p) for p in PARAMS[name]})

    def pack(self) -> bytes:
        """The canonical msgpack encoding of the codec map."""
        items = self.fields()
        out = bytearray(map_header(len(items)))
        for key, value in items.items():
            out += pack_str(key)
            out += pack_str(value) if isinstance(value, str) else pack_int(value)
        return bytes(out)

    def __str__(self) -> str:
        """The codec as a spec (``topk:chunk=4096,k=61,index=12,values=int8``)."""
        params = ",".join(f"{p}={getattr(self, p)}" for p in PARAMS[self.name])
        return f"{self.name}:{params}" if params else self.name

    # -- layout ----------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Elements per record: 1 (a cast), the ``int8`` block or the ``topk`` chunk."""
        if self.name == "int8":
            assert self.block is not None
            return self.block
        if self.name == "topk":
            assert self.chunk is not None
            return self.chunk
        return 1

    @property
    def sparse(self) -> bool:
        """Whether most elements decode to +0.0 without being stored (``topk``)."""
        return self.name == "topk"

    def kept(self, length: int) -> int:
        """``topk``: how many of a chunk's ``length`` elements it keeps: ceil(k * length / chunk)."""
        assert self.k is not None and self.chunk is not None
        return (self.k * length + self.chunk - 1) // self.chunk

    def header_nbytes(self) -> int:
        """Bytes before a record's values: a scale (int8), two levels (topk 2bit), or none."""
        if self.name == "int8":
            return 4
        if self.name == "topk":
            assert self.values is not None
            return _HEADER[self.values]
        return 0

    def value_nbytes(self, kept: int) -> int:
        """``topk``: bytes of ``kept`` values."""
        if self.values == "bf16":
            return 2 * kept
        if self.values == "int8":
            return kept
        return (kept + 3) // 4

    def index_nbytes(self, kept: int) -> int:
        """``topk``: bytes of ``kept`` positions."""
        return (3 * kept + 1) // 2 if self.index == 12 else 2 * kept

    def record_nbytes(self, length: int) -> int:
        """Bytes of the record of ``length`` elements (a whole group, or a short last one)."""
        if self.name in ("bf16", "fp16"):
            return 2 * length
        if self.name == "int8":
            return 4 + length
        kept = self.kept(length)
        return self.header_nbytes() + self.value_nbytes(kept) + self.index_nbytes(kept)

    def payload_nbytes(self, count: int) -> int:
        """Bytes of the payload of a tensor of ``count`` elements."""
        full, rest = divmod(count, self.group)
        return full * self.record_nbytes(self.group) + (self.record_nbytes(rest) if rest else 0)

    def span(self, count: int, start: int, stop: int) -> tuple[int, int, int]:
        """``(first, lo, hi)``: payload bytes ``lo..hi`` hold the records of elements
        ``start..stop``, the first of which begins at element ``first``."""
        if not 0 <= start <= stop <= count:
            raise ValueError(f"range {start}..{stop} is outside a tensor of {count} elements")
        g = self.group
        size = self.record_nbytes(g)
        first_record = start // g
        end_record = -(-stop // g)
        full = count // g
        hi = self.payload_nbytes(count) if end_record > full else end_record * size
        return first_record * g, first_record * size, hi


def _int_in(name: str, value: object, lo: int, hi: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidDocumentError(
            f"{name} must be an int from {lo} to {hi}, got {value!r:.40}", f"$.codec.{name}"
        )
