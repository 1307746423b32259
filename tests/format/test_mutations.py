"""Mutated documents: only FormatError / LimitExceededError, and nothing non-canonical accepted.

A decode that succeeds must return a gradient whose encoding is exactly the
mutated bytes: any other outcome would mean two byte strings for one gradient. The seeds
include compressed (gradstore/2) documents of every codec, so the codec map, the payload
rules and range reads of what decodes are mutated too.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradstore.compress import compress
from gradstore.errors import FormatError, LimitExceededError
from gradstore.format import CompressedGradient, Gradient, Limits, decode_any, encode, read_header

SEED = 1234
SMALL = Limits(max_bytes=1 << 16, max_elements=1 << 12, max_meta_bytes=1 << 10)


def _seed_documents() -> list[bytes]:
    rng = np.random.default_rng(SEED)
    return [
        encode(Gradient({"w": rng.standard_normal(3).astype("<f4")}, {"round": 1})).tobytes(),
        encode(
            Gradient(
                {
                    "b": rng.integers(0, 2, (2, 2)).astype(bool),
                    "e": np.zeros((3, 0), "<i8"),
                    "s": np.array(7, "|i1"),
                    "h": rng.standard_normal(5).astype("<f2"),
                },
                {"kind": "gradient", "lr": 0.01, "peers": ["a", "b"], "x": {"n": None, "t": True}},
            )
        ).tobytes(),
        encode(Gradient({}, {})).tobytes(),
        encode(  # the extended floats: their names are the longest dtype strings
            Gradient(
                {
                    "bf": rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
                    "e4": rng.standard_normal(4).astype(ml_dtypes.float8_e4m3fn),
                    "e5": rng.standard_normal(3).astype(ml_dtypes.float8_e5m2),
                },
                {"round": 2},
            )
        ).tobytes(),
    ]


def _compressed_seeds() -> list[bytes]:
    rng = np.random.default_rng(SEED + 1)
    w = {"b": rng.standard_normal(5).astype("<f4"), "w": rng.standard_normal((3, 7)).astype("<f8")}
    specs = [
        "bf16",
        "fp16",
        "int8:8",
        "topk:k=3,chunk=8,values=int8",
        "topk:k=5,chunk=16,values=2bit,index=16",
        "topk:k=4,chunk=8,values=bf16",
    ]
    return [encode(compress(Gradient(w, {"round": 3}), spec)).tobytes() for spec in specs]


DOCS = _seed_documents() + _compressed_seeds()


def _check(buf: bytes) -> None:
    for limits in (SMALL, Limits()):
        try:
            g = decode_any(buf, limits)
        except (FormatError, LimitExceededError):
            with_header_too = True
            try:
                read_header(buf, limits)
            except (FormatError, LimitExceededError):
                with_header_too = False
            assert not with_header_too, "read_header accepted what decode refused"
            continue
        assert encode(g).tobytes() == buf, "a non-canonical document was accepted"
        if isinstance(g, CompressedGradient):  # what decodes also decompresses, range by range
            for t in g.tensors.values():
                whole = t.decompress().reshape(-1)
                assert whole.dtype == np.float64 and whole.size == t.size
                if t.size > 2:
                    assert t.read(1, t.size - 1).tobytes() == whole[1:-1].tobytes()


def _flip(doc: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(doc)
    for index, xor in flips:
        out[index % len(out)] ^= xor
    return bytes(out)


mutated = st.one_of(
    st.builds(
        _flip,
        st.sampled_from(DOCS),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    ),
    st.builds(lambda d, n: d[: n % len(d)], st.sampled_from(DOCS), st.integers(0, 10_000)),
    st.builds(
        lambda d, n, extra: d[: n % (len(d) + 1)] + extra + d[n % (len(d) + 1) :],
        st.sampled_from(DOCS),
        st.integers(0, 10_000),
        st.binary(min_size=1, max_size=8),
    ),
    st.builds(
        lambda d, n, k: d[: n % len(d)] + d[n % len(d) + k :],
        st.sampled_from(DOCS),
        st.integers(0, 10_000),
        st.integers(1, 70),
    ),
    st.binary(max_size=300),
)


@settings(
    max_examples=3000,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(mutated)
def test_mutated_documents_fail_cleanly(buf: bytes) -> None:
    _check(buf)


def test_every_single_byte_flip_fails_cleanly() -> None:
    for doc in DOCS:
        for i in range(len(doc)):
            for xor in (0x01, 0x10, 0x80, 0xFF):
                _check(_flip(doc, [(i, xor)]))


def test_seed_documents_decode() -> None:
    for doc in DOCS:
        assert encode(decode_any(doc)).tobytes() == doc
