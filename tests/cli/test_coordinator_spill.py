"""``gradstore coordinator --spill``, ``--spill-dir DIR`` and ``--no-spill`` reach the
coordinator: it says where this run's spill files go (``-v``), and a start empties that
folder and its state's own (a crash's files are never trusted), nothing else."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gradstore.node import KuboDaemon

from .conftest import Cli
from .test_job_kubo import _kill, _start, _wait_topic

pytestmark = pytest.mark.kubo

#: flags -> where the spill files go (None: nowhere)
CASES: dict[str, tuple[list[str], str | None]] = {
    "default": ([], "{state}/spill"),
    "spill": (["--spill"], "{state}/spill"),
    "spill-dir": (["--spill-dir", "{fast}"], "{fast}/gradstore-spill-{name}"),
    "no-spill": (["--no-spill"], None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_spill_flags_choose_where_spill_files_go(
    cli: Cli, kubo: KuboDaemon, tmp_path: Path, case: str
) -> None:
    flags, where = CASES[case]
    keys = {name: tmp_path / f"{name}.key" for name in ("coord", "alice")}
    dids = {name: cli("keygen", "--out", path).line for name, path in keys.items()}
    name = f"spill-{case}-{os.getpid()}"
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "{name}"\ncoordinator = "{dids["coord"]}"\npeers = ["{dids["alice"]}"]\n'
        "[rounds]\ncount = 1\n"
    )
    state, fast = tmp_path / "state", tmp_path / "fast"
    own = state / "spill" / "round-3" / "left.doc"  # a crashed run's files, in both places
    other = fast / f"gradstore-spill-{name}" / "round-3" / "left.doc"
    for path in (own, other):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"from a crashed run")

    argv = [a.format(fast=fast) for a in flags]
    coord = _start(
        tmp_path, "coord", "coordinator", "--config", job, "--key", keys["coord"],
        "--api", kubo.api_url, "--state", state, "-v", *argv,
    )  # fmt: skip
    try:
        _wait_topic(kubo, f"gradstore/v1/{name}/gradients", [coord])  # started: folders emptied
        coord.send_signal(signal.SIGTERM)
        coord.wait(60)
    finally:
        _kill(coord)
    err = (tmp_path / "coord.err").read_text()
    assert "Traceback" not in err, err
    if where is None:
        assert "no spill files: the aggregation pass reads inputs back from the node" in err
    else:
        assert f"spill files in {where.format(state=state, fast=fast, name=name)}\n" in err
    assert not own.exists(), err  # the state's own folder: always emptied at a start
    assert other.exists() == (case != "spill-dir"), err
