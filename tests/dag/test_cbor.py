"""gradstore.dag.cbor against the dag_cbor reference: the same bytes out, the same verdict in.

Generated values of the subset gradstore writes encode to exactly the reference's bytes and
decode back to themselves; generated, mutated and hand-written hostile bytes are accepted
exactly when the reference accepts them (with the same value), except links outside the
CID profile and nesting beyond ``MAX_DEPTH``, which the door alone refuses. Every refusal is
a ``DAGError``, and a length that claims more than the input holds allocates nothing.
"""

from __future__ import annotations

import math
import struct
import time
import tracemalloc
from typing import Any

import dag_cbor
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multiformats import CID as MFCID

from gradstore.dag import cbor
from gradstore.dag.cid import CID, DAG_CBOR, DAG_PB, RAW
from gradstore.errors import CIDError, DAGError

REFUSED = object()

cids = st.builds(
    CID, st.sampled_from([RAW, DAG_PB, DAG_CBOR]), st.binary(min_size=32, max_size=32)
) | st.builds(lambda d: CID(DAG_PB, d, 0), st.binary(min_size=32, max_size=32))
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64 - 1)
    | st.integers(-30, 30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.binary()
    | cids
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=30), inner),
    max_leaves=40,
)


def to_reference(value: Any) -> Any:
    """``value`` with the reference's CID type in place of ours."""
    if isinstance(value, CID):
        return MFCID.decode(value.bytes)
    if isinstance(value, list):
        return [to_reference(v) for v in value]
    if isinstance(value, dict):
        return {k: to_reference(v) for k, v in value.items()}
    return value


def in_subset(value: Any, depth: int = cbor.MAX_DEPTH) -> bool:
    """Whether the door takes what the reference decoded: profile links, bounded nesting."""
    if isinstance(value, MFCID):
        try:
            return CID.from_bytes(bytes(value)).bytes == bytes(value)
        except CIDError:
            return False
    if isinstance(value, list | dict):
        items = value.values() if isinstance(value, dict) else value
        return depth > 0 and all(in_subset(v, depth - 1) for v in items)
    return True


def same(ours: Any, reference: Any) -> bool:
    """Equal values of equal kinds (1 is not 1.0 nor True; 0.0 is not -0.0)."""
    if isinstance(reference, MFCID):
        return isinstance(ours, CID) and ours.bytes == bytes(reference)
    if type(ours) is not type(reference):
        return False
    if isinstance(ours, float):
        return struct.pack(">d", ours) == struct.pack(">d", reference)
    if isinstance(ours, list):
        return len(ours) == len(reference) and all(map(same, ours, reference))
    if isinstance(ours, dict):
        return ours.keys() == reference.keys() and all(same(ours[k], reference[k]) for k in ours)
    return bool(ours == reference)


def judge(raw: bytes) -> None:
    """The door accepts ``raw`` exactly when the reference does (within the subset)."""
    try:
        reference = dag_cbor.decode(raw)
    except Exception:  # the reference raises assorted types (IndexError, RecursionError, ...)
        reference = REFUSED
    try:
        ours = cbor.decode(raw)
    except DAGError:
        ours = REFUSED
    if reference is REFUSED or not in_subset(reference):
        assert ours is REFUSED, f"the door accepted {raw.hex()}"
    else:
        assert ours is not REFUSED, f"the door refused {raw.hex()}, the reference took it"
        assert same(ours, reference)
        assert cbor.encode(ours) == raw  # one encoding per value


@settings(max_examples=300, deadline=None)
@given(values)
def test_encoding_is_the_references_and_decodes_back(value: Any) -> None:
    data = cbor.encode(value)
    assert data == dag_cbor.encode(to_reference(value))
    assert same(cbor.decode(data), to_reference(value))
    assert same(cbor.decode(memoryview(bytearray(data))), to_reference(value))


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(cbor.encode(draw(values)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate", "flip"]))
        if op == "insert" or not raw:
            raw[at:at] = bytes([draw(st.integers(0, 255))])
        elif op == "truncate":
            del raw[at:]
        else:
            at = min(at, len(raw) - 1)
            if op == "delete":
                del raw[at]
            elif op == "flip":
                raw[at] ^= 1 << draw(st.integers(0, 7))
            else:
                raw[at] = draw(st.integers(0, 255))
    return bytes(raw)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_encodings_are_judged_as_the_reference_judges_them(raw: bytes) -> None:
    judge(raw)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=48))
def test_random_bytes_are_judged_as_the_reference_judges_them(raw: bytes) -> None:
    judge(raw)


D = bytes(range(32))
LINK = b"\xd8\x2a\x58\x25\x00\x01\x71\x12\x20" + D


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x9f\x01\xff",  # indefinite array
        b"\xbf\x61a\x01\xff",  # indefinite map
        b"\x5f\x41a\xff",  # indefinite bytes
        b"\x7f\x61a\xff",  # indefinite text
        b"\xff",  # a lone break
        b"\x1c",
        b"\x3d",
        b"\x5e",  # reserved additional info 28-30
        b"\x18\x17",  # 23 in one extra byte
        b"\x19\x00\xff",
        b"\x1a\x00\x00\xff\xff",
        b"\x1b\x00\x00\x00\x00\xff\xff\xff\xff",
        b"\x38\x00",  # -1 in one extra byte
        b"\x98\x01\x00",  # a one-item array with its length in an extra byte
        b"\x78\x01a",  # text length in an extra byte
        b"\xa2\x61b\x01\x61a\x02",  # keys out of order
        b"\xa2\x62aa\x01\x61b\x02",  # longer key first
        b"\xa2\x61a\x01\x61a\x02",  # repeated key
        b"\xa1\x01\x02",  # integer key
        b"\xa1\x41a\x02",  # byte-string key
        b"\xc0\x61a",  # tag 0
        b"\xd8\x2b\x41\x00",  # tag 43
        b"\xd9\x00\x2a" + LINK[2:],  # tag 42 not minimally encoded
        b"\xfb\x7f\xf8\x00\x00\x00\x00\x00\x00",  # NaN
        b"\xfb\x7f\xf0\x00\x00\x00\x00\x00\x00",  # +inf
        b"\xfb\xff\xf0\x00\x00\x00\x00\x00\x00",  # -inf
        b"\xf9\x3c\x00",  # float16 1.0
        b"\xfa\x3f\x80\x00\x00",  # float32 1.0
        b"\xf7",  # undefined
        b"\xe0",  # simple value 0
        b"\xf8\x20",  # simple value 32
        b"\x01\x02",  # trailing bytes
        b"\xa1\x61a",  # truncated map value
        b"\x82\x01",  # truncated array
        b"\x62a",  # truncated text
        b"\x61\xff",  # text that is not UTF-8
        b"\x63\xed\xa0\x80",  # a UTF-16 surrogate in UTF-8
        b"\xa1\x61\xff\x01",  # a key that is not UTF-8
        b"\xd8\x2a\x61a",  # a link holding text
        b"\xd8\x2a\x01",  # a link holding an integer
        b"\xd8\x2a\x40",  # a link holding nothing
        LINK[:4] + b"\x01" + LINK[5:],  # a link without the 0x00 prefix
        b"\xd8\x2a\x58\x26\x00\x81\x00\x71\x12\x20" + D,  # a non-minimal CID varint
        b"\xd8\x2a\x58\x26\x00\x01\x71\x12\x20" + D + b"\x00",  # a CID with a trailing byte
        LINK[:-1],  # a truncated link
        b"\xd8\x2a",  # a tag with nothing after it
    ],
)
def test_hostile_bytes_are_refused_by_both(raw: bytes) -> None:
    with pytest.raises(DAGError, match="not DAG-CBOR"):
        cbor.decode(raw)
    with pytest.raises(Exception):  # noqa: B017 - the reference raises assorted types
        dag_cbor.decode(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xd8\x2a\x58\x25\x00\x01\x72\x12\x20" + D,  # codec libp2p-key
        b"\xd8\x2a\x58\x45\x00\x01\x71\x13\x40" + D + D,  # sha2-512
        b"\xd8\x2a\x49\x00\x01\x55\x00\x04abcd",  # identity multihash
    ],
)
def test_links_outside_the_profile_are_refused(raw: bytes) -> None:
    dag_cbor.decode(raw)  # the reference takes any CID
    with pytest.raises(DAGError, match="outside the CID profile"):
        cbor.decode(raw)


def test_nesting_is_bounded_where_the_reference_takes_it() -> None:
    deep = b"\x81" * cbor.MAX_DEPTH + b"\x00"
    assert dag_cbor.decode(deep) is not None
    cbor.decode(deep)
    with pytest.raises(DAGError, match="deeper than the bound"):
        cbor.decode(b"\x81" + deep)
    with pytest.raises(DAGError, match="deeper than the bound"):
        cbor.decode(b"\xa1\x61a" * (cbor.MAX_DEPTH + 1) + b"\x00")
    with pytest.raises(DAGError, match="deeper than the bound"):
        cbor.decode(b"\x81" * 100_000 + b"\x00")  # no RecursionError


@pytest.mark.parametrize(
    "head",
    [
        b"\x9b" + b"\xff" * 8,  # an array of 2**64 - 1 items
        b"\xbb" + b"\xff" * 8,  # a map of 2**64 - 1 entries
        b"\x5b" + b"\xff" * 8,  # a byte string of 2**64 - 1 bytes
        b"\x7b" + b"\x7f" * 8,  # text
        b"\x9a\x00\x10\x00\x00",  # an array of a million items
    ],
)
def test_a_length_past_the_end_is_refused_before_anything_is_built(head: bytes) -> None:
    raw = head + b"\x00" * 1000
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(DAGError, match="past the end"):
            cbor.decode(raw)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 and elapsed < 0.5


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (math.nan, "finite"),
        ({"a": [math.inf]}, r"finite.* at \$\.a\[0\]"),
        (-math.inf, "finite"),
        (2**64, "64 bits"),
        (-(2**64) - 1, "64 bits"),
        ({1: "a"}, "keys are text"),
        ((1, 2), "tuple"),
        (bytearray(b"x"), "bytearray"),
        ({"x"}, "set"),
        ("\ud800", "UTF-8"),
        ({"\ud800": 1}, "UTF-8"),
        (MFCID.decode(b"\x01\x71\x12\x20" + D), "CID is not"),
    ],
)
def test_values_outside_the_subset_are_not_encoded(value: object, what: str) -> None:
    with pytest.raises(DAGError, match=what):
        cbor.encode(value)


def test_deep_and_cyclic_values_are_refused_not_recursed() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(DAGError, match="deeper than the bound"):
        cbor.encode(loop)
    nested: Any = 0
    for _ in range(cbor.MAX_DEPTH):
        nested = [nested]
    assert cbor.encode(nested) == dag_cbor.encode(nested)
    with pytest.raises(DAGError, match="deeper than the bound"):
        cbor.encode([nested])


def test_subclasses_encode_as_the_reference_encodes_them() -> None:
    import enum

    class Kind(enum.StrEnum):
        A = "a"

    class Size(enum.IntEnum):
        BIG = 300

    value = {Kind.A: [Size.BIG, Kind.A]}
    assert cbor.encode(value) == dag_cbor.encode(value)
