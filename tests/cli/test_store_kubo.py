"""Store commands against a real Kubo daemon: what `put` stores is what `ipfs cat` serves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradstore.node import KuboDaemon

from .conftest import Cli
from .helpers import SEED, write_npz

pytestmark = pytest.mark.kubo


@pytest.fixture(params=["small", "multi-block"])
def npz(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """One document in a single raw block, one over 1 MiB (a dag-pb file of several blocks)."""
    rng = np.random.default_rng(SEED)
    n = 100 if request.param == "small" else 400_000  # 1.6 MB of float32
    return write_npz(tmp_path / "g.npz", w=rng.standard_normal(n).astype(np.float32))


def test_put_stores_the_document_kubo_serves(
    cli: Cli, kubo: KuboDaemon, npz: Path, tmp_path: Path
) -> None:
    r = cli("put", npz, "--meta", "round=0", "--api", kubo.api_url)
    assert r.code == 0 and r.err == ""
    cid = r.line
    assert cid == cli("cid", npz, "--meta", "round=0").line

    cli("encode", npz, "--meta", "round=0", "-o", tmp_path / "doc")
    doc = (tmp_path / "doc").read_bytes()
    assert kubo.run("cat", cid).stdout == doc
    pins = kubo.run("pin", "ls", "--type=recursive", "--quiet", cid).stdout.decode().split()
    assert pins == [cid]
    # Kubo's own CID for the same bytes, under the unixfs-v1-2025 profile
    only_hash = kubo.run("add", "--only-hash", "-Q", str(tmp_path / "doc")).stdout.decode()
    assert only_hash.strip() == cid == cli("cid", "--raw", tmp_path / "doc").line


def test_get_verify_inspect_from_kubo(
    cli: Cli, kubo: KuboDaemon, npz: Path, tmp_path: Path
) -> None:
    cid = cli("put", npz, "--api", kubo.api_url).line

    r = cli("get", cid, "-o", tmp_path / "back.npz", "--api", kubo.api_url)
    assert (r.code, r.line) == (0, str(tmp_path / "back.npz"))
    with np.load(npz) as a, np.load(tmp_path / "back.npz", allow_pickle=False) as b:
        np.testing.assert_array_equal(a["w"], b["w"])

    r = cli("verify", cid, "--api", kubo.api_url)
    assert r.code == 0 and r.line.startswith(f"ok {cid}: ")

    info = json.loads(cli("inspect", cid, "--json", "--api", kubo.api_url).out)
    with np.load(npz) as a:
        assert info["tensors"][0]["shape"] == list(a["w"].shape)
    assert info["size"] == len(kubo.run("cat", cid).stdout)


def test_cid_raw_of_any_file_equals_ipfs_add_only_hash(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    rng = np.random.default_rng(SEED)
    for size in (0, 5, (1 << 20) + 1, 3 << 20):
        path = tmp_path / f"blob-{size}"
        rng.integers(0, 256, size, dtype=np.uint8).tofile(path)
        kubo_cid = kubo.run("add", "--only-hash", "-Q", str(path)).stdout.decode().strip()
        assert cli("cid", "--raw", path).line == kubo_cid, f"size {size}, seed {SEED}"


def test_missing_cid_on_kubo_gives_up_at_timeout_naming_it(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    # nobody has this gradient; Kubo would wait for it until its read timeout (minutes)
    rng = np.random.default_rng(SEED + 1)
    cid = cli("cid", write_npz(tmp_path / "m.npz", w=rng.standard_normal(10))).line
    for argv in (["verify", cid], ["get", cid, "-o", tmp_path / "x.npz"], ["inspect", cid]):
        line = cli(*argv, "--api", kubo.api_url, "--timeout", "1").one_error_line()
        assert line == f"error: {argv[0]} {cid}: no result from kubo {kubo.api_url} within 1s"
    assert not (tmp_path / "x.npz").exists()
