"""``gradstore coordinator``: when it prints "waiting for peers", and a finished job's restart."""

from __future__ import annotations

import io
from pathlib import Path

from gradstore.cli._coordinator_cmd import RoundProgressLines, finished_job
from gradstore.coordinator import Journal, RoundProgress
from gradstore.job import load_job

from .conftest import Cli
from .helpers import unused_url

RECORD = "bafyreigbtj4x7ip5legnfznufuopl4sg4knzc2cof6duas4b3q2fy6swua"
OUTPUT = "bafkreibjywehwqrkfgeng2uzfuuphcr7cxggps37lzwaypwn2zkgmexfpu"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _progress(
    verified: int = 0, received: int = 0, deadline_in: float | None = None
) -> RoundProgress:
    return RoundProgress(
        round=0,
        expected=3,
        received=received,
        verified=verified,
        failed=0,
        quorum=2,
        deadline_in=deadline_in,
    )


def test_progress_lines_at_open_on_change_and_every_ten_seconds() -> None:
    out, clock = io.StringIO(), Clock()
    lines = RoundProgressLines(out, clock=clock)
    lines.tick(None)  # no round open: nothing
    assert out.getvalue() == ""
    lines.tick(_progress())  # the round opens
    assert out.getvalue().splitlines() == [
        "round 0: waiting for peers (0/3 verified, 0 received, quorum 2, "
        "the deadline starts at the first announcement)"
    ]
    for _ in range(9):  # nothing changes: quiet for 10 s
        clock.now += 1
        lines.tick(_progress())
    assert len(out.getvalue().splitlines()) == 1
    clock.now += 1
    lines.tick(_progress())
    assert len(out.getvalue().splitlines()) == 2
    clock.now += 1  # a change within 2 s of the last line waits
    lines.tick(_progress(received=1, deadline_in=59))
    assert len(out.getvalue().splitlines()) == 2
    clock.now += 1
    lines.tick(_progress(received=1, deadline_in=58))
    assert out.getvalue().splitlines()[-1] == (
        "round 0: waiting for peers (0/3 verified, 1 received, quorum 2, deadline in 58 s)"
    )
    clock.now += 1  # the countdown alone is no change
    lines.tick(_progress(received=1, deadline_in=57))
    assert len(out.getvalue().splitlines()) == 3


def _job(cli: Cli, tmp_path: Path, count: int = 2) -> tuple[Path, Path]:
    keys = {name: tmp_path / f"{name}.key" for name in ("coord", "alice")}
    dids = {name: cli("keygen", "--out", path).line for name, path in keys.items()}
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "done"\ncoordinator = "{dids["coord"]}"\npeers = ["{dids["alice"]}"]\n'
        f"[rounds]\ncount = {count}\n"
    )
    return job, keys["coord"]


def _journal(state: Path, job: Path, rows: list[str]) -> None:
    config = load_job(job)
    with Journal(state / "journal.sqlite") as journal:
        journal.bind(config.job, config.coordinator)
        for i, row in enumerate(rows):
            journal.open_round(i)
            if row == "failed":
                journal.fail_round(i, "quorum not met: 0 verified of 1 needed")
            elif row.startswith("closed"):
                journal.close_round(i, OUTPUT, RECORD)
                if row == "closed":
                    journal.mark_published(i)
        journal.flush()


def test_a_finished_job_says_so_and_exits_0_without_a_node(cli: Cli, tmp_path: Path) -> None:
    job, key = _job(cli, tmp_path)
    state = tmp_path / "state"
    _journal(state, job, ["failed", "closed"])
    argv = ["coordinator", "--config", job, "--key", key, "--state", state]
    url = unused_url()
    r = cli(*argv, "--api", url)  # nothing listens: it must not need the node
    assert r.code == 0 and r.out == ""
    # it says how to run the job again (issue 24, item 1): its own command, a new journal
    (tmp_path / "state-2").mkdir()  # taken: the next free name is offered
    again = cli(*argv, "--api", url)
    assert again.err.strip() == (
        f"job done already complete: 2 round(s), 1 failed, head record {RECORD} "
        f"(state {state}); nothing to do. To run the job again, give it a new journal: "
        f"gradstore coordinator --config {job} --key {key} --api {url} "
        f"--state {tmp_path / 'state-3'} (or remove {state})"
    )
    assert r.err.replace("state-2", "state-3") == again.err


def test_unfinished_or_unpublished_jobs_are_not_complete(cli: Cli, tmp_path: Path) -> None:
    job, _ = _job(cli, tmp_path)
    config = load_job(job)
    assert finished_job(tmp_path / "none", config) is None
    for i, rows in enumerate((["closed"], ["closed", "open"], ["closed", "closed-unpublished"])):
        state = tmp_path / f"s{i}"
        _journal(state, job, rows)
        assert finished_job(state, config) is None, rows
    (tmp_path / "other").mkdir()
    other, _ = _job(cli, tmp_path / "other")
    state = tmp_path / "s-other"
    _journal(state, other, ["closed", "closed"])  # another coordinator's folder
    assert finished_job(state, config) is None
