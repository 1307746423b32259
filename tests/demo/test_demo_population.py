"""`gradstore demo --mode population`: 8 members explore lr and weight decay over a real
Kubo; PBT's best member beats the median of the same members with fixed hyperparameters,
and the printed `gradstore audit population` command re-derives every decision."""

from __future__ import annotations

import re
import shlex

import pytest

from gradstore.cli import main


def _run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return code, out.out.splitlines()


def _line(lines: list[str], prefix: str) -> str:
    (found,) = [x for x in lines if x.startswith(prefix)]
    return found.removeprefix(prefix)


@pytest.mark.parametrize("where", ["kubo", "local"])
def test_population_beats_the_fixed_median_and_its_records_audit(  # type: ignore[no-untyped-def]
    capsys, monkeypatch, tmp_path, request, where
) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_PATH"):
        monkeypatch.delenv(name, raising=False)
    node = (
        ["--api", request.getfixturevalue("kubo").api_url]
        if where == "kubo"
        else ["--local", tmp_path / "node"]
    )
    _, lines = _run(capsys, "demo", "--mode", "population", *node)
    assert _line(lines, "node: ").startswith("kubo " if where == "kubo" else "local node")
    intervals = [x for x in lines if x.startswith("interval ")]
    assert len(intervals) == 8 and all("copies" in x for x in intervals)
    done = _line(lines, "done: ")
    pbt, median = (float(x) for x in re.findall(r"([\d.]+)% (?:held-out|for the median)", done))
    assert pbt > median, done
    did = _line(lines, "coordinator: ")
    argv = shlex.split(_line(lines, "audit it: "))
    assert argv[:3] == ["gradstore", "audit", "population"]
    assert argv[argv.index("--coordinator") + 1] == did
    _, audit = _run(capsys, *argv[1:])
    assert audit[-1].startswith("ok population of job demo-population: 8 decision(s)")
