"""``gradstore.files`` from Python: load, save and stream tensor files as the commands do,
the README's example as written, and the ``safetensors`` extra needed only for its files."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from gradstore.dag import file_cid
from gradstore.errors import FormatError
from gradstore.files import (
    LoadedGradient,
    NpzStream,
    SequentialWriter,
    load_gradient,
    load_npz,
    load_safetensors,
    open_gradient,
    save_gradient,
    write_document_npz,
    write_npz,
    write_safetensors,
)
from gradstore.format import Gradient, encode, read_header

SEED = 20240611
README = Path(__file__).resolve().parents[2] / "README.md"


def _arrays() -> dict[str, np.ndarray[Any, Any]]:
    rng = np.random.default_rng(SEED)
    return {
        "layer.0.weight": rng.standard_normal((5, 7)).astype(np.float32),
        "layer.0.bias": rng.standard_normal(7),
        "steps": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 3), np.float16),
    }


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for name, array in want.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        assert np.asarray(got[name]).tobytes() == array.tobytes(), name


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_a_saved_gradient_loads_back_the_same_and_gives_the_same_cid(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"g{suffix}"
    save_gradient(path, Gradient(_arrays(), {"ignored": True}))  # meta is not a file's
    back = load_gradient(path, {"round": 3})
    _same(back.tensors, _arrays())
    assert back.meta == {"round": 3}
    loader = load_npz if suffix == ".npz" else load_safetensors
    _same(loader(path).tensors, _arrays())
    assert file_cid(encode(back)) == file_cid(encode(Gradient(_arrays(), {"round": 3})))


@pytest.mark.parametrize(
    ("suffix", "writer"), [(".npz", write_npz), (".safetensors", write_safetensors)]
)
def test_a_stream_gets_the_bytes_a_saved_file_holds(
    tmp_path: Path, suffix: str, writer: Any
) -> None:
    """A seekable stream, and one that cannot seek (a pipe: zip's data descriptors)."""
    path = tmp_path / f"g{suffix}"
    save_gradient(path, Gradient(_arrays()))
    seekable = io.BytesIO()
    writer(seekable, Gradient(_arrays()))
    assert seekable.getvalue() == path.read_bytes()
    pipe = io.BytesIO()
    writer(SequentialWriter(pipe), Gradient(_arrays()))
    piped = tmp_path / f"piped{suffix}"
    piped.write_bytes(pipe.getvalue())
    _same(load_gradient(piped).tensors, _arrays())


@pytest.mark.parametrize(
    ("tensors", "says"),
    [
        ({"a": np.ones(3), "b": np.array([None, 1], dtype=object)}, "holds Python objects"),
        ({"a": np.ones(3), "b": np.ones(2, ml_dtypes.bfloat16)}, "which .npz cannot hold"),
        ({"a": np.ones(3), "../b": np.ones(2)}, "tensor name '../b'"),
    ],
    ids=["objects", "bfloat16", "name"],
)
def test_write_npz_refuses_before_the_first_byte(tensors: dict[str, Any], says: str) -> None:
    """A pipe or a device cannot take back what was written: nothing of tensor 'a' is."""
    out = io.BytesIO()
    with pytest.raises(FormatError, match=re.escape(says)):
        write_npz(out, Gradient(tensors))
    assert out.getvalue() == b""


def test_write_safetensors_refuses_before_the_first_byte() -> None:
    out = io.BytesIO()
    with pytest.raises(FormatError, match=re.escape("tensor name '../b'")):
        write_safetensors(out, Gradient({"a": np.ones(3), "../b": np.ones(2)}))
    assert out.getvalue() == b""


def test_open_gradient_streams_plain_arrays_and_reads_other_files_whole(tmp_path: Path) -> None:
    plain, bools, st = tmp_path / "p.npz", tmp_path / "b.npz", tmp_path / "s.safetensors"
    np.savez(plain, **_arrays())
    np.savez(bools, **_arrays(), flags=np.array([True, False]))
    save_gradient(st, Gradient(_arrays()))
    for path, kind in ((plain, NpzStream), (bools, LoadedGradient), (st, LoadedGradient)):
        with open_gradient(path, {"round": 1}) as source:
            assert isinstance(source, kind), path
            got = file_cid(source.document())
        assert got == file_cid(encode(load_gradient(path, {"round": 1}))), path


def test_write_document_npz_refuses_what_is_not_npy_bytes() -> None:
    narrow = encode(Gradient({"w": np.ones(4, ml_dtypes.bfloat16)})).tobytes()
    out = io.BytesIO()
    with pytest.raises(FormatError, match="decode it and use write_npz"):
        write_document_npz(out, read_header(narrow), memoryview(narrow))
    assert out.getvalue() == b""


def _readme_example() -> str:
    text = README.read_text()
    section = text.split("### Tensor files from Python", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "the README's section has no python example"
    return match.group(1)


def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _readme_example()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    update = load_gradient(tmp_path / "update.npz", {"round": 3})
    assert done.stdout == f"{file_cid(encode(update))}\n"
    for name in ("update.safetensors", "copy.npz"):
        _same(load_gradient(tmp_path / name).tensors, dict(update.tensors))


def test_without_the_safetensors_extra_only_its_files_fail_naming_it(tmp_path: Path) -> None:
    """``gradstore.files`` imports (and loads no NumPy) without safetensors; .npz works;
    every use of a .safetensors file raises MissingExtraError naming the extra."""
    np.savez(tmp_path / "g.npz", w=np.ones(3, np.float32))
    (tmp_path / "g.safetensors").write_bytes(b"not even read")
    code = """
import io, sys
sys.modules["safetensors"] = None  # `import safetensors` now fails
sys.modules["safetensors.numpy"] = None
import gradstore.files as files
assert "numpy" not in sys.modules, "importing gradstore.files loaded NumPy"
from gradstore.errors import MissingExtraError
g = files.load_gradient("g.npz")
files.save_gradient("back.npz", g)
uses = {
    "load": lambda: files.load_gradient("g.safetensors"),
    "save": lambda: files.save_gradient("out.safetensors", g),
    "write": lambda: files.write_safetensors(io.BytesIO(), g),
    "open": lambda: files.open_gradient("g.safetensors"),
}
for use, call in uses.items():
    try:
        call()
    except MissingExtraError as exc:
        assert exc.extra == "safetensors", exc
        print(use, exc)
    else:
        raise AssertionError(use + " worked without safetensors")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    hint = ".safetensors files: install the optional extra 'safetensors'"
    assert done.stdout.splitlines() == [
        f"{u} {hint} (pip install 'gradstore[safetensors]')"
        for u in ("load", "save", "write", "open")
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.npz", "g.npz", "g.safetensors"]
