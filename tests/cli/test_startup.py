"""``gradstore --help`` and ``--version`` start fast: they import neither NumPy nor httpx.

Run as the user runs them: a new process of the installed command, its imports
listed by Python's own ``-X importtime`` (``PYTHONPROFILEIMPORTTIME``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gradstore import __version__
from gradstore.cli._main import build_parser
from gradstore.dag import file_cid
from gradstore.files import load_npz
from gradstore.format import encode
from gradstore.node import KuboDaemon

from .conftest import Cli

HEAVY = {"numpy", "httpx", "numba"}


def _command() -> list[str]:
    script = Path(sys.executable).parent / "gradstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "gradstore"]


def _imports(*args: str) -> tuple[str, set[str]]:
    """The stdout of ``gradstore *args`` and every module the process imported."""
    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(
        [*_command(), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc.stdout, modules


@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_import_neither_numpy_nor_httpx(flag: str) -> None:
    out, modules = _imports(flag)
    assert "gradstore.cli._main" in modules  # the listing works: it sees our own modules
    assert (
        out.startswith("usage: gradstore")
        if flag == "--help"
        else out == f"gradstore {__version__}\n"
    )
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"gradstore {flag} imported {heavy[:10]}"


def test_the_help_still_lists_every_command_and_the_methods_load_when_asked() -> None:
    out, _ = _imports("--help")
    for command in ("put", "get", "cid", "verify", "inspect", "coordinator", "peer", "demo"):
        assert f"\n  {command} " in out, command  # under its group's heading
    out, modules = _imports("aggregate", "--help")
    assert "one of: sum, mean, fedavg" in out
    assert "numpy" in modules  # the method list comes from the aggregate layer, on demand


def test_a_lazy_package_root_still_gives_every_public_name() -> None:
    code = (
        "import sys, gradstore\n"
        "assert 'numpy' not in sys.modules\n"
        "print(gradstore.Gradient.__module__, gradstore.KuboNode.__module__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.split() == ["gradstore.format._gradient", "gradstore.node.kubo.node"]


def _npz(tmp_path: Path) -> Path:
    path = tmp_path / "g.npz"
    np.savez(path, w=np.arange(1000, dtype=np.float32))
    return path


def test_cid_of_plain_arrays_imports_no_numpy_no_node_layer_and_no_event_loop(
    tmp_path: Path,
) -> None:
    """``gradstore cid`` hashes a file: it loads what that needs and nothing else (an
    ``.npz`` of plain arrays is streamed into its document byte for byte)."""
    out, modules = _imports("cid", str(_npz(tmp_path)))
    assert out.startswith("bafk")  # one raw block
    assert "gradstore.files._npz_stream" in modules  # the listing sees what it does load
    unwanted = {"numpy", "httpx", "asyncio", "numba", "multiformats", "gradstore.node"}
    found = sorted(m for m in modules if m in unwanted or m.split(".")[0] in unwanted)
    assert not found, f"gradstore cid imported {found[:10]}"


def test_encode_of_plain_arrays_streams_the_document_without_numpy(tmp_path: Path) -> None:
    """``gradstore encode`` writes what ``cid`` hashes, read from the file as it is
    written: no NumPy, and the bytes are the format's own encoding."""
    npz, doc = _npz(tmp_path), tmp_path / "g.doc"
    _, modules = _imports("encode", str(npz), "-o", str(doc))
    assert "gradstore.files._npz_stream" in modules
    assert "numpy" not in modules
    assert doc.read_bytes() == encode(load_npz(npz)).tobytes()


def test_cid_of_other_arrays_loads_numpy_and_gives_the_same_cid(tmp_path: Path) -> None:
    """A bool array's bytes must be checked: that file is read through NumPy, as before."""
    plain, bools = tmp_path / "p.npz", tmp_path / "b.npz"
    np.savez(plain, w=np.arange(4, dtype=np.uint8))
    np.savez(bools, w=np.arange(4, dtype=np.uint8), f=np.array([True, False]))
    _, modules = _imports("cid", str(bools))
    assert "numpy" in modules and "numpy.ma" not in modules  # (no masked-array check)
    for path in (plain, bools):  # streamed, and read through NumPy: the CID read whole
        out, _ = _imports("cid", str(path))
        assert out == f"{file_cid(encode(load_npz(path)))}\n"


@pytest.mark.kubo
def test_put_and_get_never_import_numba_nor_get_multiformats(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """numba compiles aggregation kernels: moving a gradient in or out must not load it."""
    cid, modules = _imports("put", str(_npz(tmp_path)), "--api", kubo.api_url)
    assert "httpx" in modules and not {m for m in modules if m.startswith("numba")}
    assert "numpy" not in modules  # a plain array is moved as bytes
    _, modules = _imports(
        "get", cid.strip(), "-o", str(tmp_path / "out.npz"), "--api", kubo.api_url
    )
    assert "httpx" in modules and not {m for m in modules if m.startswith("numba")}
    assert "multiformats" not in modules  # the CID argument is parsed with the stdlib
    assert "numpy" not in modules  # a dense document of numbers is written as bytes
    with np.load(tmp_path / "out.npz") as back:
        assert np.array_equal(back["w"], np.arange(1000, dtype=np.float32))


def test_node_commands_go_without_httpx_own_command_line(tmp_path: Path) -> None:
    """``import httpx`` loads httpx's CLI (click, rich: 35-40 ms) when both are installed;
    no gradstore command runs it, so none loads it."""
    assert importlib.util.find_spec("click") and importlib.util.find_spec("rich"), (
        "the extras bring click and rich (Flower needs them): without them this test proves nothing"
    )
    out, modules = _imports("put", str(_npz(tmp_path)), "--local", str(tmp_path / "node"))
    assert out.startswith("bafk")
    assert "httpx" in modules  # the node layer does load httpx itself
    found = sorted(m for m in modules if m.split(".")[0] in {"rich", "click"})
    assert not found, f"gradstore put imported {found[:10]}"


def test_put_of_plain_arrays_imports_no_numpy(tmp_path: Path) -> None:
    out, modules = _imports("put", str(_npz(tmp_path)), "--local", str(tmp_path / "node"))
    assert out.startswith("bafk") and "gradstore.store._put" in modules
    assert not {m for m in modules if m.split(".")[0] == "numpy"}


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("3", "3")])
def test_store_commands_start_openblas_with_one_thread_unless_told(
    tmp_path: Path, given: str | None, expected: str
) -> None:
    """They do no linear algebra: NumPy's BLAS thread pool is not started for nothing."""
    code = (
        "import os, sys\n"
        "from gradstore.cli import main\n"
        "assert main(['cid', sys.argv[1]]) == 0\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    proc = subprocess.run(
        [sys.executable, "-c", code, str(_npz(tmp_path))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert proc.stdout.splitlines()[-1] == expected


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_a_command_line_that_names_its_command_builds_only_that_parser_the_same() -> None:
    """Every command's parser (its help, its nested actions) is the same whether the whole
    command line is built (--help, a typo) or only the command that runs."""
    everything = _subparsers(build_parser())
    assert {"put", "get", "cid", "job", "audit", "demo"} <= everything.keys()
    for name, full in everything.items():
        alone = _subparsers(build_parser(name))
        assert list(alone) == [name]
        assert alone[name].format_help() == full.format_help(), name
        nested = [a for a in full._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:
            twin = next(
                a for a in alone[name]._actions if isinstance(a, argparse._SubParsersAction)
            )
            for sub, parser in action.choices.items():
                assert twin.choices[sub].format_help() == parser.format_help(), (name, sub)
    assert list(_subparsers(build_parser("pu"))) == list(everything)  # not a command: all


def test_options_before_the_command_and_typos_still_work(cli: Cli, tmp_path: Path) -> None:
    path = _npz(tmp_path)
    assert cli("--debug", "cid", path).line == cli("cid", path).line
    line = cli("pu", path).err.splitlines()[-1]
    assert "invalid choice: 'pu'" in line and "(did you mean 'put'?)" in line
