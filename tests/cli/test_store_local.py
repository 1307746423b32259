"""Store commands without Kubo: encode/decode/cid/inspect on files, put/get/verify/inspect on LocalNode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.cli._documents import parse_meta
from gradstore.cli._exit import UsageError
from gradstore.cli._main import build_parser
from gradstore.dag import file_cid
from gradstore.format import DTYPES, EXTENDED, Gradient, decode, encode

from .conftest import Cli
from .helpers import SEED, sample_arrays, unused_url, write_npz


def _array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return rng.standard_normal(shape).astype(dt)


def _load(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in EXTENDED])
def test_decode_of_encode_round_trips_every_dtype(cli: Cli, tmp_path: Path, dtype: str) -> None:
    seed = SEED + DTYPES.index(dtype)
    arrays = {
        "matrix": _array(dtype, (5, 7), seed),
        "scalar": _array(dtype, (), seed + 1),
        "empty": _array(dtype, (0, 3), seed + 2),
    }
    src = write_npz(tmp_path / "in.npz", **arrays)
    r = cli("encode", src, "-o", tmp_path / "doc")
    assert (r.code, r.line) == (0, str(tmp_path / "doc"))
    # the file is the canonical document of the same gradient
    assert (tmp_path / "doc").read_bytes() == encode(Gradient(arrays)).tobytes()

    r = cli("decode", tmp_path / "doc", "-o", tmp_path / "out.npz")
    assert r.code == 0, r.err
    back = _load(tmp_path / "out.npz")
    assert back.keys() == arrays.keys()
    for name, a in arrays.items():
        assert back[name].dtype == a.dtype, (name, seed)
        assert back[name].shape == a.shape
        np.testing.assert_array_equal(back[name], a, err_msg=f"seed {seed}")


def test_big_endian_input_is_stored_little_endian(cli: Cli, tmp_path: Path) -> None:
    a = np.arange(12, dtype=">f4").reshape(3, 4)
    src = write_npz(tmp_path / "be.npz", w=a)
    assert cli("encode", src, "-o", tmp_path / "doc").code == 0
    assert cli("decode", tmp_path / "doc", "-o", tmp_path / "out.npz").code == 0
    back = _load(tmp_path / "out.npz")["w"]
    assert back.dtype == np.dtype("<f4")
    np.testing.assert_array_equal(back, a)


def test_decode_writes_exactly_the_output_path_and_any_tensor_name(
    cli: Cli, tmp_path: Path
) -> None:
    # np.savez would append ".npz" to "out" and cannot take a tensor called "file"
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "file": np.ones(3, np.float32),
        "allow_pickle": np.zeros(2),
        "a/b.npy": np.ones(1),
    }
    (tmp_path / "doc").write_bytes(encode(Gradient(arrays)).tobytes())
    r = cli("decode", tmp_path / "doc", "-o", tmp_path / "out")
    assert (r.code, r.line) == (0, str(tmp_path / "out"))
    assert not (tmp_path / "out.npz").exists()
    back = _load(tmp_path / "out")
    assert back.keys() == arrays.keys()
    for name, a in arrays.items():
        np.testing.assert_array_equal(back[name], a)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_cid_is_the_document_cid_and_needs_no_node(
    cli: Cli, grad_npz: Path, tmp_path: Path
) -> None:
    expected = file_cid(encode(Gradient(sample_arrays())))
    r = cli("cid", grad_npz)
    assert (r.code, r.line, r.err) == (0, str(expected), "")


def test_cid_with_meta_matches_encode_with_meta(cli: Cli, grad_npz: Path, tmp_path: Path) -> None:
    meta = ("--meta", "round=3", "--meta", "peer=alice")
    with_meta = cli("cid", grad_npz, *meta).line
    assert with_meta != cli("cid", grad_npz).line
    assert cli("encode", grad_npz, "-o", tmp_path / "doc", *meta).code == 0
    assert with_meta == cli("cid", "--raw", tmp_path / "doc").line
    doc = decode(np.fromfile(tmp_path / "doc", dtype=np.uint8))
    assert doc.meta == {"round": 3, "peer": "alice"}


@pytest.mark.parametrize(
    "size", [0, 1, 1 << 20, (1 << 20) + 1], ids=["empty", "1B", "1MiB", "1MiB+1"]
)
def test_cid_raw_is_file_cid_of_the_bytes(cli: Cli, tmp_path: Path, size: int) -> None:
    data = np.random.default_rng(SEED).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "blob"
    data.tofile(path)
    assert cli("cid", "--raw", path).line == str(file_cid([data.data]))


@pytest.mark.parametrize(
    "options",
    [["--meta", "round=3"], ["--max-bytes", "1KiB"], ["--meta", "a=1", "--max-bytes", "9"]],
)
def test_cid_raw_refuses_the_options_of_a_document(
    cli: Cli, grad_npz: Path, options: list[str]
) -> None:
    """--raw hashes the bytes as they are: --meta (which would change a document's CID) and
    --max-bytes (which bounds one) are refused as a usage error, not silently dropped."""
    r = cli("cid", "--raw", grad_npz, *options)
    assert r.out == ""
    line = r.one_error_line(2)
    named = [o for o in ("--meta", "--max-bytes") if o in options]
    assert "--raw hashes the file's bytes as they are" in line
    assert all(o in line for o in named)


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("round=3", 3),
        ("lr=0.5", 0.5),
        ("peer=alice", "alice"),
        ('tag="3"', "3"),
        ("ok=true", True),
        ("note=null", None),
        ("layers=[1, 2]", [1, 2]),
        ("expr=a=b", "a=b"),
        ("empty=", ""),
    ],
)
def test_meta_values_parse_as_json_else_string(item: str, value: object) -> None:
    key = item.partition("=")[0]
    assert parse_meta([item]) == {key: value}


@pytest.mark.parametrize("item", ["novalue", "=3"])
def test_meta_without_key_or_equals_is_refused(cli: Cli, grad_npz: Path, item: str) -> None:
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_meta([item])
    line = cli("cid", grad_npz, "--meta", item).one_error_line(2)
    assert "--meta expects KEY=VALUE" in line


def test_meta_key_given_twice_is_refused(cli: Cli, grad_npz: Path) -> None:
    r = cli("put", grad_npz, "--meta", "a=1", "--meta", "a=2", "--local", grad_npz.parent / "n")
    line = r.one_error_line(2)
    assert "--meta a is given twice" in line


def test_meta_nan_is_refused_by_the_format(cli: Cli, grad_npz: Path) -> None:
    line = cli("cid", grad_npz, "--meta", "x=NaN").one_error_line()
    assert "finite" in line and "$.meta.x" in line


def test_put_get_verify_on_local_node(cli: Cli, grad_npz: Path, tmp_path: Path) -> None:
    node = tmp_path / "node"
    r = cli("put", grad_npz, "--meta", "round=1", "--local", node)
    assert r.code == 0 and r.err == ""
    cid = r.line
    assert cid == cli("cid", grad_npz, "--meta", "round=1").line
    assert (node / "blocks" / cid).is_file()

    r = cli("get", cid, "-o", tmp_path / "back.npz", "--local", node)
    assert (r.code, r.line) == (0, str(tmp_path / "back.npz"))
    back = _load(tmp_path / "back.npz")
    for name, a in sample_arrays().items():
        np.testing.assert_array_equal(back[name], a)
        assert back[name].dtype == a.dtype

    r = cli("verify", cid, "--local", node)
    assert r.code == 0
    assert r.line.startswith(f"ok {cid}: ")
    assert "1 blocks, 3 tensors" in r.line


def test_inspect_file_text_and_json(cli: Cli, grad_npz: Path, tmp_path: Path) -> None:
    doc = tmp_path / "doc"
    cli("encode", grad_npz, "-o", doc, "--meta", "round=2", "--meta", "kind=gradient")
    size = doc.stat().st_size

    r = cli("inspect", doc)
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    assert lines[0] == f"{doc}: gradstore/1, {size} bytes, 3 tensors"
    assert "  kind = 'gradient'" in lines and "  round = 2" in lines
    table = lines[lines.index("meta:") + 3 :]
    assert table[0].split() == ["name", "dtype", "shape", "bytes"]
    rows = [row.split(None, 2) for row in table[1:]]
    # sorted by name; columns line up under the header
    assert [row[0] for row in rows] == ["layer1.bias", "layer1.weight", "steps"]
    assert rows[1][1] == "<f4" and rows[1][2].split() == ["(16,", "8)", "512"]
    assert rows[0][2].split() == ["(8,)", "64"]
    assert rows[2][2].split() == ["()", "8"]
    name_col = table[0].index("dtype")
    assert all(row.index("<") == name_col for row in table[1:])

    r = cli("inspect", doc, "--json")
    info = json.loads(r.out)
    assert info["source"] == str(doc) and info["size"] == size
    assert info["meta"] == {"kind": "gradient", "round": 2}
    assert [(t["name"], t["dtype"], t["shape"], t["nbytes"]) for t in info["tensors"]] == [
        ("layer1.bias", "<f8", [8], 64),
        ("layer1.weight", "<f4", [16, 8], 512),
        ("steps", "<i8", [], 8),
    ]
    assert all(t["offset"] % 64 == 0 for t in info["tensors"])


def test_inspect_cid_on_local_node(cli: Cli, grad_npz: Path, tmp_path: Path) -> None:
    node = tmp_path / "node"
    cid = cli("put", grad_npz, "--meta", "round=5", "--local", node).line
    r = cli("inspect", cid, "--local", node, "--json")
    assert r.code == 0
    info = json.loads(r.out)
    assert info["source"] == cid
    assert info["meta"] == {"round": 5}
    assert [t["name"] for t in info["tensors"]] == ["layer1.bias", "layer1.weight", "steps"]
    text = cli("inspect", cid, "--local", node)
    assert text.out.splitlines()[0].startswith(f"{cid}: gradstore/1, ")


def test_max_bytes_bounds_get_decode_and_inspect(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Documents over --max-bytes are refused before they are fetched whole; a larger bound admits them."""
    import numpy as np

    from gradstore.cli import main

    npz = tmp_path / "g.npz"
    np.savez(npz, w=np.arange(300_000, dtype=np.float32))  # ~1.2 MB document
    node = str(tmp_path / "node")
    doc = tmp_path / "g.doc"
    assert main(["encode", str(npz), "-o", str(doc)]) == 0
    assert main(["decode", str(doc), "-o", str(tmp_path / "x.npz"), "--max-bytes", "100000"]) == 1
    assert main(["decode", str(doc), "-o", str(tmp_path / "x.npz"), "--max-bytes", "2000000"]) == 0
    assert main(["inspect", str(doc), "--max-bytes", "100000"]) == 1
    capsys.readouterr()
    assert main(["put", str(npz), "--local", node]) == 0
    cid = capsys.readouterr().out.strip()
    out = str(tmp_path / "y.npz")
    assert main(["get", cid, "-o", out, "--local", node, "--max-bytes", "100000"]) == 1
    assert "limit" in capsys.readouterr().err.lower()
    assert main(["get", cid, "-o", out, "--local", node, "--max-bytes", "2000000"]) == 0
    assert main(["verify", cid, "--local", node, "--max-bytes", "100000"]) == 1


def test_npz_cannot_carry_bfloat16_and_says_so(cli: Cli, tmp_path: Path) -> None:
    import ml_dtypes

    doc = tmp_path / "doc"
    doc.write_bytes(encode(Gradient({"w": np.ones(3, ml_dtypes.bfloat16)})).tobytes())
    r = cli("decode", doc, "-o", tmp_path / "out.npz")
    assert "tensor 'w' is bfloat16, which .npz cannot hold" in r.one_error_line()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc"]  # nothing half-written
    # what NumPy itself writes for a bfloat16 array: raw bytes, refused with the reason
    src = write_npz(tmp_path / "np.npz", w=np.ones(3, ml_dtypes.bfloat16))
    r = cli("encode", src, "-o", tmp_path / "doc2")
    assert "member 'w' is raw bytes (|V2)" in r.one_error_line()
    assert not (tmp_path / "doc2").exists()


def test_what_put_stores_get_fetches_with_the_same_max_bytes(cli: Cli, tmp_path: Path) -> None:
    npz = write_npz(tmp_path / "g.npz", w=np.arange(1000, dtype=np.float32))
    size = len(encode(load_gradient_for_test(npz)).tobytes())
    node, out = tmp_path / "node", tmp_path / "out.npz"
    # one byte over: put refuses before storing anything, naming the option
    line = cli("put", npz, "--local", node, "--max-bytes", size - 1).one_error_line()
    assert f"document is {size} bytes" in line and f"--max-bytes {size - 1}" in line
    assert not (node / "blocks").exists() or not any((node / "blocks").iterdir())
    # at the limit: put stores it and get, with the same limit, fetches it
    cid = cli("put", npz, "--local", node, "--max-bytes", size).line
    assert cli("get", cid, "-o", out, "--local", node, "--max-bytes", size).code == 0
    line = cli("get", cid, "-o", out, "--local", node, "--max-bytes", size - 1).one_error_line()
    assert "--max-bytes" in line and cid in line


def test_put_refuses_by_default_what_get_refuses_by_default(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor of exactly 1 GiB makes a document just over get's default: put says so first."""
    import gradstore.cli._store_cmds as store_cmds
    from gradstore.files import LoadedGradient

    huge = Gradient({"w": np.zeros(1 << 30, np.uint8)})  # calloc'd: no memory is touched
    monkeypatch.setattr(
        store_cmds, "open_gradient", lambda path, meta=None: LoadedGradient(huge, path)
    )
    line = cli("put", "huge.npz", "--api", unused_url()).one_error_line()  # no node contacted
    assert line.startswith("error: put huge.npz: document is 1073741") and "over max_bytes" in line
    assert "the limit is --max-bytes 1073741824; pass a larger --max-bytes N" in line
    assert build_parser().parse_args(["get", "x", "-o", "y"]).max_bytes is None  # one default
    assert build_parser().parse_args(["put", "x", "--max-bytes", "2GiB"]).max_bytes == 2 << 30


@pytest.mark.parametrize("command", ["encode", "cid", "put"])
def test_what_decode_and_get_refuse_is_refused_first_naming_the_file(
    cli: Cli, tmp_path: Path, command: str
) -> None:
    """encode, cid and put check a document against the limits its readers apply: a tensor
    of rank 33 (over max_rank, which no option raises) and a document over --max-bytes
    give no document, no CID and no stored block, and the refusal names the file."""
    deep = write_npz(tmp_path / "deep.npz", w=np.zeros((1,) * 33, np.float32))
    args = {
        "encode": ["-o", tmp_path / "out.doc"],
        "cid": [],
        "put": ["--local", tmp_path / "node"],
    }
    r = cli(command, deep, *args[command])
    assert r.code == 1 and r.out == ""
    assert r.one_error_line() == (
        f"error: {command} {deep}: tensor 'w' has rank 33, over max_rank=32 "
        "(a limit every reader applies by default, which no option raises)"
    )
    assert not (tmp_path / "out.doc").exists() and not (tmp_path / "node").exists()
    # what decode and get refuse by default they refuse too, and what they read they accept
    assert cli("decode", _document(tmp_path, deep), "-o", tmp_path / "x.npz").code == 1
    flat = write_npz(tmp_path / "flat.npz", w=np.arange(1000, dtype=np.float32))
    size = len(encode(load_gradient_for_test(flat)).tobytes())
    line = cli(command, flat, *args[command], "--max-bytes", size - 1).one_error_line()
    assert line.startswith(f"error: {command} {flat}: document is {size} bytes")
    assert f"the limit is --max-bytes {size - 1}" in line
    assert cli(command, flat, *args[command], "--max-bytes", size).code == 0


def _document(tmp_path: Path, npz: Path) -> Path:
    """The document of ``npz`` written by the format itself, whatever its limits."""
    doc = tmp_path / f"{npz.stem}.doc"
    doc.write_bytes(encode(load_gradient_for_test(npz)).tobytes())
    return doc


def load_gradient_for_test(path: Path) -> Gradient:
    with np.load(path) as npz:
        return Gradient({name: npz[name] for name in npz.files})
