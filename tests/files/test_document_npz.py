"""``get`` writes a dense document of NumPy's types to ``.npz`` from its bytes: the file is
the one the NumPy writer gives for the decoded gradient, byte for byte."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np

from gradstore.compress import compress
from gradstore.files import write_document_npz, write_npz, writes_as_bytes
from gradstore.format import NUMPY_CODES, Gradient, decode, encode, read_header

SEED = 20240611


def _gradient() -> Gradient:
    rng = np.random.default_rng(SEED)
    tensors = {
        f"t{i}.{code.strip('<|')}": rng.integers(0, 2, (3, 5)).astype(code)
        for i, code in enumerate(NUMPY_CODES)
    }
    tensors["zero-d"] = np.float32(2.5)
    tensors["empty"] = np.zeros((0, 4), np.float64)
    tensors["ünïcode name"] = np.arange(7, dtype=np.int16)
    return Gradient(tensors, {"round": 3})


def test_the_file_is_the_numpy_writers_byte_for_byte(tmp_path: Path) -> None:
    raw = encode(_gradient()).tobytes()
    header = read_header(raw)
    assert writes_as_bytes(header)
    ours, theirs = tmp_path / "ours.npz", tmp_path / "theirs.npz"
    with open(ours, "wb") as f:
        write_document_npz(f, header, memoryview(raw))
    with open(theirs, "wb") as f:
        write_npz(f, decode(raw))
    assert ours.read_bytes() == theirs.read_bytes()
    with np.load(ours) as back:
        for name, value in _gradient().tensors.items():
            assert np.array_equal(back[name], value) and back[name].dtype == value.dtype


def test_narrow_floats_and_compressed_documents_are_decoded_instead() -> None:
    compressed = compress(Gradient({"w": np.ones(64, np.float32)}), "int8")
    assert not writes_as_bytes(read_header(encode(compressed).tobytes()))
    narrow = Gradient({"w": np.ones(4, ml_dtypes.bfloat16)})
    assert not writes_as_bytes(read_header(encode(narrow).tobytes()))
