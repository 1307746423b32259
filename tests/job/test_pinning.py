"""The job file's ``[pinning]`` table: a cluster REST API URL and 1 <= replication_min <=
replication_max; anything else is a ``ConfigError`` naming the key."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from tests.job.test_config import COORD, P, _job

from gradstore.errors import ConfigError
from gradstore.job import PinningConfig, load_job, parse_job

URL = "http://127.0.0.1:9094"


def test_a_pinning_table_is_read(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        f'job = "j"\ncoordinator = "{COORD}"\npeers = {list(P)!r}\n'.replace("'", '"')
        + f'\n[pinning]\ncluster = "{URL}"\nreplication_min = 2\nreplication_max = 3\n'
        "wait_s = 5\n"
    )
    assert load_job(path).pinning == PinningConfig(URL, 2, 3, 5.0)


def test_without_a_table_the_node_pins_alone_and_max_defaults_to_min() -> None:
    assert parse_job(_job()).pinning is None
    assert parse_job(_job(pinning={"cluster": URL})).pinning == PinningConfig(URL, 1, 1)
    got = parse_job(_job(pinning={"cluster": "https://c.example", "replication_min": 2}))
    assert got.pinning == PinningConfig("https://c.example", 2, 2)


REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", {"cluster": URL, "replication": 2}, "`pinning.replication` is not a known key"),
    ("no cluster", {"replication_min": 1}, "`pinning.cluster` is required"),
    ("cluster not a string", {"cluster": 9094}, "`pinning.cluster` must be"),
    ("not an http URL", {"cluster": "/ip4/127.0.0.1/tcp/9094"},
     "`pinning.cluster` must be an http(s) URL, not '/ip4/127.0.0.1/tcp/9094'"),
    ("no scheme", {"cluster": "127.0.0.1:9094"}, "`pinning.cluster` must be an http(s) URL"),
    ("min above max", {"cluster": URL, "replication_min": 3, "replication_max": 2},
     "`pinning.replication_max` 2 is less than replication_min 3"),
    ("min 0", {"cluster": URL, "replication_min": 0}, "`pinning.replication_min` must be >= 1"),
    ("max 0", {"cluster": URL, "replication_max": 0}, "`pinning.replication_max` must be >= 1"),
    ("min a bool", {"cluster": URL, "replication_min": True},
     "`pinning.replication_min` must be an integer"),
    ("wait 0", {"cluster": URL, "wait_s": 0}, "`pinning.wait_s` must be > 0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("table", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_a_bad_pinning_table_is_a_config_error_naming_the_key(
    table: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        parse_job(_job(pinning=table), source="job.toml")
    assert str(info.value).startswith("job.toml: ")


def test_pinning_not_a_table_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("`pinning` must be a table")):
        parse_job(_job(pinning=URL))
