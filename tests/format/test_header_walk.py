"""HeaderWalk reads the header ``read_header`` reads, from windows of the document only, and
refuses what it refuses (the data of bool tensors and compressed payloads aside)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from gradstore.errors import FormatError, LimitExceededError, MalformedDocumentError
from gradstore.format import DocumentHeader, Gradient, HeaderWalk, Limits, encode, read_header

from .test_mutations import DOCS, SMALL, mutated

#: The seeds whose every tensor is dense and not bool: nothing in their data is checked.
PLAIN = [DOCS[0], DOCS[2], DOCS[3]]


def walk(buf: bytes, limits: Limits) -> tuple[DocumentHeader, list[tuple[int, int]]]:
    """The walk's header of ``buf`` and the windows it asked for."""
    view = memoryview(buf)
    hw = HeaderWalk(len(buf), limits)
    asked = []
    while (wanted := hw.wanted) is not None:
        start, length = wanted
        asked.append(wanted)
        hw.feed(view[start : start + length])
    return hw.header(), asked


def outcome(read: object, buf: bytes, limits: Limits) -> DocumentHeader | None:
    try:
        return read(buf, limits)  # type: ignore[operator,no-any-return]
    except (FormatError, LimitExceededError):
        return None


def _agree(buf: bytes, *, both_ways: bool) -> None:
    for limits in (SMALL, Limits()):
        whole = outcome(read_header, buf, limits)
        walked = outcome(lambda b, lim: walk(b, lim)[0], buf, limits)
        if whole is not None:
            assert walked == whole
        elif both_ways:
            assert walked is None, "the walk accepted what read_header refused"


def test_the_walk_reads_every_seed_as_read_header_does() -> None:
    for doc in DOCS:
        _agree(doc, both_ways=False)
        assert walk(doc, Limits())[0] == read_header(doc)


@settings(
    max_examples=1500,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated)
def test_mutated_documents_get_the_same_answer(buf: bytes) -> None:
    _agree(buf, both_ways=False)


def test_every_byte_flip_of_a_plain_document_gets_the_same_answer() -> None:
    for doc in PLAIN:
        for i in range(len(doc)):
            for xor in (0x01, 0x80, 0xFF):
                flipped = bytearray(doc)
                flipped[i] ^= xor
                _agree(bytes(flipped), both_ways=True)


def test_the_windows_are_small_and_skip_the_data() -> None:
    rng = np.random.default_rng(3)
    tensors = {f"t{i}": rng.standard_normal(300_000).astype("<f4") for i in range(4)}
    doc = encode(Gradient(tensors, {"kind": "aggregate"})).tobytes()
    header, asked = walk(doc, Limits())
    assert header == read_header(doc)
    assert len(asked) == 5  # the start, then one map per tensor
    limits = Limits()
    assert max(n for _, n in asked[1:]) < 2 * limits.max_name_bytes + 9 * limits.max_rank
    assert sum(n for _, n in asked) < len(doc) // 10


def test_a_malformed_tensor_map_is_refused_at_its_document_offset() -> None:
    gradient = Gradient({"a": np.zeros(100_000, "<f4"), "b": np.ones(3, "<f4")})
    doc = bytearray(encode(gradient).tobytes())
    at = doc.index(b"\xa1b")  # tensor b's name
    doc[at] = 0xC1  # the never-used msgpack byte
    with pytest.raises(MalformedDocumentError) as walked:
        walk(bytes(doc), Limits())
    with pytest.raises(MalformedDocumentError) as whole:
        read_header(bytes(doc))
    assert walked.value.offset == whole.value.offset == at
    assert str(walked.value) == str(whole.value)
