"""The job file: every key parsed; every refusal is a CoordinatorError naming the key."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest

from gradstore.errors import ConfigError, CoordinatorError
from gradstore.format import Limits
from gradstore.job import (
    InputsConfig,
    JobConfig,
    RoundsConfig,
    TensorSpec,
    load_job,
    parse_job,
    topics,
)
from gradstore.messages import SigningKey

COORD = SigningKey.from_seed(bytes([200]) * 32).did
P = sorted(SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(3))

FULL = f"""
job = "digits-v2"
coordinator = "{COORD}"
peers = ["{P[0]}", "{P[1]}", "{P[2]}"]

[aggregation]
method = "weighted"
weights = {{ "{P[0]}" = 1, "{P[1]}" = 2.5, "{P[2]}" = 0 }}
clip_input_norm = 10.0
clip_output_norm = 5

[rounds]
count = 4
quorum = 2
deadline_s = 12.5
max_ahead = 2

[limits]
max_gradient_bytes = 1000000
max_tensors = 8
max_elements = 250000

[inputs]
require_bound_meta = true

[[schema]]
name = "w"
dtype = "<f4"
shape = [784, 10]

[[schema]]
name = "b"
dtype = "<f4"
shape = [10]
"""


def test_full_job_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(FULL)
    cfg = load_job(path)
    assert cfg == JobConfig(
        job="digits-v2",
        coordinator=COORD,
        peers=tuple(P),
        method="weighted",
        weights={P[0]: 1.0, P[1]: 2.5, P[2]: 0.0},
        clip_input_norm=10.0,
        clip_output_norm=5.0,
        rounds=RoundsConfig(count=4, quorum=2, deadline_s=12.5, max_ahead=2),
        limits=Limits(max_bytes=1_000_000, max_tensors=8, max_elements=250_000),
        schema=(TensorSpec("b", "<f4", (10,)), TensorSpec("w", "<f4", (784, 10))),
        inputs=InputsConfig(require_bound_meta=True),
    )
    assert cfg.gradients_topic == "gradstore/v1/digits-v2/gradients"
    assert (cfg.gradients_topic, cfg.results_topic) == topics("digits-v2")
    params = cfg.params_for([P[2], P[0]])
    assert params.weights == (0.0, 1.0)  # in the order of the peers asked for


def test_minimal_job_file_defaults() -> None:
    cfg = parse_job({"job": "j", "coordinator": COORD, "peers": P[:2]})
    assert cfg.method == "fedavg"
    assert cfg.rounds == RoundsConfig(count=1, quorum=2, deadline_s=60.0, max_ahead=1)
    assert cfg.limits == Limits()
    assert cfg.schema is None and dict(cfg.weights) == {}
    assert cfg.inputs == InputsConfig(require_bound_meta=False)  # documents without meta work


def _job(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"job": "j", "coordinator": COORD, "peers": list(P)}
    for key, value in overrides.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top key", _job(jobname="x"), "`jobname` is not a known key"),
    ("unknown aggregation key", _job(aggregation={"methd": "mean"}), "`aggregation.methd`"),
    ("unknown rounds key", _job(rounds={"count": 1, "deadline": 5}), "`rounds.deadline`"),
    ("unknown limits key", _job(limits={"max_bytes": 5}), "`limits.max_bytes`"),
    ("unknown schema key", _job(schema=[{"name": "w", "dtype": "<f4", "shape": [], "x": 1}]),
     "`schema[0].x`"),
    ("missing job", _job(job=None), "`job` is required"),
    ("bad job name", _job(job="a b"), "`job` must be"),
    ("missing coordinator", _job(coordinator=None), "`coordinator` is required"),
    ("bad coordinator did", _job(coordinator="did:key:zNope"), "`coordinator` is not a valid"),
    ("bad peer did", _job(peers=[P[0], "did:web:example.com"]), "`peers[1]` is not a valid"),
    ("peer not a string", _job(peers=[P[0], 7]), "`peers[1]` must be a did:key"),
    ("no peers", _job(peers=[]), "`peers` lists no peer"),
    ("duplicate peer", _job(peers=[P[0], P[1], P[0]]), "`peers` lists a peer twice"),
    ("quorum > peers", _job(rounds={"quorum": 4}), "`rounds.quorum` 4 is more than the 3 peers"),
    ("quorum 0", _job(rounds={"quorum": 0}), "`rounds.quorum` must be >= 1"),
    ("negative count", _job(rounds={"count": -1}), "`rounds.count` must be >= 0"),
    ("deadline 0", _job(rounds={"deadline_s": 0}), "`rounds.deadline_s` must be > 0"),
    ("bool count", _job(rounds={"count": True}), "`rounds.count` must be an integer"),
    ("unknown method", _job(aggregation={"method": "avg"}), "`aggregation.method` unknown method"),
    ("weighted without weights", _job(aggregation={"method": "weighted"}),
     "`aggregation.weights` method 'weighted' needs a weight for every peer"),
    ("weighted missing one", _job(aggregation={"method": "weighted", "weights": {P[0]: 1, P[1]: 1}}),
     f"missing {P[2]}"),
    ("weight for a non-peer", _job(aggregation={"method": "weighted",
     "weights": {P[0]: 1, P[1]: 1, P[2]: 1, COORD: 1}}),
     f"`aggregation.weights` weight for a peer not in peers: {COORD}"),
    ("weights for another method", _job(aggregation={"method": "mean", "weights": {P[0]: 1}}),
     "`aggregation.weights` does not apply to method 'mean'"),
    ("weights not a table", _job(aggregation={"method": "weighted", "weights": [1, 2, 3]}),
     "`aggregation.weights` must be a table"),
    ("negative weight", _job(aggregation={"method": "weighted",
     "weights": {P[0]: 1, P[1]: -1, P[2]: 1}}), f"`aggregation.weights.{P[1]}` must be >= 0"),
    ("trim_ratio for mean", _job(aggregation={"method": "mean", "trim_ratio": 0.1}),
     "`aggregation.trim_ratio` trim_ratio does not apply to method 'mean'"),
    ("byzantine for fedavg", _job(aggregation={"byzantine": 1}),
     "`aggregation.byzantine` byzantine does not apply to method 'fedavg'"),
    ("trim_ratio out of range", _job(aggregation={"method": "trimmed_mean", "trim_ratio": 0.5}),
     "`aggregation.trim_ratio` trim_ratio must be in [0, 0.5)"),
    ("negative clip", _job(aggregation={"clip_input_norm": -2}), "`aggregation.clip_input_norm`"),
    ("median with quorum 2", _job(aggregation={"method": "median"}, rounds={"quorum": 2}),
     "cannot work with quorum 2: median"),
    ("krum with too few", _job(aggregation={"method": "krum", "byzantine": 1}),
     "cannot work with quorum 3: krum"),
    ("bad schema dtype", _job(schema=[{"name": "w", "dtype": "float32", "shape": [2]}]),
     "`schema[0].dtype` unknown dtype 'float32'"),
    ("big-endian schema dtype", _job(schema=[{"name": "w", "dtype": ">f4", "shape": [2]}]),
     "`schema[0].dtype` unknown dtype '>f4'"),
    ("bf16 is not the dtype's name", _job(schema=[{"name": "w", "dtype": "bf16", "shape": [2]}]),
     "`schema[0].dtype` unknown dtype 'bf16'; allowed: <f2 <f4"),
    ("raw void is not bfloat16", _job(schema=[{"name": "w", "dtype": "<V2", "shape": [2]}]),
     "`schema[0].dtype` unknown dtype '<V2'"),
    ("negative schema dim", _job(schema=[{"name": "w", "dtype": "<f4", "shape": [-1]}]),
     "`schema[0].shape` must be >= 0"),
    ("schema name missing", _job(schema=[{"dtype": "<f4", "shape": [1]}]),
     "`schema[0].name` is required"),
    ("schema name empty", _job(schema=[{"name": "", "dtype": "<f4", "shape": [1]}]),
     "`schema[0].name` must not be empty"),
    ("schema name twice", _job(schema=[{"name": "w", "dtype": "<f4", "shape": [1]},
                                       {"name": "w", "dtype": "<f8", "shape": [1]}]),
     "`schema[1].name` 'w' is listed twice"),
    ("schema not a list", _job(schema={"name": "w"}), "`schema` must be a list"),
    ("rounds not a table", _job(rounds=3), "`rounds` must be a table"),
    ("limits zero", _job(limits={"max_tensors": 0}), "`limits.max_tensors` must be >= 1"),
    ("unknown inputs key", _job(inputs={"require_meta": True}), "`inputs.require_meta`"),
    ("bound meta not a bool", _job(inputs={"require_bound_meta": 1}),
     "`inputs.require_bound_meta` must be true or false"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refusals_name_the_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(CoordinatorError, match=re.escape(message)) as info:
        parse_job(raw, source="job.toml")
    assert str(info.value).startswith("job.toml: ")


def test_a_bad_job_file_is_a_config_error(tmp_path: Path) -> None:
    # its own type (still a CoordinatorError, and a ValueError): code can tell bad
    # configuration from a round that cannot proceed without reading the message
    path = tmp_path / "job.toml"
    path.write_text(f'job = "j"\ncoordinator = "{COORD}"\npeers = []\n')
    with pytest.raises(ConfigError, match=re.escape("`peers` lists no peer")) as info:
        load_job(path)
    assert isinstance(info.value, CoordinatorError) and isinstance(info.value, ValueError)
    path.write_text('job = "j"\npeers = [\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_job(path)
    with pytest.raises(ConfigError, match="cannot work with quorum 1"):
        parse_job(_job(aggregation={"method": "median"}, rounds={"quorum": 1}))


def test_not_toml_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('job = "j"\npeers = [\n')
    with pytest.raises(CoordinatorError, match=re.escape(f"{path}: not valid TOML")):
        load_job(path)
    path.write_bytes(b'job = "\xff"\n')  # not UTF-8
    with pytest.raises(CoordinatorError, match=re.escape(f"{path}: not valid TOML")):
        load_job(path)


def test_missing_job_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_job(tmp_path / "nope.toml")


def test_unknown_key_error_lists_the_known_keys() -> None:
    with pytest.raises(CoordinatorError) as info:
        parse_job(_job(rounds={"qourum": 2}))
    assert "known: count, deadline_s, max_ahead, quorum" in str(info.value)


def test_schema_accepts_bfloat16_and_float8_by_name() -> None:
    schema = [
        {"name": "w", "dtype": "bfloat16", "shape": [4, 2]},
        {"name": "s", "dtype": "float8_e4m3fn", "shape": [3]},
        {"name": "t", "dtype": "float8_e5m2", "shape": []},
    ]
    cfg = parse_job(_job(schema=schema))
    assert cfg.schema == (
        TensorSpec("s", "float8_e4m3fn", (3,)),
        TensorSpec("t", "float8_e5m2", ()),
        TensorSpec("w", "bfloat16", (4, 2)),
    )


@functools.cache
def _many_peers(n: int) -> list[str]:
    return [SigningKey.from_seed(i.to_bytes(32, "big")).did for i in range(1, n + 1)]


@pytest.mark.parametrize("method", ["krum", "multikrum"])
def test_a_krum_job_with_more_peers_than_krum_takes_is_refused(method: str) -> None:
    """Krum holds n x n matrices: a job whose rounds could exceed MAX_KRUM_INPUTS is refused
    when loaded, naming the count and the bound (the same job with fedavg loads)."""
    from gradstore.aggregate.methods import MAX_KRUM_INPUTS

    peers = _many_peers(MAX_KRUM_INPUTS + 1)
    krum = {"method": method, "byzantine": 1}
    said = f"krum: {MAX_KRUM_INPUTS + 1} inputs are more than the {MAX_KRUM_INPUTS} it takes"
    said = said.replace("krum", method, 1)
    with pytest.raises(CoordinatorError, match=re.escape(said)) as info:
        parse_job(_job(peers=peers, aggregation=krum, rounds={"quorum": 5}), source="job.toml")
    assert str(info.value).startswith(f"job.toml: `peers` lists {MAX_KRUM_INPUTS + 1} peers")
    with pytest.raises(CoordinatorError, match=re.escape(said)):  # every peer is the quorum
        parse_job(_job(peers=peers, aggregation=krum), source="job.toml")
    assert parse_job(_job(peers=peers[:-1], aggregation=krum, rounds={"quorum": 5}))
    assert parse_job(_job(peers=peers, rounds={"quorum": 5})).method == "fedavg"
