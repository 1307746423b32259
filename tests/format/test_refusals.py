"""Every way a byte string can fail to be a canonical gradstore/1 document, with its typed error."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest

from gradstore.errors import FormatError, InvalidDocumentError, MalformedDocumentError
from gradstore.format import Gradient, decode, encode, read_header


def _valid() -> bytes:
    g = Gradient({"a": np.arange(3, dtype="<f4"), "b": np.ones((2, 2), "<i8")}, {"round": 1})
    return encode(g).tobytes()


def _malformed(buf: bytes, offset: int | None = None) -> MalformedDocumentError:
    for fn in (read_header, decode):
        with pytest.raises(MalformedDocumentError) as info:
            fn(buf)
        if offset is not None:
            assert info.value.offset == offset, info.value
    return info.value


def _invalid(buf: bytes, path: str) -> InvalidDocumentError:
    for fn in (read_header, decode):
        with pytest.raises(InvalidDocumentError) as info:
            fn(buf)
        assert info.value.path == path, info.value
    return info.value


# --- not well formed / not canonical: MalformedDocumentError(offset) -------------------


def test_errors_are_value_errors_with_locations_in_the_message() -> None:
    e = _malformed(_valid() + b"\x00")
    assert isinstance(e, FormatError) and isinstance(e, ValueError)
    assert "at byte" in str(e)


def test_empty_and_truncated_documents() -> None:
    doc = _valid()
    _malformed(b"", 0)
    for cut in (1, 5, 30, 60, len(doc) - 1):
        e = _malformed(doc[:cut])
        assert e.offset is not None and e.offset <= cut
        assert "truncated" in str(e)


def test_trailing_bytes() -> None:
    doc = _valid()
    e = _malformed(doc + b"\xc0", len(doc))
    assert "trailing" in str(e)
    _malformed(doc + doc, len(doc))


def test_non_minimal_container_and_str_lengths(docs: Any) -> None:
    doc = docs.build()
    _malformed(b"\xde\x00\x03" + doc[1:], 0)  # map16 holding 3
    _malformed(b"\xdf\x00\x00\x00\x03" + doc[1:], 0)  # map32 holding 3
    _malformed(b"\x83\xd9\x06format" + doc[8:], 1)  # str8 holding 6
    _malformed(b"\x83\xda\x00\x06format" + doc[8:], 1)  # str16 holding 6
    _malformed(b"\x83\xdb\x00\x00\x00\x06format" + doc[8:], 1)  # str32 holding 6
    _malformed(docs.build(meta=docs.Raw(b"\xde\x00\x00")), 25)  # map16 meta of 0 keys
    tensors = docs.Raw(b"\xdc\x00\x00")  # array16 holding 0
    _malformed(docs.build(top=[("format", "gradstore/1"), ("meta", {}), ("tensors", tensors)]), 34)


def test_non_minimal_bin_lengths(docs: Any) -> None:
    data = docs.Raw(b"\xc5\x00\x08" + bytes(8), head=3)  # bin16 holding 8
    e = _malformed(docs.build(tensors=[docs.tensor(data=data)]))
    assert "bin16" in str(e)
    pad = docs.Raw(b"\xc5\x00\x00")  # bin16 holding 0
    _malformed(docs.build(tensors=[docs.tensor(pad=pad)]))


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        (b"\xcc\x05", "uint8"),
        (b"\xcd\x00\x05", "uint16"),
        (b"\xce\x00\x00\x00\x05", "uint32"),
        (b"\xcf\x00\x00\x00\x00\x00\x00\x00\x05", "uint64"),
        (b"\xcd\x00\xff", "uint16"),
        (b"\xd0\x05", "int8"),  # msgpack writes non-negative ints unsigned
        (b"\xd0\xe0", "int8"),  # -32 is a negative fixint
        (b"\xd1\xff\x80", "int16"),
        (b"\xd2\xff\xff\x80\x00", "int32"),
        (b"\xd3\xff\xff\xff\xff\x80\x00\x00\x00", "int64"),
    ],
)
def test_non_minimal_ints(docs: Any, raw: bytes, name: str) -> None:
    e = _malformed(docs.build(meta={"k": docs.Raw(raw)}), 28)
    assert name in str(e)
    # and in a shape
    doc = docs.build(tensors=[docs.tensor(shape=[docs.Raw(raw)], data=bytes(20))])
    _malformed(doc)


def test_float32_in_meta_is_refused(docs: Any) -> None:
    doc = docs.build(meta={"lr": docs.Raw(b"\xca" + struct.pack(">f", 0.5))})
    e = _malformed(doc, 29)
    assert "float32" in str(e)
    ok = docs.build(meta={"lr": 0.5})  # the float64 form decodes
    assert decode(ok).meta == {"lr": 0.5}


@pytest.mark.parametrize(
    "raw", [b"\xd4\x01\x00", b"\xc7\x01\x05\x00", b"\xd6\xff" + bytes(4), b"\xc1"]
)
def test_ext_types_and_the_unused_byte_are_refused(docs: Any, raw: bytes) -> None:
    _malformed(docs.build(meta={"x": docs.Raw(raw)}), 28)


def test_invalid_utf8_is_malformed(docs: Any) -> None:
    _malformed(docs.build(tensors=[docs.tensor(name=docs.Raw(b"\xa2\xc3\x28"))]), 42)
    _malformed(docs.build(meta={"k": docs.Raw(b"\xa1\xff")}), 29)
    _malformed(docs.build(meta={docs.Raw(b"\xa1\xff"): 1}))
    # a lone surrogate, encoded, is not UTF-8 either
    _malformed(docs.build(meta={"k": docs.Raw(b"\xa3\xed\xa0\x80")}), 29)


# --- well formed but wrong: InvalidDocumentError(path) ----------------------------------


def test_top_level_keys_exact_and_in_order(docs: Any) -> None:
    t = [docs.tensor()]
    base = [("format", "gradstore/1"), ("meta", {}), ("tensors", t)]
    _invalid(docs.build(top=[base[1], base[0], base[2]]), "$")
    _invalid(docs.build(top=[base[0], base[2], base[1]]), "$")
    _invalid(docs.build(top=base[:2]), "$")
    _invalid(docs.build(top=[*base, ("extra", 1)]), "$")
    _invalid(docs.build(top=[("Format", "gradstore/1"), base[1], base[2]]), "$")
    _invalid(msgpack.packb([1, 2, 3]), "$")
    _invalid(msgpack.packb("gradstore/1"), "$")


def test_wrong_format_id(docs: Any) -> None:
    e = _invalid(
        docs.build(top=[("format", "gradstore/2"), ("meta", {}), ("tensors", [])]), "$.format"
    )
    assert "gradstore/2" in str(e)
    _invalid(docs.build(top=[("format", 1), ("meta", {}), ("tensors", [])]), "$.format")


def test_meta_must_be_a_map_with_sorted_str_keys(docs: Any) -> None:
    _invalid(docs.build(meta=[1, 2]), "$.meta")
    _invalid(docs.build(meta=docs.Raw(b"\xc0")), "$.meta")  # nil
    _invalid(docs.build(meta={"b": 1, "a": 2}), "$.meta")
    e = _invalid(docs.build(meta={"a": 1, docs.Raw(b"\xa1a"): 2}), "$.meta")
    assert "duplicate" in str(e)
    _invalid(docs.build(meta={"n": {"y": 1, "x": 2}}), "$.meta.n")
    _invalid(docs.build(meta={"l": [0, {"y": 1, "x": 2}]}), "$.meta.l[1]")
    _invalid(docs.build(meta={docs.Raw(b"\x01"): 1}), "$.meta")
    # UTF-8 byte order, not code-point-of-UTF-16 or locale order: "é" (c3 a9) after "z"
    assert decode(docs.build(meta={"z": 1, "é": 2})).meta == {"z": 1, "é": 2}
    _invalid(docs.build(meta={"é": 2, "z": 1}), "$.meta")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_meta_nan_and_infinities_are_refused(docs: Any, value: float) -> None:
    _invalid(docs.build(meta={"lr": value}), "$.meta.lr")
    _invalid(docs.build(meta={"h": [1.0, value]}), "$.meta.h[1]")
    _invalid(docs.build(meta={"odd key": {"x": value}}), '$.meta["odd key"].x')


def test_tensors_must_be_an_array_of_canonical_maps(docs: Any) -> None:
    top = [("format", "gradstore/1"), ("meta", {})]
    _invalid(docs.build(top=[*top, ("tensors", {"w": 1})]), "$.tensors")
    _invalid(docs.build(top=[*top, ("tensors", docs.Raw(b"\xc0"))]), "$.tensors")
    _invalid(docs.build(tensors=[[]]), "$.tensors[0]")
    t = docs.tensor()
    for order in ([1, 0, 2, 3, 4], [0, 2, 1, 3, 4], [0, 1, 2, 4, 3], [0, 1, 2, 3]):
        _invalid(docs.build(tensors=[[t[i] for i in order]]), "$.tensors[0]")
    _invalid(docs.build(tensors=[[*t, ("extra", 1)]]), "$.tensors[0]")
    _invalid(docs.build(tensors=[docs.tensor(), 5]), "$.tensors[1]")


def test_names_sorted_unique_non_empty(docs: Any) -> None:
    _invalid(docs.build(tensors=[docs.tensor("b"), docs.tensor("a")]), "$.tensors[1].name")
    e = _invalid(docs.build(tensors=[docs.tensor("a"), docs.tensor("a")]), "$.tensors[1].name")
    assert "duplicate" in str(e)
    _invalid(docs.build(tensors=[docs.tensor("")]), "$.tensors[0].name")
    _invalid(docs.build(tensors=[docs.tensor(b"w")]), "$.tensors[0].name")
    _invalid(docs.build(tensors=[docs.tensor(7)]), "$.tensors[0].name")
    names = ["a", "b", "c", "e", "d"]
    _invalid(docs.build(tensors=[docs.tensor(n) for n in names]), "$.tensors[4].name")
    # UTF-8 byte order: "Z" < "a" < "é"
    ok = docs.build(tensors=[docs.tensor(n) for n in ["Z", "a", "é"]])
    assert list(decode(ok).tensors) == ["Z", "a", "é"]


@pytest.mark.parametrize("dtype", [">f4", "<f16", "|O", "<c8", "float32", "f4", "", "<U1", "<f4 "])
def test_unknown_dtypes(docs: Any, dtype: str) -> None:
    _invalid(docs.build(tensors=[docs.tensor(dtype=dtype, data=bytes(8))]), "$.tensors[0].dtype")


def test_dtype_must_be_a_str(docs: Any) -> None:
    _invalid(docs.build(tensors=[docs.tensor(dtype=4, data=bytes(8))]), "$.tensors[0].dtype")
    long = docs.tensor(dtype="x" * 5000, data=bytes(8))
    _invalid(docs.build(tensors=[long]), "$.tensors[0].dtype")


def test_bad_shapes(docs: Any) -> None:
    _invalid(docs.build(tensors=[docs.tensor(shape=[2, -1], data=b"")]), "$.tensors[0].shape[1]")
    _invalid(docs.build(tensors=[docs.tensor(shape=[2.0], data=bytes(8))]), "$.tensors[0].shape[0]")
    _invalid(docs.build(tensors=[docs.tensor(shape=2, data=bytes(8))]), "$.tensors[0].shape")
    _invalid(
        docs.build(tensors=[docs.tensor(shape=[None], data=bytes(8))]), "$.tensors[0].shape[0]"
    )


def test_pad_must_be_the_smallest_aligning_zeros(docs: Any) -> None:
    accepted = []
    for n in range(64):
        doc = docs.build(tensors=[docs.tensor(pad=bytes(n))])
        try:
            h = read_header(doc)
        except InvalidDocumentError as e:
            assert e.path == "$.tensors[0].pad"
            assert "multiple of 64" in str(e)
        else:
            accepted.append(n)
            assert h.tensors[0].offset % 64 == 0
    assert len(accepted) == 1  # exactly one length in 0..63 aligns the data
    right = accepted[0]
    _invalid(docs.build(tensors=[docs.tensor(pad=bytes(right + 64))]), "$.tensors[0].pad")
    nonzero = docs.build(tensors=[docs.tensor(pad=b"\x00" * (right - 1) + b"\x01")])
    e = _invalid(nonzero, "$.tensors[0].pad")
    assert "zero" in str(e)
    _invalid(docs.build(tensors=[docs.tensor(pad="")]), "$.tensors[0].pad")
    _invalid(docs.build(tensors=[docs.tensor(pad=None)]), "$.tensors[0].pad")


def test_data_length_must_match_shape_and_dtype(docs: Any) -> None:
    for n in (0, 7, 9, 16):
        _invalid(docs.build(tensors=[docs.tensor(shape=(2,), data=bytes(n))]), "$.tensors[0].data")
    _invalid(
        docs.build(tensors=[docs.tensor(shape=(2, 3), dtype="<f8", data=bytes(40))]),
        "$.tensors[0].data",
    )
    _invalid(docs.build(tensors=[docs.tensor(data="abcdefgh")]), "$.tensors[0].data")
    assert decode(docs.build(tensors=[docs.tensor(shape=(3, 0), data=b"")])).tensors["w"].shape == (
        3,
        0,
    )


def test_bool_bytes_must_be_0_or_1(docs: Any) -> None:
    ok = docs.build(tensors=[docs.tensor(dtype="|b1", shape=(4,), data=b"\x00\x01\x01\x00")])
    assert decode(ok).tensors["w"].tolist() == [False, True, True, False]
    for bad in (b"\x00\x02\x01\x00", b"\xff\x00\x00\x00"):
        doc = docs.build(tensors=[docs.tensor(dtype="|b1", shape=(4,), data=bad)])
        e = _invalid(doc, "$.tensors[0].data")
        assert "0 or 1" in str(e)


def test_independent_builder_and_encoder_agree(docs: Any) -> None:
    # The refusal tests mutate the builder's output, so it must be a valid document itself.
    assert encode(Gradient({"w": np.zeros(2, "<f4")})).tobytes() == docs.build()
    two = [docs.tensor("a", "<i2", (3,)), docs.tensor("b", "|b1", (2, 2))]
    want = Gradient({"b": np.zeros((2, 2), bool), "a": np.zeros(3, "<i2")}, {"r": 1})
    assert encode(want).tobytes() == docs.build(tensors=two, meta={"r": 1})


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        (b"hello world\n", "68 65 6c 6c 6f 20 77 6f ('hello wo'...)"),
        (msgpack.packb([1, 2, 3]), "93 01 02 03 ('....')"),
        (b"\x01", "01 ('.')"),
    ],
)
def test_bytes_that_are_no_document_at_all_say_so(data: bytes, shown: str) -> None:
    # what `ipfs add` of a text file gives: say what it is not, show what it begins with
    e = _invalid(data, "$")
    assert str(e).startswith("not a gradstore/1 document (") and shown in str(e)
    assert "found int" not in str(e)


def test_a_map_of_other_keys_is_no_document_either(docs: Any) -> None:
    e = _invalid(msgpack.packb({"a": 1}), "$")
    assert str(e).startswith("not a gradstore/1 document: expected a map of exactly the keys")
    e = _invalid(
        docs.build(top=[("format", "gradstore/2"), ("meta", {}), ("tensors", [])]), "$.format"
    )
    assert str(e).startswith("not a gradstore/1 document: expected format 'gradstore/1'")
