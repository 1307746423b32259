"""Every Limits field, at its boundary, and declared sizes that must allocate nothing."""

from __future__ import annotations

import dataclasses
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gradstore.compress import compress
from gradstore.errors import LimitExceededError, MalformedDocumentError
from gradstore.format import (
    DEFAULT_LIMITS,
    Gradient,
    Limits,
    check_fits,
    decode,
    encode,
    read_header,
)


def _doc(tensors: dict[str, np.ndarray], meta: dict[str, Any] | None = None) -> bytes:
    return encode(Gradient(tensors, meta or {})).tobytes()


def _peak_bytes(fn: Callable[[], object], error: type[Exception]) -> int:
    """Peak traced allocation while ``fn`` raises ``error``."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(error):
            fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_defaults_are_documented_values() -> None:
    assert dataclasses.asdict(DEFAULT_LIMITS) == {
        "max_bytes": 1 << 30,
        "max_tensors": 65_536,
        "max_rank": 32,
        "max_elements": 1 << 31,
        "max_meta_bytes": 1 << 16,
        "max_name_bytes": 1024,
        "max_meta_depth": 32,
    }
    with pytest.raises(ValueError):
        Limits(max_bytes=-1)
    with pytest.raises(ValueError):
        Limits(max_rank=True)


def test_max_bytes() -> None:
    doc = _doc({"w": np.zeros(100, "<f4")})
    assert decode(doc, Limits(max_bytes=len(doc))).tensors["w"].shape == (100,)
    with pytest.raises(LimitExceededError, match="max_bytes"):
        decode(doc, Limits(max_bytes=len(doc) - 1))
    with pytest.raises(LimitExceededError):
        read_header(doc, Limits(max_bytes=len(doc) - 1))


def test_max_tensors() -> None:
    doc = _doc({f"t{i}": np.zeros(1, "|u1") for i in range(3)})
    assert len(decode(doc, Limits(max_tensors=3)).tensors) == 3
    with pytest.raises(LimitExceededError, match="max_tensors"):
        decode(doc, Limits(max_tensors=2))


def test_max_rank() -> None:
    doc = _doc({"w": np.zeros((1, 2, 3), "<f4")})
    assert decode(doc, Limits(max_rank=3)).tensors["w"].shape == (1, 2, 3)
    with pytest.raises(LimitExceededError, match="max_rank"):
        decode(doc, Limits(max_rank=2))


def test_max_elements_counts_all_tensors() -> None:
    doc = _doc({"a": np.zeros((2, 5), "<f8"), "b": np.zeros(10, "|u1")})
    assert len(decode(doc, Limits(max_elements=20)).tensors) == 2
    with pytest.raises(LimitExceededError, match="max_elements"):
        decode(doc, Limits(max_elements=19))


def test_max_elements_bounds_the_shape_of_empty_tensors() -> None:
    doc = _doc({"e": np.zeros((1000, 0), "<f4")})
    assert decode(doc, Limits(max_elements=1000)).tensors["e"].shape == (1000, 0)
    with pytest.raises(LimitExceededError):
        decode(doc, Limits(max_elements=999))


def test_max_meta_bytes() -> None:
    meta = {"note": "x" * 100}
    size = 1 + 5 + 2 + 100  # fixmap, "note", str8 header, payload
    doc = _doc({}, meta)
    assert decode(doc, Limits(max_meta_bytes=size)).meta == meta
    with pytest.raises(LimitExceededError, match="max_meta_bytes"):
        decode(doc, Limits(max_meta_bytes=size - 1))


def test_max_name_bytes() -> None:
    name = "é" * 5  # 10 UTF-8 bytes
    doc = _doc({name: np.zeros(1, "<f4")})
    assert name in decode(doc, Limits(max_name_bytes=10)).tensors
    with pytest.raises(LimitExceededError, match="max_name_bytes"):
        decode(doc, Limits(max_name_bytes=9))


def test_max_meta_depth() -> None:
    doc = _doc({}, {"a": [[1]]})
    assert decode(doc, Limits(max_meta_depth=2)).meta == {"a": [[1]]}
    with pytest.raises(LimitExceededError, match="max_meta_depth"):
        decode(doc, Limits(max_meta_depth=1))


_OVER_EACH_LIMIT = {  # a gradient, and the limits one below what its document needs
    "max_bytes": ({"w": np.zeros(100, "<f4")}, {}, {"max_bytes": 400}),
    "max_tensors": ({f"t{i}": np.zeros(1, "|u1") for i in range(3)}, {}, {"max_tensors": 2}),
    "max_rank": ({"w": np.zeros((1, 2, 3), "<f4")}, {}, {"max_rank": 2}),
    "max_elements": ({"w": np.zeros((2, 5), "<f8")}, {}, {"max_elements": 9}),
    "max_meta_bytes": ({}, {"note": "x" * 100}, {"max_meta_bytes": 50}),
    "max_name_bytes": ({"é" * 5: np.zeros(1, "<f4")}, {}, {"max_name_bytes": 9}),
}


@pytest.mark.parametrize("field", sorted(_OVER_EACH_LIMIT))
def test_a_refusal_names_its_limit_as_a_field(field: str) -> None:
    """Code tells the limits apart by ``LimitExceededError.limit``, never by the message:
    reading the document and checking a gradient before it is written say the same."""
    tensors, meta, over = _OVER_EACH_LIMIT[field]
    gradient = Gradient(tensors, meta)
    doc = _doc(tensors, meta)
    with pytest.raises(LimitExceededError) as read:
        decode(doc, Limits(**over))
    with pytest.raises(LimitExceededError) as checked:
        check_fits(gradient, len(doc), Limits(**over))
    assert read.value.limit == checked.value.limit == field


def test_the_meta_depth_and_decompression_refusals_name_their_limit() -> None:
    with pytest.raises(LimitExceededError) as deep:
        decode(_doc({}, {"a": [[1]]}), Limits(max_meta_depth=1))
    assert deep.value.limit == "max_meta_depth"
    compressed = compress(Gradient({"w": np.ones(64, np.float32)}), "int8")
    with pytest.raises(LimitExceededError) as dense:
        compressed.decompress(max_bytes=8 * 64 - 1)
    assert dense.value.limit == "max_bytes"


# --- huge declared sizes allocate nothing -----------------------------------------------


def test_declared_4g_elements_allocate_nothing(docs: Any) -> None:
    # shape [2^32 - 1] of |u1 and a bin32 data header of the same length, with no data.
    doc = docs.build(
        tensors=[
            docs.tensor(
                dtype="|u1",
                shape=[2**32 - 1],
                data=docs.Raw(b"\xc6\xff\xff\xff\xff", head=5),
            )
        ]
    )
    assert len(doc) < 200
    assert _peak_bytes(lambda: decode(doc), LimitExceededError) < 100_000
    # with the limit raised, the missing data is found, still without allocating
    big = Limits(max_elements=2**32)
    assert _peak_bytes(lambda: decode(doc, big), MalformedDocumentError) < 100_000


def test_declared_huge_counts_allocate_nothing(docs: Any) -> None:
    top = [("format", "gradstore/1"), ("meta", {})]
    many_tensors = docs.build(top=[*top, ("tensors", docs.Raw(b"\xdd\xff\xff\xff\xff"))])
    assert _peak_bytes(lambda: decode(many_tensors), LimitExceededError) < 100_000
    unlimited = Limits(max_tensors=2**32)
    assert _peak_bytes(lambda: decode(many_tensors, unlimited), MalformedDocumentError) < 100_000

    huge_str = docs.build(meta={"s": docs.Raw(b"\xdb\xff\xff\xff\xff")})
    assert _peak_bytes(lambda: decode(huge_str), MalformedDocumentError) < 100_000
    padded = huge_str + bytes(1 << 17)  # now the str would run past max_meta_bytes first
    assert _peak_bytes(lambda: decode(padded), LimitExceededError) < 1 << 16

    # documents that end right after declaring a huge meta array / map
    prefix = b"\x83\xa6format\xabgradstore/1\xa4meta"
    huge_list = prefix + b"\x81\xa1l\xdd\xff\xff\xff\xff"
    assert _peak_bytes(lambda: decode(huge_list), MalformedDocumentError) < 100_000
    huge_map = prefix + b"\xdf\xff\xff\xff\xff"
    assert _peak_bytes(lambda: decode(huge_map), MalformedDocumentError) < 100_000

    huge_shape = docs.build(
        tensors=[docs.tensor(shape=docs.Raw(b"\xdd\xff\xff\xff\xff"), data=b"")]
    )
    assert _peak_bytes(lambda: decode(huge_shape), LimitExceededError) < 100_000
    long_name = docs.build(tensors=[docs.tensor(name=docs.Raw(b"\xdb\xff\xff\xff\xff"))])
    assert _peak_bytes(lambda: decode(long_name), LimitExceededError) < 100_000
