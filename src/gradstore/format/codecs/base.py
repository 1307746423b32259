"""What every codec is: a name, its parameters, its record layout, its payload's rules.

A codec is one small frozen class per module (``cast``, ``int8``, ``topk``), as the
aggregation methods are: it checks its own parameters, says how many bytes a record of
its elements takes, checks a payload and decompresses ranges of it, and parses its part
of a ``--compress`` spec. The document reader, the decoder and the stores never branch on
a codec's name; they ask the codec. A concrete class (one with a ``name``) registers
itself when its module is imported: ``Codec("topk", chunk=...)`` builds a ``TopK``.

A compressed tensor's payload is a run of records, every full one the same size, so the
bytes of any range of records are one slice of the payload, found here without reading
it (docs/spec.md, section 2.3). Nothing here imports NumPy: a codec is named
(a header, a round record) without it, and only its payload methods load it.
"""

from __future__ import annotations

import dataclasses
from abc import ABCMeta
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ...errors import CompressionError, InvalidDocumentError
from .._pack import map_header, pack_int, pack_str

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]

#: The largest ``int8`` block and ``topk`` chunk.
MAX_GROUP: Final = 1 << 16

#: Elements per int8 block and per top-k chunk unless the spec says otherwise.
DEFAULT_GROUP: Final = 4096

#: The longest codec name or text parameter a document may hold (the header reader refuses
#: a longer one before reading it).
MAX_TEXT: Final = 8

_REGISTERED: dict[str, type[Codec]] = {}


class _ByName(ABCMeta):
    """``Codec(name, **params)`` builds the registered codec of that name."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is Codec:
            if not args and "name" in kwargs:
                args = (kwargs.pop("name"),)
            return _named(*args, **kwargs)
        return super().__call__(*args, **kwargs)


@dataclass(frozen=True)
class Codec(metaclass=_ByName):
    """A codec with its parameters (the ``codec`` map of a gradstore/2 document).

    ``Codec("int8", block=4096)`` is ``Int8(block=4096)``. Raises InvalidDocumentError (a
    ValueError) naming the ``$.codec`` field that is wrong.

    A codec class is a frozen dataclass whose fields are its parameters (checked in its
    ``__post_init__``), with a ``name``, ``spec_help`` and ``spec_example``, and its own
    ``from_spec``, ``group``, ``record_nbytes``, ``validate``, ``finite``, ``read`` (and
    ``entries`` if ``sparse``).
    """

    #: The name documents, round records and specs use.
    name: ClassVar[str]
    #: Parameters that are text, not ints (the header reader reads them so).
    text_params: ClassVar[frozenset[str]] = frozenset()
    #: Whether most elements decode to +0.0 without being stored (``entries`` works).
    sparse: ClassVar[bool] = False
    #: How a spec names it, for help texts (``int8[:BLOCK]``).
    spec_help: ClassVar[str]
    #: A spec of it, for examples and tests.
    spec_example: ClassVar[str]

    if TYPE_CHECKING:  # ``Codec(name, **params)``, or a codec class's own parameters

        def __init__(self, name: str = "", /, **params: Any) -> None: ...

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            other = _REGISTERED.get(name)
            if other is not None and _where(other) != _where(cls):  # (not a module reload)
                raise TypeError(f"two codecs are named {name!r}: {other} and {cls}")
            _REGISTERED[name] = cls

    # -- naming ----------------------------------------------------------------------
    @classmethod
    def params(cls) -> tuple[str, ...]:
        """Its parameters, in the order its map writes them (after ``name``)."""
        return _params(cls)

    def fields(self) -> dict[str, Any]:
        """The codec map: ``name`` first, then the parameters in their order."""
        return {"name": self.name, **{p: getattr(self, p) for p in self.params()}}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> Codec:
        """The codec a map names (key order free: round records sort keys their own way)."""
        if not isinstance(fields, Mapping):
            raise InvalidDocumentError(f"a codec is a map, got {type(fields).__name__}", "$.codec")
        name = fields.get("name")
        found = _REGISTERED.get(name) if isinstance(name, str) else None
        if found is None:
            raise InvalidDocumentError(f"unknown codec {name!r:.40}", "$.codec.name")
        extra = set(fields) - {"name", *found.params()}
        if extra:
            raise InvalidDocumentError(
                f"codec {name} has no parameter {sorted(extra)[0]!r:.40}", "$.codec"
            )
        return _named(name, **{p: fields.get(p) for p in found.params()})

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
        params = ",".join(f"{p}={getattr(self, p)}" for p in self.params())
        return f"{self.name}:{params}" if params else self.name

    @classmethod
    def from_spec(cls, spec: str, argument: str | None, options: Mapping[str, str]) -> Codec:
        """The codec ``spec`` names, from its ``argument`` (``int8:256``'s 256) and its
        ``KEY=VALUE`` options (keys among ``params()``, each once: ``parse_spec`` checks).
        CompressionError for what the codec cannot take; InvalidDocumentError from a
        parameter's range check, which ``parse_spec`` words as a CompressionError."""
        raise NotImplementedError(f"{cls.__name__} parses no spec")

    # -- layout ----------------------------------------------------------------------
    @property
    def group(self) -> int:
        """Elements per record (a short last record may hold fewer)."""
        raise NotImplementedError(f"{type(self).__name__} has no layout")

    def record_nbytes(self, length: int) -> int:
        """Bytes of the record of ``length`` elements (a whole group, or a short last one)."""
        raise NotImplementedError(f"{type(self).__name__} has no layout")

    def payload_nbytes(self, count: int) -> int:
        """Bytes of the payload of a tensor of ``count`` elements."""
        full, rest = divmod(count, self.group)
        return full * self.record_nbytes(self.group) + (self.record_nbytes(rest) if rest else 0)

    def kept_elements(self, count: int) -> int:
        """How many of a tensor's ``count`` elements its payload holds: every one, but for a
        sparse codec (top-k: the ones it kept; the others decompress to +0.0)."""
        return count

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

    def runs(self, count: int, first: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
        """``(byte offset, records, elements per record, first element)`` of the runs of equal
        records that hold elements ``first..stop`` (``first`` at a record boundary)."""
        g = self.group
        full_end = count // g * g
        end = min(count, -(-stop // g) * g)
        offset = 0
        if first < min(end, full_end):
            n = (min(end, full_end) - first) // g
            yield offset, n, g, first
            offset += n * self.record_nbytes(g)
        if end > full_end and count > full_end:
            yield offset, 1, count - full_end, full_end

    # -- payload ---------------------------------------------------------------------
    def validate(self, payload: Array, count: int, path: str) -> None:
        """Every rule the design sets for this codec's payload of ``count`` elements.

        ``payload`` is a 1-D uint8 array of exactly ``payload_nbytes(count)`` bytes,
        checked a bounded window at a time (``CHECK_WINDOW``). Raises InvalidDocumentError
        at ``path`` naming the first record that breaks one.
        """
        raise NotImplementedError(f"{type(self).__name__} checks no payload")

    def finite(self, payload: Array, count: int) -> bool:
        """Whether every value of a valid payload decompresses to a finite number."""
        raise NotImplementedError(f"{type(self).__name__} checks no payload")

    def read(self, buf: Array, count: int, first: int, start: int, stop: int, out: Array) -> Array:
        """Elements ``start..stop`` decompressed to float64 into ``out`` (and returned);
        ``buf`` holds the records from element ``first`` on (``span``)."""
        raise NotImplementedError(f"{type(self).__name__} decompresses nothing")

    def entries(self, buf: Array, count: int, first: int, stop: int) -> tuple[Array, Array]:
        """Sparse codecs: the kept ``(positions, values)`` of the records from element
        ``first`` (where ``buf``, a ``span`` slice, starts) up to the one holding
        ``stop - 1``: positions absolute, ascending, int64; values float64."""
        raise ValueError(f"{self.name} is not a sparse codec")

    def sparse_range(
        self, buf: Array, count: int, first: int, start: int, stop: int
    ) -> tuple[Array, Array]:
        """Sparse codecs: the kept entries of elements ``start..stop``: positions relative to
        ``start`` (int64, ascending) and float64 values."""
        positions, values = self.entries(buf, count, first, stop)
        if first < start or (positions.size and positions[-1] >= stop):
            keep = (positions >= start) & (positions < stop)
            positions, values = positions[keep], values[keep]
        return positions - start, values


@cache
def _params(cls: type[Codec]) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def registered() -> Mapping[str, type[Codec]]:
    """Every codec whose module is imported, by name, in the order they were defined."""
    return _REGISTERED


def _named(name: object, /, **params: object) -> Codec:
    """The codec ``name`` with ``params``: each of its parameters set, no other one."""
    found = _REGISTERED.get(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidDocumentError(
            f"unknown codec {name!r}; known: {', '.join(_REGISTERED)}", "$.codec.name"
        )
    every = dict.fromkeys(p for cls in _REGISTERED.values() for p in cls.params())
    unknown = set(params) - set(every)
    if unknown:
        raise TypeError(f"Codec() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    own = found.params()
    for param in every:
        value = params.get(param)
        if param not in own:
            if value is not None:
                raise InvalidDocumentError(
                    f"codec {name} has no parameter {param!r}", f"$.codec.{param}"
                )
        elif value is None:
            raise InvalidDocumentError(
                f"codec {name} needs parameter {param!r}", f"$.codec.{param}"
            )
    return found(**{p: params[p] for p in own})


def int_in(name: str, value: object, lo: int, hi: int) -> None:
    """InvalidDocumentError at ``$.codec.<name>`` unless ``value`` is an int in ``lo..hi``."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidDocumentError(
            f"{name} must be an int from {lo} to {hi}, got {value!r:.40}", f"$.codec.{name}"
        )


def spec_int(spec: str, key: str, text: str | None, default: int) -> int:
    """A spec's whole-number option (``default`` when absent); CompressionError if not one."""
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise CompressionError(f"{spec!r}: {key} must be a whole number, got {text!r}") from None
