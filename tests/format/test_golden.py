"""Pins the gradstore/1 bytes: a change here changes every CID ever published."""

from __future__ import annotations

import hashlib

import numpy as np

from gradstore.format import Gradient, decode, encode

# Hand-assembled, field by field (offsets in decimal):
GOLDEN = bytes.fromhex(
    "83"  # 0   fixmap, 3 keys
    "a6" + b"format".hex()  # 1
    + "ab" + b"gradstore/1".hex()  # 8
    + "a4" + b"meta".hex()  # 20
    + "81" + "a5" + b"round".hex() + "01"  # 25  {"round": 1}
    + "a7" + b"tensors".hex()  # 33
    + "91"  # 41  fixarray, 1 tensor
    + "85"  # 42  fixmap, 5 keys
    + "a4" + b"name".hex() + "a1" + b"b".hex()  # 43
    + "a5" + b"dtype".hex() + "a3" + b"<i2".hex()  # 50
    + "a5" + b"shape".hex() + "91" + "02"  # 60  [2]
    + "a3" + b"pad".hex() + "c4" + "2f" + "00" * 47  # 66  bin8 of 47 zeros
    + "a4" + b"data".hex() + "c4" + "04"  # 117
    + "0100" + "0200"  # 128 = 2 * 64: int16 1, 2 little-endian
)  # fmt: skip


def test_golden_bytes() -> None:
    g = Gradient({"b": np.array([1, 2], dtype="<i2")}, {"round": 1})
    assert len(GOLDEN) == 132
    assert encode(g).tobytes() == GOLDEN
    assert decode(GOLDEN) == g
    # the same pin as a digest, so an edit to GOLDEN itself is noticed too
    assert hashlib.sha256(GOLDEN).hexdigest() == (
        "595c98c015ffdc734a46d766806dc18a712f145bcde1ed19c818831f65c88740"
    )
    big_endian = Gradient({"b": np.array([1, 2], dtype=">i2")}, {"round": 1})
    assert encode(big_endian).tobytes() == GOLDEN


# A compressed document (gradstore/2), int8 with blocks of 2: pins the codec map's bytes too.
GOLDEN2 = bytes.fromhex(
    "84"  # 0   fixmap, 4 keys
    "a6" + b"format".hex()  # 1
    + "ab" + b"gradstore/2".hex()  # 8
    + "a4" + b"meta".hex()  # 20
    + "81" + "a5" + b"round".hex() + "01"  # 25  {"round": 1}
    + "a5" + b"codec".hex()  # 33
    + "82" + "a4" + b"name".hex() + "a4" + b"int8".hex()  # 39  {"name": "int8",
    + "a5" + b"block".hex() + "02"  # 50                      "block": 2}
    + "a7" + b"tensors".hex()  # 57
    + "91"  # 65  fixarray, 1 tensor
    + "85"  # 66  fixmap, 5 keys
    + "a4" + b"name".hex() + "a1" + b"b".hex()  # 67
    + "a5" + b"dtype".hex() + "a3" + b"<f4".hex()  # 74  the dense tensor's dtype
    + "a5" + b"shape".hex() + "91" + "02"  # 84  [2]
    + "a3" + b"pad".hex() + "c4" + "17" + "00" * 23  # 92  bin8 of 23 zeros
    + "a4" + b"data".hex() + "c4" + "06"  # 121
    + "0000803f" + "7f" + "c0"  # 128 = 2 * 64: scale 1.0 (float32), q 127 and -64
)  # fmt: skip


def test_golden_compressed_bytes() -> None:
    from gradstore.compress import compress
    from gradstore.format import decode_any

    g = Gradient({"b": np.array([127.0, -64.0], dtype="<f4")}, {"round": 1})
    assert len(GOLDEN2) == 134
    assert encode(compress(g, "int8:2")).tobytes() == GOLDEN2
    assert encode(decode_any(GOLDEN2)).tobytes() == GOLDEN2
    assert hashlib.sha256(GOLDEN2).hexdigest() == (
        "db295f0c0df33781f798eafb61833d19c7cdda7fe1f50a7cf784a13f50ab3770"
    )
