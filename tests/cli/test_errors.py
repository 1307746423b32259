"""Failures: exit 1 and one clear ``error:`` line on stderr (no traceback unless --debug)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradstore.errors import (
    BlockNotFoundError,
    CIDError,
    FormatError,
    IntegrityError,
    NodeUnreachableError,
)

from .conftest import Cli
from .helpers import unused_url

A_CID = "bafkreibjywehwqrkfgeng2uzfuuphcr7cxggps37lzwaypwn2zkgmexfpu"  # sha256 of nothing stored


@pytest.mark.parametrize(
    "argv",
    [
        ["put", "{npz}"],
        ["get", A_CID, "-o", "{tmp}/x.npz"],
        ["verify", A_CID],
        ["inspect", A_CID],
        ["round", "show", "bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua"],
    ],
    ids=["put", "get", "verify", "inspect", "round-show"],
)
def test_unreachable_api_is_one_line_naming_the_url(
    cli: Cli, grad_npz: Path, tmp_path: Path, argv: list[str]
) -> None:
    url = unused_url()
    args = [a.format(npz=grad_npz, tmp=tmp_path) for a in argv]
    line = cli(*args, "--api", url).one_error_line()
    assert url in line
    assert "Kubo" in line or "kubo" in line
    assert not (tmp_path / "x.npz").exists()


def test_gradstore_api_env_picks_the_endpoint(
    cli: Cli, grad_npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = unused_url()
    monkeypatch.setenv("GRADSTORE_API", url)
    assert url in cli("put", grad_npz).one_error_line()
    other = unused_url()
    assert other in cli("put", grad_npz, "--api", other).one_error_line()  # the flag wins


@pytest.mark.parametrize("command", ["get", "verify", "inspect", "round"])
def test_bad_cid_string_is_refused_before_any_node(cli: Cli, tmp_path: Path, command: str) -> None:
    commands: dict[str, list[object]] = {
        "get": ["get", "notacid", "-o", tmp_path / "x.npz"],
        "verify": ["verify", "notacid"],
        "inspect": ["inspect", "notacid"],
        "round": ["round", "show", "notacid"],
    }
    argv = commands[command]
    # the unused API proves no node is contacted: the error is about the CID, not the URL
    line = cli(*argv, "--api", unused_url()).one_error_line()
    assert "notacid" in line and "CID" in line


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["get", "", "-o", "{tmp}/x.npz"], "the CID"),
        (["verify", ""], "the CID"),
        (["inspect", " "], "the CID or file"),
        (["round", "show", ""], "the record CID"),
        (["audit", "cid", ""], "the CID"),
        (["audit", "round", "", "--config", "{tmp}/job.toml"], "the record CID"),
        (["audit", "history", ""], "the head record CID"),
    ],
    ids=["get", "verify", "inspect", "round-show", "audit-cid", "audit-round", "audit-history"],
)
def test_an_empty_cid_is_a_usage_error_of_one_line_before_any_node(
    cli: Cli, tmp_path: Path, argv: list[str], what: str
) -> None:
    """What the walkthrough's audits got when ``peer await`` had failed (issue 24, item 1):
    ``read record < result.txt`` leaves ``$record`` empty. One line, exit 2, no node asked."""
    args = [a.format(tmp=tmp_path) for a in argv]
    line = cli(*args, "--api", unused_url()).one_error_line(2)
    assert line == (
        f"error: {what} is empty (when it comes from an earlier command's output, that "
        "command printed none: see its error)"
    )
    assert not (tmp_path / "x.npz").exists()


def test_missing_files_are_named(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "missing.npz"
    for argv in (
        ["put", missing, "--local", tmp_path / "n"],
        ["cid", missing],
        ["cid", "--raw", missing],
        ["encode", missing, "-o", tmp_path / "doc"],
        ["decode", missing, "-o", tmp_path / "out.npz"],
        ["aggregate", "--method", "mean", missing, "-o", tmp_path / "out.npz"],
    ):
        assert cli(*argv).one_error_line() == f"error: no such file: {missing}", argv


class _Trap:
    """Unpickling this creates ``path``: proof that a pickle was (not) executed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def test_npz_with_object_array_is_refused_without_unpickling(cli: Cli, tmp_path: Path) -> None:
    marker = tmp_path / "pickle-ran"
    objects = np.empty(1, dtype=object)
    objects[0] = _Trap(marker)
    np.savez(tmp_path / "evil.npz", w=np.ones(3), o=objects)  # savez pickles object arrays
    for argv in (
        ["cid", tmp_path / "evil.npz"],
        ["put", tmp_path / "evil.npz", "--local", tmp_path / "n"],
        ["aggregate", "--method", "sum", tmp_path / "evil.npz", "-o", tmp_path / "o.npz"],
    ):
        line = cli(*argv).one_error_line()
        assert "object array" in line and "allow_pickle=False" in line
        assert str(tmp_path / "evil.npz") in line
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("npy", "not an .npz file"),
        ("text", "not an .npz file"),
        ("empty-zip", "holds no arrays"),
        ("strings", "dtype"),
    ],
)
def test_input_that_is_not_an_npz_of_numbers(
    cli: Cli, tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "in.npz"
    if content == "npy":
        with open(path, "wb") as f:
            np.save(f, np.ones(3))
    elif content == "text":
        path.write_text("hello\n")
    elif content == "empty-zip":
        np.savez(path)
    else:
        np.savez(path, names=np.array(["a", "b"]))
    line = cli("cid", path).one_error_line()
    assert expected in line


def test_corrupted_document_file_is_refused_naming_it(
    cli: Cli, grad_npz: Path, tmp_path: Path
) -> None:
    doc = tmp_path / "doc"
    cli("encode", grad_npz, "-o", doc)
    data = bytearray(doc.read_bytes())
    truncated, flipped = tmp_path / "truncated", tmp_path / "flipped"
    truncated.write_bytes(data[:-5])
    data[3] ^= 0x20  # inside the "format" key
    flipped.write_bytes(data)
    for bad in (truncated, flipped):
        for argv in (["decode", bad, "-o", tmp_path / "out.npz"], ["inspect", bad]):
            line = cli(*argv).one_error_line()
            # the flip hits the fixed start: bytes that do not begin a document are "not a" one
            assert f"{bad}: not a valid gradstore document" in line or (
                f"{bad}: not a gradstore/1 document: expected key 'format' first" in line
            )
    assert not (tmp_path / "out.npz").exists()


def test_not_found_cid_on_local_node(cli: Cli, tmp_path: Path) -> None:
    node = tmp_path / "node"
    for argv in (["get", A_CID, "-o", tmp_path / "x.npz"], ["verify", A_CID], ["inspect", A_CID]):
        line = cli(*argv, "--local", node).one_error_line()
        assert f"block not found: {A_CID}" in line


def test_tampered_block_on_local_node_is_an_integrity_error(
    cli: Cli, grad_npz: Path, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    cid = cli("put", grad_npz, "--local", node).line
    block = node / "blocks" / cid
    data = bytearray(block.read_bytes())
    data[-1] ^= 1  # one bit of tensor data: the document still parses, the hash does not match
    os.chmod(block, 0o644)
    block.write_bytes(data)
    for argv in (["get", cid, "-o", tmp_path / "x.npz"], ["verify", cid], ["inspect", cid]):
        line = cli(*argv, "--local", node).one_error_line()
        assert cid in line and "integrity" in line
    assert not (tmp_path / "x.npz").exists()


def test_debug_raises_the_typed_error(cli: Cli, grad_npz: Path, tmp_path: Path) -> None:
    with pytest.raises(NodeUnreachableError):
        cli("--debug", "put", grad_npz, "--api", unused_url())
    with pytest.raises(CIDError):
        cli("verify", "notacid", "--debug")  # --debug after the subcommand works too
    with pytest.raises(FormatError):
        cli("decode", grad_npz, "-o", tmp_path / "o.npz", "--debug")  # an .npz is no document
    with pytest.raises(BlockNotFoundError):
        cli("get", A_CID, "-o", tmp_path / "x.npz", "--local", tmp_path / "n", "--debug")
    node = tmp_path / "node"
    cid = cli("put", grad_npz, "--local", node).line
    (node / "blocks" / cid).chmod(0o644)
    (node / "blocks" / cid).write_bytes(b"x")
    with pytest.raises(IntegrityError):
        cli("verify", cid, "--local", node, "--debug")


def test_unknown_subcommand_suggests_the_closest(cli: Cli) -> None:
    r = cli("verfy", A_CID)
    assert r.code == 2 and r.out == ""
    assert "did you mean 'verify'?" in r.err
    r = cli("inpsect", A_CID)
    assert "did you mean 'inspect'?" in r.err
    r = cli("zzzz")
    assert r.code == 2 and "did you mean" not in r.err


def test_usage_errors_return_2_and_version_0(cli: Cli) -> None:
    r = cli("get", A_CID)  # -o missing
    assert r.code == 2 and "-o/--output" in r.err
    r = cli("--version")
    assert r.code == 0 and r.out.startswith("gradstore ")


def test_console_behaviour_in_a_real_process(grad_npz: Path, tmp_path: Path) -> None:
    """``python -m gradstore``: results on stdout, one error line on stderr, exit codes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSTORE_API")}

    def run(*argv: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gradstore", *map(str, argv)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    ok = run("put", grad_npz, "--local", tmp_path / "node")
    assert ok.returncode == 0 and ok.stderr == ""
    assert ok.stdout.strip().startswith("bafkrei") and ok.stdout.count("\n") == 1

    bad = run("get", "notacid", "-o", tmp_path / "x.npz", "--local", tmp_path / "node")
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: ")

    usage = run("putt", grad_npz)
    assert usage.returncode == 2 and "did you mean 'put'?" in usage.stderr


def test_round_show_of_a_gradient_cid_is_refused(cli: Cli, grad_npz: Path, tmp_path: Path) -> None:
    node = tmp_path / "node"
    cid = cli("put", grad_npz, "--local", node).line
    line = cli("round", "show", cid, "--local", node).one_error_line()
    assert "dag-cbor" in line and cid in line


def _readme_exit_codes() -> dict[str, int]:
    """The README's exit code table: meaning -> code."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    rows = [line.split("|")[1:3] for line in readme.splitlines() if line.startswith("| ")]
    return {meaning.strip(): int(code) for code, meaning in rows if code.strip().isdigit()}


@pytest.mark.parametrize(
    "argv",
    [
        ["get", A_CID],  # -o missing: argparse
        ["put", "g.npz", "--max-bytes", "0"],
        ["get", A_CID, "-o", "x.npz", "--timeout", "-1"],
        ["cid", "g.npz", "--meta", "novalue"],
        ["aggregate", "--method", "sum", "-o", "x.npz"],  # no inputs
        ["verify", A_CID, "--api", "ftp://nowhere"],
    ],
    ids=["missing-option", "max-bytes-0", "negative-timeout", "meta", "no-inputs", "bad-api"],
)
def test_usage_errors_exit_with_the_code_the_readme_documents(
    cli: Cli, grad_npz: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(grad_npz.parent)
    codes = _readme_exit_codes()
    usage = next(code for meaning, code in codes.items() if "command line is wrong" in meaning)
    r = cli(*argv)
    assert r.code == usage, (r.code, r.err)
    assert r.out == "" and "Traceback" not in r.err
    assert codes[next(m for m in codes if m.startswith("the command ran and failed"))] == 1
