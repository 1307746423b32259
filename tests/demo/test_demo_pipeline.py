"""`gradstore demo --mode model-parallel`: the MLP in two stages x 2 replicas reaches the
data-parallel mode's held-out accuracy on the same data, on the local node and on Kubo,
prints the pipeline's bubble, and the printed `audit history` command passes on its
stepped round records, as does its `audit stage` command on a micro-batch of the last round; options the mode would ignore are refused, per mode."""

from __future__ import annotations

import re
import shlex

import pytest

from gradstore.cli import main

ROUNDS = 8


def _run(capsys: pytest.CaptureFixture[str], *argv: object) -> list[str]:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out.splitlines()


def _line(lines: list[str], prefix: str) -> str:
    (found,) = [x for x in lines if x.startswith(prefix)]
    return found.removeprefix(prefix)


def _accuracy(lines: list[str]) -> float:
    match = re.match(r"held-out accuracy ([\d.]+)%", _line(lines, "done: "))
    assert match, lines
    return float(match.group(1))


@pytest.mark.parametrize("where", ["local", "kubo"])
def test_model_parallel_reaches_data_parallel_accuracy_and_its_records_audit(  # type: ignore[no-untyped-def]
    capsys, monkeypatch, tmp_path, request, where
) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_PATH"):
        monkeypatch.delenv(name, raising=False)
    node = (
        ["--api", request.getfixturevalue("kubo").api_url]
        if where == "kubo"
        else ["--local", tmp_path / "node"]
    )
    common = ["--peers", 2, "--rounds", ROUNDS, "--seed", 3, *node]
    lines = _run(capsys, "demo", "--mode", "model-parallel", *common)
    assert _line(lines, "node: ").startswith("kubo " if where == "kubo" else "local node")
    rounds = [x for x in lines if x.startswith("round ")]
    assert len(rounds) == ROUNDS and all("bubble" in x for x in rounds)
    done = _line(lines, "done: ")
    bubble = re.search(r"pipeline bubble ([\d.]+) s \((\d+)%", done)
    assert bubble and float(bubble.group(1)) > 0, done
    baseline = _run(capsys, "demo", "--mode", "data-parallel", "--quiet", *common)
    # both are full-batch gradient descent of the same model from the same start
    assert _accuracy(lines) >= _accuracy(baseline) - 0.5, (done, _line(baseline, "done: "))
    did = _line(lines, "coordinator: ")
    argv = shlex.split(_line(lines, "audit it: "))
    assert argv[:3] == ["gradstore", "audit", "history"]
    assert argv[argv.index("--coordinator") + 1] == did
    audit = _run(capsys, *argv[1:])
    assert audit[-1].endswith(
        f"{ROUNDS} round(s), {ROUNDS - 1} down to 0, all by coordinator {did}"
    )
    stage = shlex.split(_line(lines, "audit a stage: "))
    assert stage[:3] == ["gradstore", "audit", "stage"]
    checked = _run(capsys, *stage[1:])
    assert checked[-1].startswith(f"ok stage body of round {ROUNDS - 1} of job "), checked
    assert "micro-batch 0, " in checked[-1] and "matches bit for bit" in checked[-1]


@pytest.mark.parametrize(
    ("mode", "argv", "named"),
    [
        ("model-parallel", ["--steps"], "--steps"),
        ("model-parallel", ["--method", "median", "--compress", "int8"], "--compress, --method"),
        (
            "model-parallel",
            ["--model", "softmax", "--local-epochs", "3"],
            "--model, --local-epochs",
        ),
        ("model-parallel", ["--plot", "x.png"], "--plot"),
        ("population", ["--lr", "0.3"], "--lr"),
        ("population", ["--peers", "6"], "--peers"),
    ],
)
def test_options_a_mode_would_ignore_are_refused_per_mode(
    capsys: pytest.CaptureFixture[str], mode: str, argv: list[str], named: str
) -> None:
    code = main(["demo", "--mode", mode, *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--mode {mode} does not take {named} (" in err
