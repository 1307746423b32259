"""Validate a whole gradstore/1 document and locate its tensors, without building arrays.

NumPy is loaded only where a tensor's bytes must be looked at (bool tensors, compressed
payloads): a dense document of numbers is read without it (``gradstore get`` to ``.npz``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from ..errors import InvalidDocumentError, LimitExceededError, MalformedDocumentError
from ._dtype_codes import DTYPES, FLOATS, ITEMSIZE
from ._layout import (
    ALIGN,
    COMPRESSED_FORMAT_ID,
    FORMAT_ID,
    KEY_CODEC,
    KEY_DATA,
    KEY_DTYPE,
    KEY_PAD,
    KEY_SHAPE,
    KEY_TENSORS,
    PREFIX,
    PREFIX2,
)
from ._limits import DEFAULT_LIMITS, Limits
from ._names import name_problem
from ._pack import pack_str
from ._paths import PathError, render
from ._unpack import ARRAY, BIN, INT, MAP, STR, Reader
from .codecs import MAX_TEXT, REGISTRY, Codec

if TYPE_CHECKING:
    import numpy as np

#: What decode/read_header take; any C-contiguous buffer (an mmap too) works at run time.
BufferLike: TypeAlias = "bytes | bytearray | memoryview | np.ndarray[Any, Any]"

NOT_A_DOCUMENT: Final = f"not a {FORMAT_ID} document"
"""How a refusal of bytes that are not a document at all begins."""

NOT_A_COMPRESSED_DOCUMENT: Final = f"not a {COMPRESSED_FORMAT_ID} document"
"""The same for a map of four keys: what a compressed document would be."""

_MAX_DTYPE_LEN: Final = max(len(s) for s in DTYPES)
_ZEROS: Final = bytes(ALIGN)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where one tensor lives: ``nbytes`` bytes of ``dtype`` data at document ``offset``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def array_dtype(self) -> np.dtype[Any]:
        """The NumPy dtype of the tensor's elements."""
        from ._dtypes import numpy_dtype

        dt = numpy_dtype(self.dtype)
        assert dt is not None, self.dtype  # a header only holds allowed dtypes
        return dt


@dataclass(frozen=True, slots=True)
class DocumentHeader:
    """Everything in a document except the tensor data itself."""

    meta: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    size: int
    codec: Codec | None = None  # a compressed document's (gradstore/2); tensors' data are payloads

    @property
    def format(self) -> str:
        """``gradstore/1`` (dense) or ``gradstore/2`` (compressed)."""
        return FORMAT_ID if self.codec is None else COMPRESSED_FORMAT_ID


def byte_view(buf: object) -> memoryview:
    """A flat format-'B' view of a C-contiguous buffer (bytes, bytearray, ndarray, mmap...)."""
    try:
        mv = memoryview(buf)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"expected a bytes-like buffer, got {type(buf).__name__}") from None
    if not mv.c_contiguous:
        raise TypeError("the buffer must be C-contiguous")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def read_header(buf: BufferLike, limits: Limits = DEFAULT_LIMITS) -> DocumentHeader:
    """Validate the whole document (every structural and canonical rule) and return its header.

    Tensor data is only looked at for ``|b1`` tensors (bytes must be 0 or 1).
    Raises MalformedDocumentError (offset), InvalidDocumentError (path) or
    LimitExceededError; nothing is allocated from a declared size before it is checked.
    """
    return walk(byte_view(buf), limits)


def walk(mv: memoryview, limits: Limits) -> DocumentHeader:
    """read_header on a format-'B' memoryview."""
    size = mv.nbytes
    if size > limits.max_bytes:
        raise LimitExceededError(
            f"document is {size} bytes, over max_bytes={limits.max_bytes}", "max_bytes"
        )
    if size and mv[0] != PREFIX[0] and Reader(mv, 0, size).head()[0] is not MAP:
        raise InvalidDocumentError(
            f"{NOT_A_DOCUMENT} (it would begin with a msgpack map of format, meta, tensors; "
            f"this begins with {_first_bytes(mv)})",
            "$",
        )
    r = Reader(mv, 0, size)
    meta, codec, count = read_head(r, limits)
    infos: list[TensorInfo] = []
    prev = b""
    elements = 0
    dense = 0  # bytes of the dense tensors a compressed document stands for
    for i in range(count):
        info, prev, n = _read_tensor(
            r, i, prev, limits, limits.max_elements - elements, codec, limits.max_bytes - dense
        )
        elements += n
        dense += n * ITEMSIZE[info.dtype]
        infos.append(info)
    if r.pos != size:
        raise MalformedDocumentError(f"{size - r.pos} trailing bytes after the document", r.pos)
    return DocumentHeader(meta, tuple(infos), size, codec)


def read_head(r: Reader, limits: Limits) -> tuple[dict[str, Any], Codec | None, int]:
    """A document's meta, codec (None: gradstore/1) and declared tensor count, read from
    ``r`` at the document's start; ``r`` is left at the first tensor."""
    mv = r.buf
    size = r.end
    compressed = size > 0 and mv[0] == PREFIX2[0]
    lead = f"{NOT_A_COMPRESSED_DOCUMENT if compressed else NOT_A_DOCUMENT}: "
    if compressed:
        r.take(1)
    else:
        _expect(r, PREFIX[:1], _WANT_MAP, "$", lead=lead)
    _expect(r, PREFIX[1:8], "key 'format' first", "$", lead=lead)
    if compressed:
        if mv[r.pos : r.pos + 12] == PREFIX[8:20]:
            raise InvalidDocumentError(
                f"{NOT_A_DOCUMENT}: expected {_WANT_MAP}, found map of 4", "$"
            )
        _expect(r, PREFIX2[8:20], f"format {COMPRESSED_FORMAT_ID!r}", "$.format", lead=lead)
    else:
        _expect(r, PREFIX[8:20], f"format {FORMAT_ID!r}", "$.format", lead=lead)
    _expect(r, PREFIX[20:], "key 'meta' second", "$", lead=lead)
    meta = _read_meta(r, limits)
    codec = None
    if compressed:
        _expect(r, KEY_CODEC, "key 'codec' third", "$")
        codec = _read_codec(r)
        _expect(r, KEY_TENSORS, "key 'tensors' fourth", "$")
    else:
        _expect(r, KEY_TENSORS, "key 'tensors' third", "$")

    kind, count = r.head()
    if kind is not ARRAY:
        raise InvalidDocumentError(f"tensors must be an array, found {kind}", "$.tensors")
    if count > limits.max_tensors:
        raise LimitExceededError(
            f"document declares {count} tensors, over max_tensors={limits.max_tensors}",
            "max_tensors",
        )
    return meta, codec, count


def _read_meta(r: Reader, limits: Limits) -> dict[str, Any]:
    end = r.pos + limits.max_meta_bytes
    bounded = end < r.end
    m = Reader(
        r.buf,
        r.pos,
        end if bounded else r.end,
        f"meta is over max_meta_bytes={limits.max_meta_bytes}" if bounded else None,
    )
    try:
        kind, count = m.head()
        if kind is not MAP:
            raise PathError(f"meta must be a map, found {kind}")
        meta = m.map_body(count, 0, limits.max_meta_depth)
    except PathError as e:
        raise InvalidDocumentError(e.message, render("$.meta", e.segments)) from None
    r.pos = m.pos
    return meta


_WANT_MAP: Final = (
    "a map of exactly the keys format, meta, tensors (or format, meta, codec, tensors)"
)


def _read_codec(r: Reader) -> Codec:
    """The codec map: ``name`` first, then that codec's parameters in their order."""
    kind, count = r.head()
    if kind is not MAP:
        raise InvalidDocumentError(f"codec must be a map, found {kind}", "$.codec")
    _expect(r, pack_str("name"), "key 'name' first", "$.codec")
    name = _codec_text(r, "name")
    cls = REGISTRY.get(name)
    if cls is None:
        raise InvalidDocumentError(
            f"unknown codec {name!r}; known: {', '.join(REGISTRY)}", "$.codec.name"
        )
    params = cls.params()
    if count != 1 + len(params):
        raise InvalidDocumentError(
            f"codec {name} is a map of the keys {', '.join(('name', *params))}, found {count} keys",
            "$.codec",
        )
    values: dict[str, Any] = {}
    for param in params:
        _expect(r, pack_str(param), f"key {param!r} next", "$.codec")
        if param in cls.text_params:
            values[param] = _codec_text(r, param)
            continue
        kind, arg = r.head()
        if kind is not INT:
            raise InvalidDocumentError(f"{param} must be an int, found {kind}", f"$.codec.{param}")
        values[param] = arg
    return cls(**values)  # range checks: InvalidDocumentError at $.codec.<param>


def _codec_text(r: Reader, key: str) -> str:
    kind, n = r.head()
    if kind is not STR:
        raise InvalidDocumentError(f"{key} must be a str, found {kind}", f"$.codec.{key}")
    if n > MAX_TEXT:
        raise InvalidDocumentError(f"unknown {key} (a {n}-byte str)", f"$.codec.{key}")
    return r.text(n)


_TENSOR_START: Final = b"\x85" + pack_str("name")
_DTYPE_BY_RAW: Final = {s.encode(): s for s in DTYPES}


def _read_tensor(
    r: Reader,
    i: int,
    prev: bytes,
    limits: Limits,
    elements_left: int,
    codec: Codec | None = None,
    dense_left: int = 0,
    check_data: bool = True,
) -> tuple[TensorInfo, bytes, int]:
    """One tensor map; returns its info, its raw name, and its element count.

    With a ``codec`` (gradstore/2) the data is that codec's payload for the dtype and shape,
    and the dense bytes they stand for must be within ``dense_left``. Without ``check_data``
    the data bytes are not looked at (bool bytes, payloads): ``r`` may not hold them."""
    _expect(r, _TENSOR_START[:1], "a map of keys name, dtype, shape, pad, data", tensor=i)
    _expect(r, _TENSOR_START[1:], "key 'name' first", tensor=i)
    kind, n = r.head()
    if kind is not STR:
        raise InvalidDocumentError(f"name must be a str, found {kind}", f"$.tensors[{i}].name")
    if n == 0:
        raise InvalidDocumentError("name must not be empty", f"$.tensors[{i}].name")
    if n > limits.max_name_bytes:
        raise LimitExceededError(
            f"tensor {i} name is {n} bytes, over max_name_bytes={limits.max_name_bytes}",
            "max_name_bytes",
        )
    at = r.pos
    name = r.text(n)
    raw = bytes(r.buf[at : at + n])
    problem = name_problem(name)
    if problem is not None:
        raise InvalidDocumentError(f"tensor name {name!r} {problem}", f"$.tensors[{i}].name")
    if raw <= prev:
        word = "duplicate name" if raw == prev else "names not sorted by UTF-8 bytes at"
        raise InvalidDocumentError(f"{word} {name!r}", f"$.tensors[{i}].name")

    _expect(r, KEY_DTYPE, "key 'dtype' second", tensor=i)
    kind, n = r.head()
    if kind is not STR:
        raise InvalidDocumentError(f"dtype must be a str, found {kind}", f"$.tensors[{i}].dtype")
    if n > _MAX_DTYPE_LEN:
        raise InvalidDocumentError(f"unknown dtype (a {n}-byte str)", f"$.tensors[{i}].dtype")
    dtype_text = r.text(n)
    dtype = _DTYPE_BY_RAW.get(dtype_text.encode())
    if dtype is None:
        raise InvalidDocumentError(
            f"unknown dtype {dtype_text!r}; allowed: {' '.join(DTYPES)}", f"$.tensors[{i}].dtype"
        )
    if codec is not None and dtype not in FLOATS:
        raise InvalidDocumentError(
            f"dtype {dtype}: only float tensors are compressed ({' '.join(FLOATS)})",
            f"$.tensors[{i}].dtype",
        )

    _expect(r, KEY_SHAPE, "key 'shape' third", tensor=i)
    kind, rank = r.head()
    if kind is not ARRAY:
        raise InvalidDocumentError(f"shape must be an array, found {kind}", f"$.tensors[{i}].shape")
    if rank > limits.max_rank:
        raise LimitExceededError(
            f"tensor {name!r} has rank {rank}, over max_rank={limits.max_rank}", "max_rank"
        )
    dims = []
    count = 1
    extent = 1  # product of the non-zero dimensions
    for j in range(rank):
        kind, d = r.head()
        if kind is not INT or d < 0:
            what = kind if kind is not INT else f"negative {d}"
            raise InvalidDocumentError(
                f"dimensions must be non-negative ints, found {what}", f"$.tensors[{i}].shape[{j}]"
            )
        count *= d
        extent *= max(d, 1)
        if extent > limits.max_elements:
            raise LimitExceededError(
                f"tensor {name!r} declares dimensions over max_elements={limits.max_elements}",
                "max_elements",
            )
        dims.append(d)
    if count > elements_left:
        raise LimitExceededError(
            f"tensor {name!r} declares {count} elements; the document would pass "
            f"max_elements={limits.max_elements}",
            "max_elements",
        )
    if codec is not None and count * ITEMSIZE[dtype] > dense_left:
        raise LimitExceededError(
            f"tensor {name!r} stands for {count * ITEMSIZE[dtype]} dense bytes; the document "
            f"would stand for more than max_bytes={limits.max_bytes}",
            "max_bytes",
        )

    _expect(r, KEY_PAD, "key 'pad' fourth", tensor=i)
    kind, pad = r.head()
    if kind is not BIN:
        raise InvalidDocumentError(f"pad must be a bin, found {kind}", f"$.tensors[{i}].pad")
    if pad >= ALIGN:
        raise InvalidDocumentError(
            f"pad is {pad} bytes, at most {ALIGN - 1}", f"$.tensors[{i}].pad"
        )
    at = r.take(pad)
    if r.buf[at : at + pad] != _ZEROS[:pad]:
        raise InvalidDocumentError("pad bytes must be zero", f"$.tensors[{i}].pad")

    _expect(r, KEY_DATA, "key 'data' last", tensor=i)
    kind, nbytes = r.head()
    if kind is not BIN:
        raise InvalidDocumentError(f"data must be a bin, found {kind}", f"$.tensors[{i}].data")
    offset = r.pos
    if offset % ALIGN:
        want = (pad - offset) % ALIGN
        raise InvalidDocumentError(
            f"pad is {pad} bytes, so data starts at offset {offset}; {want} bytes puts it "
            f"at a multiple of {ALIGN}",
            f"$.tensors[{i}].pad",
        )
    if codec is None:
        want = count * ITEMSIZE[dtype]
        what = f"shape {tuple(dims)} of {dtype}"
    else:
        want = codec.payload_nbytes(count)
        what = f"{codec} of {count} elements"
    if nbytes != want:
        raise InvalidDocumentError(
            f"data is {nbytes} bytes; {what} needs {want}", f"$.tensors[{i}].data"
        )
    r.take(nbytes)
    if not check_data:
        return TensorInfo(name, dtype, tuple(dims), offset, nbytes), raw, count
    if codec is not None:
        import numpy as np

        from ._payload import validate

        payload = np.frombuffer(r.buf, np.uint8, nbytes, offset)
        validate(codec, payload, count, f"$.tensors[{i}].data")
    if dtype == "|b1" and nbytes:
        import numpy as np

        if np.max(np.frombuffer(r.buf, np.uint8, nbytes, offset)) > 1:
            raise InvalidDocumentError("bool bytes must be 0 or 1", f"$.tensors[{i}].data")
    return TensorInfo(name, dtype, tuple(dims), offset, nbytes), raw, count


def _first_bytes(mv: memoryview, n: int = 8) -> str:
    """``68 65 6c 6c 6f ("hello")``: hex, and the printable ASCII (others as ``.``)."""
    head = bytes(mv[:n])
    text = "".join(chr(b) if 0x20 <= b < 0x7F else "." for b in head)
    return f"{head.hex(' ')} ({text!r}{'...' if mv.nbytes > n else ''})"


def _expect(
    r: Reader, raw: bytes, wanted: str, path: str = "$", tensor: int = -1, lead: str = ""
) -> None:
    """Consume exactly ``raw`` or explain what is there instead (at ``path``, or the tensor's)."""
    start = r.pos
    stop = start + len(raw)
    if stop <= r.end and r.buf[start:stop] == raw:
        r.pos = stop
        return
    kind, arg = r.head()  # malformed or truncated bytes raise here, with their offset
    if kind is STR:
        at = r.take(min(arg, 64))
        found = repr(str(r.buf[at : r.pos], "utf-8", "replace"))
    elif kind is MAP or kind is ARRAY:
        found = f"{kind} of {arg}"
    else:
        found = kind if arg is None else f"{kind} {arg!r}"
    if tensor >= 0:
        path = f"$.tensors[{tensor}]"
    raise InvalidDocumentError(f"{lead}expected {wanted}, found {found}", path)
