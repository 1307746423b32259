"""--compress and --residual on put and peer publish: compressed documents, residual files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradstore.compress import compress, load_residual, with_feedback
from gradstore.dag import file_cid
from gradstore.format import Gradient, encode
from gradstore.node import KuboDaemon

from .conftest import Cli
from .helpers import SEED, write_npz
from .test_job_kubo import _finish, _kill, _start_coordinator

SPEC = "topk:0.25,values=int8"


def _floats(seed: int = SEED) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((40, 30)).astype(np.float32),
        "b": rng.standard_normal(30),
    }


def test_put_compressed_stores_the_compressed_document(
    cli: Cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arrays = _floats()
    src = write_npz(tmp_path / "g.npz", **arrays)
    node = tmp_path / "node"
    r = cli("put", src, "--compress", SPEC, "--meta", "round=2", "--local", node)
    assert r.code == 0, r.err
    want = file_cid(encode(compress(Gradient(arrays, {"round": 2}), SPEC)))
    assert r.line == str(want)
    r = cli("inspect", r.line, "--local", node)
    assert r.code == 0, r.err
    first = r.out.splitlines()[0]
    assert "gradstore/2 (topk:chunk=4096,k=1024,index=12,values=int8)" in first
    assert cli("verify", str(want), "--local", node).code == 0
    # the audit script checks the compressed document's blocks, decoding and canonical form
    r = cli("audit", "cid", str(want), "--local", node)
    assert r.code == 0, r.err
    assert "canonical gradstore/2, CID re-derived" in r.out
    # get writes it decompressed (tests/cli/test_get_compressed.py)
    r = cli("get", str(want), "-o", tmp_path / "x.npz", "--local", node)
    assert r.code == 0 and "decompressed" in r.err


def test_inspect_says_how_many_elements_each_topk_tensor_kept(cli: Cli, tmp_path: Path) -> None:
    """topk:0.015 is k=61 of every 4096-element chunk: the header's k, not what a tensor
    kept (issue 24: "k=61 for a tensor that kept 10"). Each tensor's own count is listed,
    and it is what decompressing gives back."""
    rng = np.random.default_rng(SEED)
    arrays = {  # one short chunk; one short chunk of 10; a whole chunk and a short one
        "fc.weight": rng.standard_normal((10, 64)).astype(np.float32),
        "fc.bias": rng.standard_normal(10).astype(np.float32),
        "big": rng.standard_normal(5000).astype(np.float32),
    }
    src, node = write_npz(tmp_path / "g.npz", **arrays), tmp_path / "node"
    cid = cli("put", src, "--compress", "topk:0.015", "--local", node).line
    text = cli("inspect", cid, "--local", node).out.splitlines()
    assert "(topk:chunk=4096,k=61," in text[0]
    assert text[1].split() == ["name", "dtype", "shape", "kept", "bytes"]
    rows = {line.split()[0]: line for line in text[2:]}
    assert " 10 of 640 " in rows["fc.weight"] and " 1 of 10 " in rows["fc.bias"]
    assert " 75 of 5000 " in rows["big"]  # 61 + ceil(61 * 904 / 4096)
    info = json.loads(cli("inspect", cid, "--local", node, "--json").out)
    kept = {t["name"]: (t["kept"], t["elements"]) for t in info["tensors"]}
    assert kept == {"big": (75, 5000), "fc.bias": (1, 10), "fc.weight": (10, 640)}
    assert cli("get", cid, "-o", tmp_path / "back.npz", "--local", node, "--float64").code == 0
    with np.load(tmp_path / "back.npz") as back:
        assert {n: int(np.count_nonzero(back[n])) for n in back.files} == {
            n: k for n, (k, _) in kept.items()
        }
    # a dense codec keeps every element: no column, and its JSON counts them all
    dense = cli("put", src, "--compress", "int8", "--local", node).line
    assert "kept" not in cli("inspect", dense, "--local", node).out
    info = json.loads(cli("inspect", dense, "--local", node, "--json").out)
    assert all(t["kept"] == t["elements"] for t in info["tensors"])


def test_put_with_a_residual_file_feeds_back_what_was_left_out(cli: Cli, tmp_path: Path) -> None:
    node, residual = tmp_path / "node", tmp_path / "me.residual"
    first, second = _floats(1), _floats(2)
    cids = []
    for i, arrays in enumerate((first, second)):
        src = write_npz(tmp_path / f"g{i}.npz", **arrays)
        r = cli("put", src, "--compress", SPEC, "--residual", residual, "--local", node)
        assert r.code == 0, r.err
        cids.append(r.line)
    # the same two steps through the Python API give the same documents
    c1, left = with_feedback(Gradient(first), SPEC, None)
    c2, left = with_feedback(Gradient(second), SPEC, left)
    assert cids == [str(file_cid(encode(c1))), str(file_cid(encode(c2)))]
    saved = load_residual(residual)
    assert saved is not None and saved.keys() == left.keys()
    for name in left:
        assert saved[name].tobytes() == left[name].tobytes()


@pytest.mark.parametrize("command", ["put", "peer publish"])
@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("zstd", "unknown codec 'zstd'"),
        ("topk:2", "the ratio must be in (0, 1], got 2"),
        ("int8:0", "block"),
        ("", "non-empty"),
    ],
)
def test_a_malformed_compress_spec_is_a_usage_error_before_anything_is_read(
    cli: Cli, tmp_path: Path, command: str, spec: str, match: str
) -> None:
    """Exit 2, as the README's table says of a malformed value, with argparse's usage and
    the option named; the gradient (missing here), the job file and the node are not read."""
    missing = tmp_path / "missing.npz"
    job = ["--config", tmp_path / "job.toml", "--key", tmp_path / "k", "--round", "0"]
    argv = [*command.split(), missing, *(job if command != "put" else [])]
    r = cli(*argv, "--compress", spec, "--local", tmp_path / "node")
    assert (r.code, r.out) == (2, ""), r.err
    assert r.err.startswith(f"usage: gradstore {command} ")
    last = r.err.splitlines()[-1]
    assert last.startswith(f"gradstore {command}: error: argument --compress: "), last
    assert match in last
    assert not (tmp_path / "node").exists()


def test_a_residual_without_compress_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    src = write_npz(tmp_path / "g.npz", **_floats())
    r = cli("put", src, "--residual", tmp_path / "r.npz", "--local", tmp_path / "node")
    assert "add --compress" in r.one_error_line(2)


def test_put_compress_starts_openblas_with_one_thread(tmp_path: Path) -> None:
    """--compress is checked while the command line is parsed, which loads NumPy: put still
    starts its BLAS with one thread (it does no linear algebra), as without --compress."""
    code = (
        "import os, sys\n"
        "from gradstore.cli import main\n"
        "assert main(['put', sys.argv[1], '--compress', 'int8', '--local', sys.argv[2]]) == 0\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    src = write_npz(tmp_path / "g.npz", **_floats())
    proc = subprocess.run(
        [sys.executable, "-c", code, str(src), str(tmp_path / "node")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert proc.stdout.splitlines()[-1] == "1"


def test_integer_tensors_cannot_be_compressed(cli: Cli, tmp_path: Path) -> None:
    src = write_npz(tmp_path / "g.npz", w=np.ones(3), steps=np.array(7))
    line = cli("put", src, "--compress", "int8", "--local", tmp_path / "n").one_error_line()
    assert "'steps'" in line and "only float" in line


def test_peer_publish_compressed_keeps_the_residual_next_to_its_key(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    api = kubo.api_url
    keys = {name: tmp_path / f"{name}.key" for name in ("coord", "alice")}
    dids = {name: cli("keygen", "--out", path).line for name, path in keys.items()}
    job_name = f"cli-compress-{os.getpid()}"
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "{job_name}"\ncoordinator = "{dids["coord"]}"\npeers = ["{dids["alice"]}"]\n'
        '[aggregation]\nmethod = "mean"\n[rounds]\ncount = 1\nquorum = 1\ndeadline_s = 60\n'
    )
    src = write_npz(tmp_path / "g.npz", **_floats())
    coord = _start_coordinator(tmp_path, kubo, job, keys["coord"], job_name)
    try:
        r = cli(
            "peer", "publish", "--config", job, "--key", keys["alice"], "--round", 0,
            "--timeout", 60, "--api", api, "--compress", SPEC, src,
        )  # fmt: skip
        assert r.code == 0, r.err
        coord_out = _finish(tmp_path, "coord", coord)
    finally:
        _kill(coord)
    residual = tmp_path / f"alice.key.residual-{job_name}"
    saved = load_residual(residual)
    _, left = with_feedback(Gradient(_floats()), SPEC, None)
    assert saved is not None and all(saved[n].tobytes() == left[n].tobytes() for n in left)
    record = re.search(r"record (baf[a-z2-7]+)", coord_out)
    assert record, coord_out
    r = cli("audit", "round", record.group(1), "--api", api, "--coordinator", dids["coord"])
    assert r.code == 0, r.err
    # round show names the record's type and each input's codec
    shown = cli("round", "show", record.group(1), "--api", api)
    assert shown.code == 0, shown.err
    doc = json.loads(shown.out)
    assert doc["type"] == "gradstore/round/4"
    (entry,) = [p for p in doc["peers"] if p["status"] == "aggregated"]
    assert entry["codec"]["name"] == SPEC.split(":")[0]
