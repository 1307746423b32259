"""Store commands against a real Kubo daemon: what `put` stores is what `ipfs cat` serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
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


def _unserved_cid(cli: Cli, tmp_path: Path) -> str:
    """The CID of a gradient nobody has: Kubo would wait for it for as long as it is asked."""
    rng = np.random.default_rng(SEED + 1)
    return cli("cid", write_npz(tmp_path / "m.npz", w=rng.standard_normal(10))).line


def _commands(cid: str, tmp_path: Path) -> list[list[object]]:
    return [
        ["verify", cid],
        ["get", cid, "-o", tmp_path / "x.npz"],
        ["inspect", cid],
        ["round", "show", "bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua"],
    ]


def test_a_cid_nobody_serves_says_waiting_then_gives_up_naming_it_and_the_option(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    cid = _unserved_cid(cli, tmp_path)
    for argv in _commands(cid, tmp_path):
        target = str(argv[2] if argv[0] == "round" else cid)
        start = time.monotonic()
        r = cli(*argv, "--api", kubo.api_url, "--timeout", "4")
        took = time.monotonic() - start
        assert r.code == 1 and r.out == "", (argv, r)
        waiting, error = r.err.splitlines()  # after 3 s without progress, then the error
        assert waiting.startswith("waiting for ") and target in waiting, waiting
        assert "(Ctrl-C to stop" in waiting and "--timeout" in waiting
        assert error.startswith("error: gave up waiting for ") and target in error
        assert "nothing arrived for 4 s" in error and "--timeout S waits longer" in error
        assert 4 <= took < 30, took
    assert not (tmp_path / "x.npz").exists()


def test_a_cid_nobody_serves_says_at_once_that_the_node_has_no_peers_or_no_provider(
    cli: Cli, kubo_factory: Callable[..., list[KuboDaemon]], tmp_path: Path
) -> None:
    """Issue 24, item 2: the "waiting for" line (3 s in) says why the CID does not come,
    from the node's own word (swarm/peers, routing/findprovs), not 60 s of silence. The
    daemons have no routing, like the suite's: a lone one has no peers, a pair no provider."""
    cid = _unserved_cid(cli, tmp_path)
    lone, a, _b = kubo_factory(1)[0], *kubo_factory(2, connect=True)
    cases = [
        (lone, "the node has no peers, so no other node can send it this CID"),
        (a, "the node's routing found no provider of this CID; its 1 connected peer(s)"),
    ]
    for daemon, said in cases:
        for argv in [*_commands(cid, tmp_path)[:3], ["audit", "cid", cid]]:
            start = time.monotonic()
            r = cli(*argv, "--api", daemon.api_url, "--timeout", "4")
            assert r.code == 1 and time.monotonic() - start < 30, (argv, r)
            waiting, error = r.err.splitlines()
            assert waiting.startswith("waiting for ") and cid in waiting, waiting
            assert f": {said}" in waiting and said in error, (argv, r.err)


def test_the_waiting_line_comes_while_waiting(kubo: KuboDaemon, cli: Cli, tmp_path: Path) -> None:
    """As a process: the line is on stderr seconds before the command gives up."""
    cid = _unserved_cid(cli, tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSTORE_API")}
    start = time.monotonic()
    with subprocess.Popen(
        [sys.executable, "-m", "gradstore", "get", cid, "-o", str(tmp_path / "x.npz"),
         "--api", kubo.api_url, "--timeout", "8"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stderr is not None
            first = proc.stderr.readline()
            seen = time.monotonic() - start
            assert proc.poll() is None, "the command ended before saying it was waiting"
            assert first.startswith(f"waiting for CID {cid} from kubo {kubo.api_url}")
            assert proc.wait(timeout=60) == 1
            ended = time.monotonic() - start
            assert "nothing arrived for 8 s" in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    assert seen >= 2.5 and ended - seen >= 3, (seen, ended)


def test_every_node_command_has_a_default_timeout() -> None:
    from gradstore.cli._main import build_parser

    parser = build_parser()
    for argv in [*_commands("x", Path("out.npz")), ["put", "g.npz"]]:
        assert parser.parse_args([str(a) for a in argv]).timeout == 60.0, argv


def test_ipfs_path_api_file_names_the_node_like_the_ipfs_command(
    cli: Cli, kubo: KuboDaemon, npz: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # no --api, no GRADSTORE_API: the daemon that owns $IPFS_PATH gets the gradient
    monkeypatch.setenv("IPFS_PATH", str(kubo.repo))
    cid = cli("put", npz).line
    assert kubo.run("pin", "ls", "--type=recursive", cid).returncode == 0
    # an IPFS_PATH with no running daemon is named, not silently replaced by :5001
    monkeypatch.setenv("IPFS_PATH", str(tmp_path))
    line = cli("put", npz).one_error_line()
    assert f"IPFS_PATH={tmp_path} names no running Kubo daemon" in line and "--api" in line
    # --api and GRADSTORE_API still come first
    assert cli("verify", cid, "--api", kubo.api_url).code == 0
    monkeypatch.setenv("GRADSTORE_API", kubo.api_url)
    assert cli("verify", cid).code == 0


def test_a_cid_of_another_file_is_not_a_gradstore_document(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a gradient\n")
    cid = kubo.run("add", "-Q", str(text)).stdout.decode().strip()
    for argv in (["get", cid, "-o", tmp_path / "x.npz"], ["inspect", cid], ["verify", cid]):
        line = cli(*argv, "--api", kubo.api_url).one_error_line()
        assert line.startswith(f"error: {cid}: not a gradstore/1 document (")
        assert "'hello, t'" in line and "found int" not in line
