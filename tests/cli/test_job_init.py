"""``gradstore job init``: a job file from key files, loadable by the coordinator's own loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradstore.job import load_job

from .conftest import Cli


@pytest.fixture
def keys(cli: Cli, tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """name -> (key file, its did:key)."""
    out = {}
    for name in ("coord", "alice", "bob"):
        path = tmp_path / f"{name}.key"
        out[name] = (path, cli("keygen", "--out", path).line)
    return out


def test_key_files_make_a_job_file_load_job_accepts(
    cli: Cli, tmp_path: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    out = tmp_path / "job.toml"
    r = cli(
        "job", "init", "--coordinator", keys["coord"][0], "--peer", keys["alice"][0],
        "--peer", keys["bob"][0], "--name", "walk", "--out", out,
    )  # fmt: skip
    assert (r.code, r.line) == (0, str(out))
    job = load_job(out)
    assert job.job == "walk" and job.coordinator == keys["coord"][1]
    assert job.peers == (keys["alice"][1], keys["bob"][1])
    assert (job.method, job.rounds.count, job.rounds.quorum, job.rounds.deadline_s) == (
        "fedavg", 1, 2, 60.0,
    )  # fmt: skip
    assert f"# {keys['alice'][0]}" in out.read_text()  # which file each id came from


def test_dids_and_options_are_written_and_checked(
    cli: Cli, tmp_path: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    out = tmp_path / "robust.toml"
    r = cli(
        "job", "init", "--coordinator", keys["coord"][1], "--peer", keys["alice"][1],
        "--peer", keys["bob"][0], "--method", "mean", "--clip-input-norm", "10",
        "--rounds", "0", "--quorum", "1", "--deadline", "30", "--max-gradient-bytes", "2GiB",
        "-o", out,
    )  # fmt: skip
    assert r.code == 0, r.err
    job = load_job(out)
    assert (job.method, job.clip_input_norm, job.rounds.count, job.rounds.quorum) == (
        "mean", 10.0, 0, 1,
    )  # fmt: skip
    assert job.rounds.deadline_s == 30.0 and job.limits.max_bytes == 2 << 30
    assert job.job.startswith("job-")  # a fresh name: another job's topics are not reused


def test_weighted_gets_a_weight_per_peer(
    cli: Cli, tmp_path: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    out = tmp_path / "w.toml"
    argv = ["--peer", keys["alice"][0], "--peer", keys["bob"][0], "--method", "weighted"]
    assert cli("job", "init", "--coordinator", keys["coord"][0], *argv, "-o", out).code == 0
    assert dict(load_job(out).weights) == {keys["alice"][1]: 1.0, keys["bob"][1]: 1.0}


def test_stdout_and_no_silent_overwrite(
    cli: Cli, tmp_path: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    argv = ["job", "init", "--coordinator", keys["coord"][0], "--peer", keys["alice"][0]]
    r = cli(*argv, "-o", "-")
    assert r.code == 0 and r.out.startswith("# gradstore job file") and r.err == ""
    existing = tmp_path / "job.toml"
    existing.write_text("mine\n")
    line = cli(*argv, "-o", existing, "--name", "walk").one_error_line(2)
    assert "exists: pass --force" in line and existing.read_text() == "mine\n"
    # starting over (issue 24, item 1): the journal of the job's coordinator goes too
    assert "remove gradstore-state/walk, or give it another --state" in line
    assert cli(*argv, "-o", existing, "--force").code == 0
    assert load_job(existing).peers == (keys["alice"][1],)


def test_what_the_coordinator_would_refuse_is_not_written(
    cli: Cli, tmp_path: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    out = tmp_path / "job.toml"
    base = ["job", "init", "--coordinator", keys["coord"][0], "--peer", keys["alice"][0]]
    line = cli(*base, "--quorum", "2", "-o", out).one_error_line()
    assert "`rounds.quorum` 2 is more than the 1 peers listed" in line
    line = cli(*base, "--peer", "did:key:z6Mkbogus", "-o", out).one_error_line(2)
    assert "--peer 'did:key:z6Mkbogus'" in line
    line = cli(*base, "--peer", tmp_path / "nokey", "-o", out).one_error_line()
    assert "no key file" in line
    assert not out.exists()


def test_the_commented_steps_example_loads_once_uncommented(
    cli: Cli, tmp_path: Path, keys: dict[str, tuple[Path, str]]
) -> None:
    out = tmp_path / "job.toml"
    argv = ["--peer", keys["alice"][0], "--peer", keys["bob"][0], "-o", out]
    assert cli("job", "init", "--coordinator", keys["coord"][0], *argv).code == 0
    assert not load_job(out).stepped  # commented out: one step of every tensor
    lines = out.read_text().splitlines()
    out.write_text("\n".join(x[1:] if x[:2] in ("#[", "#n", "#t", "#q") else x for x in lines))
    job = load_job(out)
    assert job.stepped and [s.name for s in job.steps] == ["head", "body"]
    assert job.plan.partition(["fc.w", "conv1.bias"]) == {
        "head": ("fc.w",),
        "body": ("conv1.bias",),
    }
