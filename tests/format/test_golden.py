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
