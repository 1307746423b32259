"""The README's walkthrough, run as typed: its own ``sh`` blocks, top to bottom, in one bash.

The commands are read from README.md each time, so this fails when the README drifts from
what works. What the test changes, and only that:

- ``pip install -e .`` is skipped: the test runs in an installed environment, whose
  ``bin`` folder comes first on PATH (``gradstore`` and ``python`` are its own);
- HOME is a temporary folder (so ``~/.gradstore-kubo`` is a fresh repo) and the work
  happens in another, with ``scripts`` and ``examples`` linked from the repository;
  ``GRADSTORE_CACHE`` points ``scripts/install-kubo.sh`` at the Kubo already built;
- right after ``ipfs init``, the repo gets the test daemons' isolation (loopback, random
  ports, no bootstrap: Kubo's ``test`` profile, and no routing), so no fixed port is
  taken and nothing leaves the machine;
- right after ``ipfs daemon &``, the script waits until the daemon answers (a person
  reads "Daemon is ready"), and at the end the daemon is shut down if still running.

A CID the README shows in a line's comment (``# bafkreihwj2xx…r7qo4``, abridged) is what
that line prints: ``examples/make_gradients.py`` writes the same files every time.

The walkthrough runs twice in the same folder and HOME: the second time after the lines of
"Running it again", its reset (issue 24, item 1: run again as it was, it failed in a cascade).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from gradstore.cli import main

ROOT = Path(__file__).resolve().parents[2]
CID = re.compile(r"baf[a-z2-7]{50,}")
SHOWN = re.compile(r"(baf[a-z2-7]{6,})…([a-z2-7]{3,})")  # an abridged CID: head…tail


RESET = "\n### Running it again\n"


def _sh_lines(text: str) -> list[str]:
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def _walkthrough(readme: str) -> tuple[str, str]:
    """The walkthrough section, split at its "Running it again" subsection."""
    section = readme.split("\n## A 5-minute walkthrough\n", 1)[1].split("\n## ", 1)[0]
    walk, reset = section.split(RESET, 1)
    return walk, reset.split("\n### ", 1)[0]


def walkthrough_commands(readme: str) -> list[str]:
    """The lines of every ``sh`` block of "A 5-minute walkthrough", in order, but those of
    "Running it again" (``reset_commands``)."""
    return _sh_lines(_walkthrough(readme)[0])


def reset_commands(readme: str) -> list[str]:
    """The lines of "Running it again": what makes the folder ready for the walkthrough again."""
    return _sh_lines(_walkthrough(readme)[1])


def _script(commands: list[str], before: Sequence[str] = ()) -> str:
    """bash that runs each README line after a marker, with the substitutions above (the
    lines of ``before`` first, as they are)."""
    out = ["set -eo pipefail", *before]
    for i, line in enumerate(commands):
        out.append(f"echo '### {i}'")
        if line.startswith("pip install"):
            continue
        out.append(line)
        if line.startswith("ipfs init"):
            out += [
                "ipfs config profile apply test >/dev/null",
                "ipfs config Routing.Type none",
            ]
        if line.startswith("ipfs daemon"):
            # wait for the daemon's api file first: `ipfs id` without it runs offline and
            # takes the repo lock, which makes a daemon still starting fail
            out.append(
                'for _ in $(seq 300); do [ -e "${IPFS_PATH:-$HOME/.ipfs}/api" ] '
                "&& ipfs id >/dev/null 2>&1 && break; sleep 0.2; done"
            )
    out.append("ipfs shutdown 2>/dev/null || true")
    return "\n".join(out) + "\n"


def _outputs(stdout: str, commands: list[str]) -> dict[str, str]:
    """README line -> what was printed on stdout between its marker and the next."""
    parts = re.split(r"^### (\d+)$", stdout, flags=re.M)
    return {commands[int(parts[i])]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _cids(text: str) -> list[str]:
    return [line for line in text.splitlines() if CID.fullmatch(line.strip())]


def shown_cids(line: str) -> list[tuple[str, str]]:
    """The abridged CIDs a README line's comment shows, as (head, tail)."""
    _, hash_, comment = line.partition("#")
    return SHOWN.findall(comment) if hash_ else []


def _agree(shown: list[tuple[str, str]], printed: list[str]) -> bool:
    return len(shown) == len(printed) and all(
        cid.startswith(head) and cid.endswith(tail)
        for (head, tail), cid in zip(shown, printed, strict=True)
    )


def test_the_readmes_cids_are_what_its_commands_print_for_the_example_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No node needed: the example files, then each walkthrough line that shows a CID
    (``gradstore cid``; ``ipfs add --only-hash`` is ``gradstore cid --raw``)."""
    commands = walkthrough_commands((ROOT / "README.md").read_text())
    showing = [line for line in commands if shown_cids(line)]
    assert any(line.startswith("gradstore cid ") for line in showing), showing
    monkeypatch.chdir(tmp_path)
    subprocess.run([sys.executable, ROOT / "examples" / "make_gradients.py"], check=True)
    for line in commands:
        words = shlex.split(line, comments=True)
        if words[:2] == ["gradstore", "encode"]:
            assert main(words[1:]) == 0
        if not shown_cids(line):
            continue
        if words[:2] == ["gradstore", "cid"]:
            argv = words[1:]
        elif words[:3] == ["ipfs", "add", "--only-hash"]:
            argv = ["cid", "--raw", words[-1]]
        else:
            pytest.fail(f"a README line shows a CID this test cannot check: {line}")
        capsys.readouterr()
        assert main(argv) == 0
        printed = capsys.readouterr().out.split()
        assert _agree(shown_cids(line), printed), (line, printed)


def _run(script: Path, work: Path, env: dict[str, str], name: str) -> tuple[str, str]:
    """Run ``script`` in bash in ``work``: its stdout and stderr (also printed, for a failure)."""
    out_path, err_path = script.with_suffix(".out"), script.with_suffix(".err")
    with (
        open(out_path, "wb") as out,
        open(err_path, "wb") as err,
        subprocess.Popen(
            ["bash", str(script)], cwd=work, env=env, stdout=out, stderr=err,
            start_new_session=True,
        ) as proc,
    ):  # fmt: skip
        try:
            code = proc.wait(timeout=600)
        finally:
            # the shell's background jobs (daemon, coordinator) are in its session
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = out_path.read_text(), err_path.read_text()
    print(f"=== {name}", stdout, stderr, sep="\n--- stderr ---\n")
    assert code == 0, f"the {name} failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    return stdout, stderr


def _check(work: Path, stdout: str, stderr: str, commands: list[str]) -> str:
    """What one run of the walkthrough must have done; returns the round's record CID."""
    printed = _outputs(stdout, commands)
    # the coordinator's round line, and where the round stood while it was open
    assert re.search(r"^round 0 closed: 2 peers \(2/2 verified\)", stdout, re.M), stdout
    assert "round 0: waiting for peers (" in stderr
    # peer await saved the aggregate and printed its CID and the record's
    aggregate, record = (work / "result.txt").read_text().split()
    with np.load(work / "aggregate.npz") as npz:
        assert sorted(npz.files) == ["fc.bias", "fc.weight"]
    # round status, between the two peers: the open round, alice in and bob not yet
    status = next(v for k, v in printed.items() if k.startswith("gradstore round status"))
    lines = status.strip().splitlines()
    assert re.fullmatch(r"job walkthrough, run [a-z0-9]+: round 0 of 1 open", lines[0]), status
    assert sorted(line.split()[0] for line in lines[2:4]) == ["absent", "verified"], status
    # round list: the one round, its record and aggregate
    listed = next(v for k, v in printed.items() if k.startswith("gradstore round list"))
    assert listed.strip().splitlines()[1].split()[:3] == ["0", record, aggregate], listed
    # every audit passed, pinned to the job's coordinator
    audits = "".join(v for k, v in printed.items() if k.startswith("gradstore audit"))
    assert f"ok round 0 of job walkthrough: record {record} signed by the expected" in audits
    assert "ok history of job walkthrough: 1 round(s)" in audits
    assert f"ok {aggregate}: " in audits
    # plain Kubo agrees with gradstore on the CIDs
    by_cmd = {line.split("#")[0].strip(): _cids(text) for line, text in printed.items()}
    assert by_cmd["gradstore cid alice.npz"] == by_cmd["ipfs add --only-hash -Q alice.doc"]
    assert len(by_cmd["gradstore cid alice.npz"]) == 1
    # and both print the CID the README shows
    for line, text in printed.items():
        if shown_cids(line):
            assert _agree(shown_cids(line), _cids(text)), (line, text)
    assert by_cmd['ipfs cat "$aggregate" | ipfs add --only-hash -Q'] == [aggregate]
    return record


@pytest.mark.kubo
@pytest.mark.slow
def test_the_readme_walkthrough_runs_as_typed_and_again_after_its_reset(
    tmp_path: Path, kubo_binary: Path
) -> None:
    binary = kubo_binary  # the fixture skips without Kubo, and fails under CI
    readme = (ROOT / "README.md").read_text()
    commands, reset = walkthrough_commands(readme), reset_commands(readme)
    assert any(c.startswith("gradstore coordinator") for c in commands), "no walkthrough found"
    assert any(c.startswith("rm ") for c in reset), "no reset found"
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    for folder in ("scripts", "examples"):
        (work / folder).symlink_to(ROOT / folder)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GRADSTORE_API", "IPFS_")) and k != "GRADSTORE_KUBO"
    }
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        IPFS_TELEMETRY="off",
        PYTHONUNBUFFERED="1",
    )
    if binary.parent.parent.name == "kubo":  # <cache>/kubo/<version>/ipfs, as the script builds
        env["GRADSTORE_CACHE"] = str(binary.parents[2])
    else:  # an ipfs from elsewhere: put it where the README's PATH line cannot miss it
        env["PATH"] = f"{binary.parent}{os.pathsep}{env['PATH']}"
    first, again = tmp_path / "first.sh", tmp_path / "again.sh"
    first.write_text(_script(commands))
    # the reset's lines, as typed, then the walkthrough again: same folder, same HOME
    again.write_text(_script(commands, before=reset))
    record = _check(work, *_run(first, work, env, "walkthrough"), commands)
    assert (work / "gradstore-state" / "walkthrough").is_dir()
    second = _check(work, *_run(again, work, env, "walkthrough after the reset"), commands)
    assert second != record  # new keys: a new job, a new record
