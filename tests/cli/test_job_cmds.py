"""keygen and the offline aggregate command."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.aggregate import AggregationParams, aggregate
from gradstore.messages import SigningKey

from .conftest import Cli
from .helpers import SEED, write_npz


def test_keygen_writes_a_0600_key_and_prints_its_did(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    r = cli("keygen", "--out", path)
    assert r.code == 0 and r.err == ""
    assert r.line.startswith("did:key:z6Mk")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SigningKey.load(path).did == r.line
    assert cli("keygen", "--out", tmp_path / "other.key").line != r.line


def test_keygen_refuses_to_overwrite(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "peer.key"
    did = cli("keygen", "--out", path).line
    before = path.read_bytes()
    line = cli("keygen", "--out", path).one_error_line()
    assert "refusing to overwrite" in line and str(path) in line
    # and says how to start over (issue 24, item 1): the walkthrough run twice got no hint
    assert "to start over with a new one, remove it first, or choose another --out" in line
    assert path.read_bytes() == before and SigningKey.load(path).did == did


def _inputs(tmp_path: Path, n: int, seed: int = SEED) -> tuple[list[Path], list[dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    arrays = [
        {"w": rng.standard_normal((6, 5)).astype(np.float32), "b": rng.standard_normal(5)}
        for _ in range(n)
    ]
    paths = [write_npz(tmp_path / f"in{i}.npz", **a) for i, a in enumerate(arrays)]
    return paths, arrays


CASES = [
    ("sum", [], {}, None),
    ("mean", [], {}, None),
    ("fedavg", ["--num-samples", "10", "20", "30", "40", "50"], {}, (10, 20, 30, 40, 50)),
    ("weighted", ["--weights", "1", "0", "2", "0.5", "3"], {"weights": (1, 0, 2, 0.5, 3)}, None),
    ("median", [], {}, None),
    ("trimmed_mean", ["--trim-ratio", "0.2"], {"trim_ratio": 0.2}, None),
    ("krum", ["--byzantine", "1"], {"byzantine": 1}, None),
    ("multikrum", ["--byzantine", "1", "--select", "3"], {"byzantine": 1, "select": 3}, None),
    ("mean", ["--clip-input-norm", "2.5"], {"clip_input_norm": 2.5}, None),
    ("sum", ["--clip-output-norm", "1.0"], {"clip_output_norm": 1.0}, None),
]


@pytest.mark.parametrize(
    ("method", "flags", "params", "num_samples"),
    CASES,
    ids=[" ".join([c[0], *c[1]]) for c in CASES],
)
def test_aggregate_offline_equals_the_library(
    cli: Cli,
    tmp_path: Path,
    method: str,
    flags: list[str],
    params: dict[str, Any],
    num_samples: tuple[int, ...] | None,
) -> None:
    paths, arrays = _inputs(tmp_path, 5)
    out = tmp_path / "agg.npz"
    # list options before the inputs: they must not swallow the input files
    r = cli("aggregate", "--method", method, *flags, *paths, "-o", out)
    assert (r.code, r.line, r.err) == (0, str(out), "")
    expected = aggregate(arrays, AggregationParams(method, **params), num_samples)
    with np.load(out, allow_pickle=False) as got:
        assert set(got.files) == set(expected)
        for name, value in expected.items():
            assert got[name].dtype == value.dtype
            assert got[name].tobytes() == value.tobytes(), f"{name} (seed {SEED})"


def test_aggregate_inputs_in_the_order_given(cli: Cli, tmp_path: Path) -> None:
    paths, arrays = _inputs(tmp_path, 2)
    out = tmp_path / "agg.npz"
    # inputs on both sides of the list option keep their command-line order
    r = cli(
        "aggregate", paths[0], "--method", "weighted", "--weights", "3", "1", paths[1], "-o", out
    )
    assert r.code == 0, r.err
    expected = aggregate(arrays, AggregationParams("weighted", weights=(3.0, 1.0)))
    with np.load(out) as got:
        assert got["w"].tobytes() == expected["w"].tobytes()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--method", "median"], "median: 2 input(s) cannot outvote anyone"),
        (["--method", "mean", "--trim-ratio", "0.2"], "trim_ratio does not apply to method 'mean'"),
        (["--method", "fedavg"], "num_samples"),
        (["--method", "fedavg", "--num-samples", "5"], "num_samples"),
        (["--method", "weighted", "--weights", "1", "2", "3"], "3 weights for 2 inputs"),
        (["--method", "trimmed_mean", "--trim-ratio", "0.7"], "trim_ratio must be in [0, 0.5)"),
        (["--method", "krum", "--byzantine", "1"], "Krum needs n >= 2f + 3"),
        (["--method", "sum", "--clip-input-norm", "-1"], "clip_input_norm must be > 0"),
        (["--method", "weighted", "--weights", "x"], "--weights expects numbers, got 'x'"),
    ],
)
def test_aggregate_refuses_bad_parameters(
    cli: Cli, tmp_path: Path, argv: list[str], message: str
) -> None:
    paths, _ = _inputs(tmp_path, 2)
    out = tmp_path / "agg.npz"
    usage = message.startswith("--")  # the command line itself is wrong: exit 2
    line = cli("aggregate", *paths, *argv, "-o", out).one_error_line(2 if usage else 1)
    assert message in line
    assert not out.exists()


def test_aggregate_refuses_mismatched_and_integer_inputs(cli: Cli, tmp_path: Path) -> None:
    paths, _ = _inputs(tmp_path, 2)
    other = write_npz(tmp_path / "other.npz", w=np.ones((6, 4), np.float32), b=np.ones(5))
    ints = write_npz(tmp_path / "ints.npz", w=np.ones((6, 5), np.int32), b=np.ones(5, np.int64))
    line = cli("aggregate", "--method", "mean", paths[0], other, "-o", tmp_path / "o.npz")
    assert "shape" in line.one_error_line()
    line = cli("aggregate", "--method", "sum", ints, ints, "-o", tmp_path / "o.npz")
    assert "floating-point" in line.one_error_line()


def test_aggregate_unknown_method_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    paths, _ = _inputs(tmp_path, 2)
    r = cli("aggregate", "--method", "average", *paths, "-o", tmp_path / "o.npz")
    assert r.code == 2 and "invalid choice: 'average'" in r.err


def _job_file(tmp_path: Path, cli: Cli, extra: str = "") -> tuple[Path, dict[str, Path]]:
    keys = {name: tmp_path / f"{name}.key" for name in ("coord", "alice", "mallory")}
    dids = {name: cli("keygen", "--out", path).line for name, path in keys.items()}
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "j"\ncoordinator = "{dids["coord"]}"\npeers = ["{dids["alice"]}"]\n{extra}'
    )
    return job, keys


def test_peer_await_gives_up_at_its_timeout(cli: Cli, tmp_path: Path) -> None:
    job, _ = _job_file(tmp_path, cli)
    out = tmp_path / "agg.npz"
    argv = ["peer", "await", "--config", job, "--round", 3, "-o", out, "--timeout", 0.3]
    line = cli(*argv, "--local", tmp_path / "node").one_error_line()
    assert line == "error: no result for round 3 of job j within 0.3s"
    assert not out.exists()


def test_peer_publish_with_a_key_outside_the_job_is_refused(cli: Cli, tmp_path: Path) -> None:
    job, keys = _job_file(tmp_path, cli)
    grad = write_npz(tmp_path / "g.npz", w=np.ones(3, np.float32))
    argv = ["peer", "publish", "--config", job, "--key", keys["mallory"], "--round", 0, grad]
    line = cli(*argv, "--local", tmp_path / "node").one_error_line()
    assert "is not among the job's peers" in line


def test_coordinator_refuses_a_bad_job_file_naming_the_key(cli: Cli, tmp_path: Path) -> None:
    job, keys = _job_file(tmp_path, cli, "[rounds]\nquorum = 2\n")
    argv = ["coordinator", "--config", job, "--key", keys["coord"], "--state", tmp_path / "s"]
    line = cli(*argv, "--local", tmp_path / "node").one_error_line()
    assert f"{job}: `rounds.quorum` 2 is more than the 1 peers listed" in line
