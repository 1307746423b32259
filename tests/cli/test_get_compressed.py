"""get and decode of a compressed document (gradstore/2): the decompressed tensors, in each
tensor's declared dtype by default, the exact float64 values with --float64, within
--max-bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from gradstore.compress import compress
from gradstore.compress._round import bf16_bits
from gradstore.files import load_gradient
from gradstore.format import CompressedGradient, CompressedTensor, Gradient, decode_any, encode
from gradstore.node import KuboDaemon

from .conftest import Cli
from .helpers import SEED, write_npz

Array = np.ndarray[Any, Any]
INT8 = "int8"  # block 4096: the 12,000-element tensor spans three blocks
TOPK = "topk:0.1"  # bf16 values, chunks of 4096


def _arrays() -> dict[str, Array]:
    rng = np.random.default_rng(SEED)
    return {
        "w": (rng.standard_normal((40, 300)) * 3).astype(np.float32),
        "b": rng.standard_normal(30),  # float64 stays float64
    }


def _load(path: Path) -> dict[str, Array]:
    if path.suffix == ".safetensors":
        return safetensors.numpy.load_file(path)
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _put(cli: Cli, kubo: KuboDaemon, tmp_path: Path, spec: str) -> tuple[str, CompressedGradient]:
    """Put ``_arrays()`` with ``--compress spec``; its CID and its document as Kubo serves it."""
    src = write_npz(tmp_path / "g.npz", **_arrays())
    r = cli("put", src, "--compress", spec, "--api", kubo.api_url)
    assert r.code == 0, r.err
    served = decode_any(np.frombuffer(kubo.run("cat", r.line).stdout, np.uint8))
    assert isinstance(served, CompressedGradient)
    return r.line, served


def _within_int8_bound(x: Array, got: Array, block: int) -> None:
    """spec.md 2.4: ``|x' - x| <= m / 254 * (1 + 2^-23)`` per block; plus the one rounding of
    ``scale * q`` to float32 (half an ulp)."""
    flat_x, flat_got = x.reshape(-1).astype(np.float64), got.reshape(-1).astype(np.float64)
    for lo in range(0, flat_x.size, block):
        xs, gs = flat_x[lo : lo + block], flat_got[lo : lo + block]
        m = np.abs(xs).max()
        bound = m / 254 * (1 + 2**-23) + np.abs(gs) * 2**-24
        assert (np.abs(gs - xs) <= bound).all(), f"block at {lo}, seed {SEED}"


def _within_topk_bound(x: Array, got: Array, tensor: CompressedTensor) -> None:
    """spec.md 2.4: kept values within bf16's bound, dropped ones (written 0) no larger than
    the smallest kept magnitude of their chunk. Which were kept: the document says."""
    chunk = tensor.codec.chunk
    flat_x, flat_got = x.reshape(-1).astype(np.float64), got.reshape(-1).astype(np.float64)
    for lo in range(0, flat_x.size, chunk):
        hi = min(lo + chunk, flat_x.size)
        positions, _ = tensor.sparse(lo, hi)
        xs, gs = flat_x[lo:hi], flat_got[lo:hi]
        kept = np.zeros(hi - lo, bool)
        kept[positions] = True
        assert kept.sum() > 0
        bound = np.maximum(2**-8 * np.abs(xs[kept]), 2**-134)
        assert (np.abs(gs[kept] - xs[kept]) <= bound).all(), f"chunk at {lo}, seed {SEED}"
        assert (gs[~kept] == 0).all()
        assert (np.abs(xs[~kept]) <= np.abs(xs[kept]).min()).all(), f"chunk at {lo}"


@pytest.mark.kubo
@pytest.mark.parametrize("spec", [INT8, TOPK])
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_get_of_a_compressed_cid_writes_the_declared_dtypes_within_the_codec_bound(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path, spec: str, suffix: str
) -> None:
    cid, served = _put(cli, kubo, tmp_path, spec)
    out = tmp_path / f"back{suffix}"
    r = cli("get", cid, "-o", out, "--api", kubo.api_url)
    assert (r.code, r.line) == (0, str(out)), r.err  # stdout as for a dense document
    assert r.err.splitlines() == [
        f"{cid}: compressed with codec {served.codec} (gradstore/2); "
        "decompressed to each tensor's declared dtype"
    ]
    got, original = _load(out), _arrays()
    assert got.keys() == original.keys()
    for name, x in original.items():
        assert (got[name].dtype, got[name].shape) == (x.dtype, x.shape), name
        if spec == INT8:
            _within_int8_bound(x, got[name], served.codec.block)
        else:
            _within_topk_bound(x, got[name], served.tensors[name])
        # the exact values rounded once to the declared dtype (NumPy's casts to float32
        # and float64 round correctly)
        exact = served.tensors[name].decompress()
        assert got[name].tobytes() == exact.astype(x.dtype).tobytes(), name


@pytest.mark.kubo
@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_get_float64_writes_the_exact_decompressed_values(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path, suffix: str
) -> None:
    cid, served = _put(cli, kubo, tmp_path, TOPK)
    out = tmp_path / f"exact{suffix}"
    r = cli("get", cid, "-o", out, "--float64", "--api", kubo.api_url)
    assert (r.code, r.line) == (0, str(out)), r.err
    assert r.err.endswith("decompressed to float64\n")
    got, want = _load(out), served.decompress()
    assert got.keys() == want.tensors.keys()
    for name, exact in want.tensors.items():
        assert got[name].dtype == np.float64 and got[name].shape == exact.shape
        assert got[name].tobytes() == exact.tobytes(), name  # bit for bit


@pytest.mark.kubo
def test_get_of_a_compressed_cid_respects_max_bytes(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    cid, served = _put(cli, kubo, tmp_path, INT8)
    assert served.dense_nbytes <= 64 * 1024 < 8 * sum(t.size for t in served.tensors.values())
    out = tmp_path / "back.npz"
    # the declared dtypes fit 64 KiB; their float64 values do not
    r = cli("get", cid, "-o", out, "--max-bytes", "64KiB", "--api", kubo.api_url)
    assert r.code == 0, r.err
    out.unlink()
    line = cli(
        "get", cid, "-o", out, "--float64", "--max-bytes", "64KiB", "--api", kubo.api_url
    ).one_error_line()
    assert cid in line and "--max-bytes 65536" in line and "float64" in line
    assert not out.exists()

    # a few hundred bytes of topk standing for 16 MiB of float32: refused before allocating
    tiny = tmp_path / "zeros.npz"
    write_npz(tiny, z=np.zeros(1 << 22, np.float32))
    r = cli("put", tiny, "--compress", "topk:chunk=65536,k=1", "--api", kubo.api_url)
    assert r.code == 0, r.err
    assert len(kubo.run("cat", r.line).stdout) < 4096
    for extra in ([], ["--float64"]):
        line = cli(
            "get", r.line, "-o", out, *extra, "--max-bytes", "1MiB", "--api", kubo.api_url
        ).one_error_line()
        assert "--max-bytes 1048576" in line
        assert not out.exists()


@pytest.mark.kubo
def test_get_float64_of_a_dense_cid_is_a_usage_error(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    src = write_npz(tmp_path / "g.npz", **_arrays())
    cid = cli("put", src, "--api", kubo.api_url).line
    out = tmp_path / "back.npz"
    line = cli("get", cid, "-o", out, "--float64", "--api", kubo.api_url).one_error_line(2)
    assert "--float64 is for compressed documents" in line and cid in line
    assert not out.exists()
    r = cli("get", cid, "-o", out, "--api", kubo.api_url)  # without it: as before, no note
    assert (r.code, r.line, r.err) == (0, str(out), "")
    with np.load(out) as got:
        for name, x in _arrays().items():
            assert got[name].dtype == x.dtype and got[name].tobytes() == x.tobytes()


def _document(tmp_path: Path, gradient: Gradient | CompressedGradient) -> Path:
    path = tmp_path / "doc.bin"
    with open(path, "wb") as f:
        encode(gradient).write_to(f)
    return path


def test_decode_of_a_compressed_document_file(cli: Cli, tmp_path: Path) -> None:
    compressed = compress(Gradient(_arrays(), {"round": 3}), INT8)
    doc = _document(tmp_path, compressed)
    r = cli("decode", doc, "-o", tmp_path / "out.npz")
    assert (r.code, r.line) == (0, str(tmp_path / "out.npz")), r.err
    assert f"compressed with codec {compressed.codec}" in r.err
    got = _load(tmp_path / "out.npz")
    for name, x in _arrays().items():
        assert got[name].dtype == x.dtype
        _within_int8_bound(x, got[name], compressed.codec.block)

    r = cli("decode", doc, "-o", tmp_path / "exact.safetensors", "--float64")
    assert r.code == 0, r.err
    got = _load(tmp_path / "exact.safetensors")
    for name, exact in compressed.decompress().tensors.items():
        assert got[name].tobytes() == exact.tobytes(), name

    line = cli(
        "decode", doc, "-o", tmp_path / "no.npz", "--float64", "--max-bytes", "64KiB"
    ).one_error_line()
    assert str(doc) in line and "--max-bytes 65536" in line
    assert not (tmp_path / "no.npz").exists()

    dense = _document(tmp_path, Gradient(_arrays()))
    line = cli("decode", dense, "-o", tmp_path / "no.npz", "--float64").one_error_line(2)
    assert "--float64 is for compressed documents" in line
    assert not (tmp_path / "no.npz").exists()


def test_decode_rounds_once_to_an_extended_declared_dtype(cli: Cli, tmp_path: Path) -> None:
    """int8 values of a bfloat16 tensor are up to 31-bit products, rounded to bfloat16 once:
    ``scale * 61`` here is 0x1.410000a8p+1, just above a bfloat16 tie, so it rounds up;
    a cast through float32 (``ml_dtypes``' before 0.7) lands on the tie and rounds down."""
    scale = np.array([float.fromhex("0x1.50c972p-5")], "<f4")
    q = np.array([127, 61, -61, 0, 122], np.int8)
    codec = compress(Gradient({"x": np.ones(5, ml_dtypes.bfloat16)}), INT8).codec
    payload = np.concatenate([scale.view(np.uint8), q.view(np.uint8)])
    tensor = CompressedTensor(codec, "bfloat16", (5,), payload)
    doc = _document(tmp_path, CompressedGradient(codec, {"x": tensor}))
    r = cli("decode", doc, "-o", tmp_path / "out.safetensors")
    assert r.code == 0, r.err
    got = load_gradient(tmp_path / "out.safetensors").tensors["x"]
    exact = tensor.decompress()
    assert got.dtype == ml_dtypes.bfloat16
    assert got.view(np.uint16).tolist() == bf16_bits(exact, "x").tolist()
    assert got.view(np.uint16)[1] == 0x4021  # not 0x4020, the double rounding


def test_decode_refuses_a_value_beyond_the_declared_dtype(cli: Cli, tmp_path: Path) -> None:
    """A hostile document: bf16 payload values too large for the float16 it declares.
    compress never writes one; the decoder accepts it; decode must not write infinities."""
    ok = compress(Gradient({"w": np.array([1.0, 1e10, 3.0], np.float32)}), "bf16")
    t = ok.tensors["w"]
    hostile = CompressedGradient(
        ok.codec, {"w": CompressedTensor(t.codec, "<f2", t.shape, t.payload)}
    )
    doc = _document(tmp_path, hostile)
    line = cli("decode", doc, "-o", tmp_path / "out.npz").one_error_line()
    assert "'w'" in line and "beyond the range" in line and "float16" in line
    assert not (tmp_path / "out.npz").exists()
    r = cli("decode", doc, "-o", tmp_path / "out.npz", "--float64")
    assert r.code == 0, r.err
    with np.load(tmp_path / "out.npz") as f:
        assert f["w"].tolist() == t.decompress().tolist()


def test_a_nan_does_not_hide_an_overflow_beside_it(cli: Cli, tmp_path: Path) -> None:
    """A NaN (which bf16 payloads may carry) in the same window as a value beyond float16's
    range: the overflow is still refused, element by element, not written as infinity."""
    ok = compress(Gradient({"w": np.array([2.0, 1e5, 3.0], np.float32)}), "bf16")
    t = ok.tensors["w"]
    bits = t.payload.view("<u2").copy()
    bits[0] = 0x7FC0  # a bfloat16 NaN (compress refuses NaN; the decoder allows it)
    hostile = CompressedGradient(
        ok.codec, {"w": CompressedTensor(t.codec, "<f2", t.shape, bits.view(np.uint8))}
    )
    line = cli("decode", _document(tmp_path, hostile), "-o", tmp_path / "out.npz").one_error_line()
    assert "'w'" in line and "beyond the range" in line
    assert not (tmp_path / "out.npz").exists()


def test_decode_refuses_fp16_values_beyond_a_float8_tensor(cli: Cli, tmp_path: Path) -> None:
    """float8_e4m3fn has no infinity: 10000 rounds to NaN there, a value never stored. The
    check used to look at the float64 window after rounding had overwritten it (bfloat16
    and float8 round in place), so the NaN was written; now it is refused like an overflow."""
    ok = compress(Gradient({"w": np.array([1.0, 1e4, 3.0], np.float32)}), "fp16")
    t = ok.tensors["w"]
    for code in ("float8_e4m3fn", "float8_e5m2"):
        hostile = CompressedGradient(
            ok.codec, {"w": CompressedTensor(t.codec, code, t.shape, t.payload)}
        )
        doc = _document(tmp_path, hostile)
        out = tmp_path / "out.safetensors"
        if code == "float8_e5m2":  # 10000 is within float8_e5m2 (57344): written, rounded
            r = cli("decode", doc, "-o", out)
            assert r.code == 0, r.err
            assert load_gradient(out).tensors["w"].astype(np.float64).tolist() == [1, 10240, 3]
            continue
        line = cli("decode", doc, "-o", out).one_error_line()
        assert "'w'" in line and "beyond the range" in line and "float8_e4m3fn" in line
        assert not out.exists()


def test_an_npz_refuses_extended_dtypes_before_anything_is_decompressed(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small document standing for a large bfloat16 tensor, asked for as .npz: refused
    from the header, without decompressing (which would cost up to --max-bytes of work)."""
    big = Gradient({"x": np.zeros(1 << 20, ml_dtypes.bfloat16)})
    doc = _document(tmp_path, compress(big, TOPK))

    def read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decompressed before the .npz check")

    monkeypatch.setattr(CompressedTensor, "read", read)
    line = cli("decode", doc, "-o", tmp_path / "out.npz").one_error_line()
    assert "bfloat16, which .npz cannot hold" in line and "--float64" in line
    assert not (tmp_path / "out.npz").exists()
