""".safetensors wherever the CLI takes or writes .npz: same tensors, same CID; bits survive."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from gradstore.aggregate import AggregationParams, aggregate
from gradstore.dag import file_cid
from gradstore.files import SAFETENSORS_DTYPES
from gradstore.format import DTYPES, EXTENDED, Gradient, encode, numpy_dtype

from .conftest import Cli
from .helpers import SEED, write_npz


def _array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    dt = numpy_dtype(dtype)
    assert dt is not None
    raw = rng.integers(0, 256, (*shape, dt.itemsize), dtype=np.uint8)
    if dtype == "|b1":
        raw &= 1
    return raw.view(dt).reshape(shape)  # every bit pattern: NaNs, -0, subnormals too


def _arrays(dtype: str, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "layer.0.weight": _array(dtype, (5, 7), seed),
        "scalar": _array(dtype, (), seed + 1),
        "empty": _array(dtype, (0, 3), seed + 2),
    }


def _read(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """A .safetensors file as safetensors itself reads it (kinds + raw bytes, no gradstore)."""
    out = {}
    with safetensors.safe_open(str(path), framework="np") as f:
        kinds = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
    for name, info in safetensors.deserialize(path.read_bytes()):
        assert info["dtype"] == kinds[name]
        dt = numpy_dtype(SAFETENSORS_DTYPES[info["dtype"]])
        assert dt is not None
        out[name] = np.frombuffer(info["data"], dt).reshape(info["shape"])
    return out


def _same(got: dict[str, np.ndarray[Any, Any]], want: dict[str, np.ndarray[Any, Any]]) -> None:
    assert got.keys() == want.keys()
    for name, a in want.items():
        assert got[name].dtype == a.dtype and got[name].shape == a.shape, name
        assert got[name].tobytes() == a.tobytes(), name


@pytest.mark.parametrize("dtype", DTYPES)
def test_encode_decode_cid_round_trip_every_dtype(cli: Cli, tmp_path: Path, dtype: str) -> None:
    arrays = _arrays(dtype, SEED + DTYPES.index(dtype))
    src = tmp_path / "in.safetensors"
    safetensors.numpy.save_file(arrays, str(src))  # what users hand us
    doc = tmp_path / "doc"
    assert cli("encode", src, "-o", doc).code == 0
    assert doc.read_bytes() == encode(Gradient(arrays)).tobytes()
    assert cli("cid", src).line == str(file_cid(encode(Gradient(arrays))))

    r = cli("decode", doc, "-o", tmp_path / "out.safetensors")
    assert r.code == 0, r.err
    _same(_read(tmp_path / "out.safetensors"), arrays)
    if dtype not in EXTENDED:  # the same tensors from an .npz: the same CID
        npz = write_npz(tmp_path / "in.npz", **arrays)
        assert cli("cid", npz).line == cli("cid", src).line
        assert cli("cid", tmp_path / "out.safetensors").line == cli("cid", npz).line


def test_mixed_dtypes_and_names_give_the_npz_cid(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    arrays = {
        "fc.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "fc.bias": rng.standard_normal(8),
        "steps": np.array(7, np.int64),
        "mask": rng.integers(0, 2, 9).astype(bool),
        "é/ü": np.arange(4, dtype=np.uint16),
    }
    st = tmp_path / "g.safetensors"
    safetensors.numpy.save_file(arrays, str(st))
    npz = write_npz(tmp_path / "g.npz", **arrays)
    assert cli("cid", st, "--meta", "round=3").line == cli("cid", npz, "--meta", "round=3").line
    # and the case of the extension does not matter
    upper = tmp_path / "G.SAFETENSORS"
    upper.write_bytes(st.read_bytes())
    assert cli("cid", upper).line == cli("cid", npz).line


def test_put_get_bf16_on_a_local_node(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    arrays = {
        "w": rng.standard_normal((64, 32)).astype(ml_dtypes.bfloat16),
        "e4": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
        "e5": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2),
    }
    src = tmp_path / "w.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    node = tmp_path / "node"
    cid = cli("put", src, "--local", node).line
    assert cid == str(file_cid(encode(Gradient(arrays))))
    r = cli("get", cid, "-o", tmp_path / "back.safetensors", "--local", node)
    assert r.code == 0, r.err
    _same(_read(tmp_path / "back.safetensors"), arrays)
    # an .npz cannot carry bfloat16: the refusal says what to use instead
    line = cli("get", cid, "-o", tmp_path / "back.npz", "--local", node).one_error_line()
    assert "which .npz cannot hold" in line and "write a .safetensors file instead" in line
    assert not (tmp_path / "back.npz").exists()


def test_aggregate_reads_and_writes_safetensors(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    arrays = [{"w": rng.standard_normal((30, 20)).astype(ml_dtypes.bfloat16)} for _ in range(3)]
    paths = []
    for i, a in enumerate(arrays):
        paths.append(tmp_path / f"in{i}.safetensors")
        safetensors.numpy.save_file(a, str(paths[i]))
    out = tmp_path / "mean.safetensors"
    r = cli("aggregate", "--method", "fedavg", "--num-samples", "3", "1", "2", *paths, "-o", out)
    assert (r.code, r.line) == (0, str(out)), r.err
    want = aggregate(arrays, AggregationParams("fedavg"), [3, 1, 2])
    _same(_read(out), want)


def test_npz_and_safetensors_inputs_mix(cli: Cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    arrays = [{"w": rng.standard_normal(50).astype(np.float32)} for _ in range(2)]
    a = write_npz(tmp_path / "a.npz", **arrays[0])
    b = tmp_path / "b.safetensors"
    safetensors.numpy.save_file(arrays[1], str(b))
    r = cli("aggregate", "--method", "mean", a, b, "-o", tmp_path / "out.npz")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as got:
        want = aggregate(arrays, AggregationParams("mean"))["w"]
        assert got["w"].tobytes() == want.tobytes()


def test_a_file_that_is_not_safetensors_is_refused(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    for content in (b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", b"PK\x03\x04 an npz", bytes(64)):
        bad.write_bytes(content)
        line = cli("encode", bad, "-o", tmp_path / "doc").one_error_line()
        assert "not a readable .safetensors file" in line or "holds no tensors" in line, line
    # a header whose offsets point past the data: safetensors' own parser refuses it
    good = tmp_path / "good.safetensors"
    safetensors.numpy.save_file({"w": np.zeros(4, np.float32)}, str(good))
    raw = good.read_bytes()
    bad.write_bytes(raw.replace(b'"data_offsets":[0,16]', b'"data_offsets":[0,99]'))
    assert "not a readable .safetensors file" in cli("cid", bad).one_error_line()
    assert not (tmp_path / "doc").exists()
    line = cli("cid", tmp_path / "absent.safetensors").one_error_line()
    assert line == f"error: no such file: {tmp_path / 'absent.safetensors'}"


def test_a_dtype_the_format_cannot_hold_is_named(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "c.safetensors"
    safetensors.numpy.save_file(
        {"ok": np.zeros(2, np.float32), "z": np.zeros(2, np.complex64)}, str(path)
    )
    line = cli("put", path, "--local", tmp_path / "node").one_error_line()
    assert "tensor 'z' is C64, which gradstore/1 cannot hold" in line


def test_a_failed_write_leaves_nothing_behind(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "doc"
    doc.write_bytes(encode(Gradient({"w": np.ones(3, np.float32)})).tobytes())
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"the previous file")

    def half_then_fail(tensors: Any, filename: str, metadata: Any = None) -> None:
        Path(filename).write_bytes(b"half a file")
        raise OSError(28, "No space left on device", filename)

    monkeypatch.setattr(safetensors.numpy, "save_file", half_then_fail)
    assert "No space left on device" in cli("decode", doc, "-o", out).one_error_line()
    assert out.read_bytes() == b"the previous file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc", "out.safetensors"]


def test_without_the_extra_the_cli_names_it(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "w.safetensors"
    safetensors.numpy.save_file({"w": np.zeros(2, np.float32)}, str(src))
    monkeypatch.setitem(sys.modules, "safetensors", None)  # `import safetensors` now fails
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    line = cli("cid", src).one_error_line()
    assert line == (
        "error: .safetensors files: install the optional extra 'safetensors' "
        "(pip install 'gradstore[safetensors]')"
    )
    doc = tmp_path / "doc"
    doc.write_bytes(encode(Gradient({"w": np.ones(3, np.float32)})).tobytes())
    assert "gradstore[safetensors]" in cli("decode", doc, "-o", tmp_path / "o.safetensors").err
    assert cli("decode", doc, "-o", tmp_path / "o.npz").code == 0  # .npz still works


def test_put_get_inspect_bf16_safetensors_on_kubo(cli: Cli, kubo: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    arrays = {
        "w": rng.standard_normal((800, 1000)).astype(ml_dtypes.bfloat16),  # 1.6 MB: 2 leaves
        "e4": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn),
    }
    src = tmp_path / "w.safetensors"
    safetensors.numpy.save_file(arrays, str(src))
    cid = cli("put", src, "--meta", "round=0", "--api", kubo.api_url).line
    assert cli("encode", src, "--meta", "round=0", "-o", tmp_path / "doc").code == 0
    only_hash = kubo.run("add", "--only-hash", "-Q", str(tmp_path / "doc")).stdout.decode()
    assert only_hash.strip() == cid  # Kubo's CID of the document: `ipfs add` of its bytes
    assert kubo.run("cat", cid).stdout == (tmp_path / "doc").read_bytes()
    r = cli("get", cid, "-o", tmp_path / "back.safetensors", "--api", kubo.api_url)
    assert r.code == 0, r.err
    _same(_read(tmp_path / "back.safetensors"), arrays)
    r = cli("inspect", cid, "--api", kubo.api_url)
    assert r.code == 0 and "float8_e4m3fn  (256,)" in r.out and "bfloat16" in r.out
