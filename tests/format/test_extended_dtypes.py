"""bfloat16 and float8 (e4m3fn, e5m2) in gradstore/1: names, bytes, zero-copy, refusals.

The in-memory arrays are ml_dtypes arrays; the document writes the dtype by name
(docs/design/documents.md, "Tensor dtypes").
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from gradstore.errors import InvalidDocumentError, MissingExtraError
from gradstore.format import (
    EXTENDED,
    Gradient,
    _dtypes,
    decode,
    dtype_code,
    encode,
    is_float,
    numpy_dtype,
    read_header,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
SEED = 7

# One bfloat16 tensor [1.0, -2.0], hand-assembled field by field (offsets in decimal).
GOLDEN_BF16 = bytes.fromhex(
    "83"  # 0   fixmap, 3 keys
    "a6" + b"format".hex()  # 1
    + "ab" + b"gradstore/1".hex()  # 8
    + "a4" + b"meta".hex()  # 20
    + "80"  # 25  {}
    + "a7" + b"tensors".hex()  # 26
    + "91"  # 34  fixarray, 1 tensor
    + "85"  # 35  fixmap, 5 keys
    + "a4" + b"name".hex() + "a1" + b"w".hex()  # 36
    + "a5" + b"dtype".hex() + "a8" + b"bfloat16".hex()  # 43
    + "a5" + b"shape".hex() + "91" + "02"  # 58  [2]
    + "a3" + b"pad".hex() + "c4" + "31" + "00" * 49  # 66  bin8 of 49 zeros
    + "a4" + b"data".hex() + "c4" + "04"  # 121
    + "803f" + "00c0"  # 128: bfloat16 1.0 = 0x3f80, -2.0 = 0xc000, little-endian
)  # fmt: skip


def test_the_document_names_the_dtype_and_holds_little_endian_bits() -> None:
    g = Gradient({"w": np.array([1.0, -2.0], BF16)})
    assert encode(g).tobytes() == GOLDEN_BF16
    assert hashlib.sha256(GOLDEN_BF16).hexdigest() == (
        "2634de852729a70eb4bb23eb70cc32fdcee4047a794eedeff7c56bf8ba0dabd7"
    )
    out = decode(GOLDEN_BF16)
    assert out == g and out.tensors["w"].dtype == BF16
    assert [t.dtype for t in read_header(GOLDEN_BF16).tensors] == ["bfloat16"]


@pytest.mark.parametrize("name", list(EXTENDED))
def test_names_map_to_ml_dtypes_and_back(name: str) -> None:
    dt = numpy_dtype(name)
    assert dt == np.dtype(getattr(ml_dtypes, name))
    assert dtype_code(dt) == name
    assert dtype_code(dt.newbyteorder(">")) == name
    assert is_float(dt)
    assert dt.itemsize == EXTENDED[name]


@pytest.mark.parametrize("dt", [BF16, E4M3, E5M2], ids=str)
def test_every_bit_pattern_round_trips_zero_copy(dt: np.dtype) -> None:
    codes = np.arange(1 << (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    values = codes.view(dt)  # NaN payloads, infinities, -0 and subnormals included
    doc = encode(Gradient({"v": values}))
    pieces = list(doc)
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), values) for p in pieces)
    raw = doc.tobytes()
    out = decode(raw).tensors["v"]
    assert out.dtype == dt and out.tobytes() == values.tobytes()
    assert np.shares_memory(out, np.frombuffer(raw, np.uint8))  # a view, not a copy


def test_byte_order_and_layout_do_not_change_the_bytes() -> None:
    rng = np.random.default_rng(SEED)
    le = rng.standard_normal((4, 6)).astype(BF16)
    reference = encode(Gradient({"a": le})).tobytes()
    for twin in (le.astype(BF16.newbyteorder(">")), np.asfortranarray(le), le.T.copy().T):
        assert encode(Gradient({"a": twin})).tobytes() == reference
        assert Gradient({"a": twin}) == Gradient({"a": le})


def test_same_bytes_under_another_dtype_is_another_document() -> None:
    bits = np.arange(8, dtype=np.uint8)
    docs = {
        encode(Gradient({"a": bits.view(E4M3)})).tobytes(),
        encode(Gradient({"a": bits.view(E5M2)})).tobytes(),
        encode(Gradient({"a": bits})).tobytes(),
        encode(Gradient({"a": bits.view(np.int8)})).tobytes(),
        encode(Gradient({"a": bits.view(BF16)})).tobytes(),
        encode(Gradient({"a": bits.view("<u2")})).tobytes(),
        encode(Gradient({"a": bits.view("<f2")})).tobytes(),
    }
    assert len(docs) == 7
    assert Gradient({"a": bits.view(BF16)}) != Gradient({"a": bits.view("<u2")})


@pytest.mark.parametrize(
    "array",
    [
        np.zeros(2, "V2"),  # what NumPy calls bfloat16 without ml_dtypes: raw bytes, refused
        np.zeros(2, "V1"),
        np.zeros(2, ml_dtypes.float8_e4m3fnuz),  # other float8 variants: not in the format
        np.zeros(2, ml_dtypes.float8_e4m3),
        np.zeros(2, ml_dtypes.float8_e5m2fnuz),
        np.zeros(2, ml_dtypes.int4),
    ],
    ids=str,
)
def test_other_narrow_types_are_refused_by_the_encoder(array: np.ndarray) -> None:
    with pytest.raises(InvalidDocumentError, match=r"not storable; allowed: .*bfloat16") as info:
        encode(Gradient({"w": array}))
    assert info.value.path == "$.tensors[0]"


@pytest.mark.parametrize(
    "dtype",
    [
        "bf16", "BFLOAT16", "Bfloat16", "bfloat16 ", " bfloat16", "bfloat16\x00", "<V2", "|V2",
        "V2", "<V1", "|V1", "<f1", "float8_e4m3", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "float8_e4m3FN", "float8", "e4m3fn", "F8_E4M3", "BF16", "float8_e5m2 ", "float16",
        "float8_e4m3fnx",
    ],
)  # fmt: skip
def test_the_decoder_knows_the_exact_names_only(docs: Any, dtype: str) -> None:
    doc = docs.build(tensors=[docs.tensor(dtype=dtype, shape=(2,), data=bytes(4))])
    for fn in (read_header, decode):
        with pytest.raises(InvalidDocumentError) as info:
            fn(doc)
        assert info.value.path == "$.tensors[0].dtype", info.value


@pytest.mark.parametrize(("dtype", "itemsize"), list(EXTENDED.items()))
def test_data_length_must_match_the_itemsize(docs: Any, dtype: str, itemsize: int) -> None:
    ok = docs.build(tensors=[docs.tensor(dtype=dtype, shape=(3,), data=bytes(3 * itemsize))])
    assert decode(ok).tensors["w"].shape == (3,)
    for wrong in (3 * itemsize - 1, 3 * itemsize + 1, 3 * 4):
        if wrong == 3 * itemsize:
            continue
        bad = docs.build(tensors=[docs.tensor(dtype=dtype, shape=(3,), data=bytes(wrong))])
        with pytest.raises(InvalidDocumentError, match=f"needs {3 * itemsize}") as info:
            read_header(bad)
        assert info.value.path == "$.tensors[0].data"


def test_without_ml_dtypes_the_header_validates_and_decode_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = encode(Gradient({"w": np.ones(3, BF16), "x": np.ones(2, "<f4")})).tobytes()
    plain = encode(Gradient({"x": np.ones(2, "<f4")})).tobytes()
    _dtypes._extended.cache_clear()
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # `import ml_dtypes` now fails
    try:
        assert [t.dtype for t in read_header(raw).tensors] == ["bfloat16", "<f4"]
        with pytest.raises(MissingExtraError, match=r"pip install 'gradstore\[ml-dtypes\]'"):
            decode(raw)
        assert decode(plain).tensors["x"].tolist() == [1.0, 1.0]  # other documents unaffected
    finally:
        _dtypes._extended.cache_clear()
