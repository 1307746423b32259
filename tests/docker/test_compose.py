"""docker/: the Kubo service users run must match the Kubo and settings the tests run.

PyYAML is not a dependency, so compose.yml is read with a small parser for the
YAML subset it is written in (block maps, block lists, JSON flow lists, quoted
or plain scalars); a construct outside that subset fails the parse loudly.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from gradstore.node.cluster.daemon import CLUSTER_VERSION, loopback_settings
from gradstore.node.kubo.daemon import DAEMON_CONFIG, MIN_KUBO_VERSION, PROFILES

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.yml"
INIT_SCRIPT = ROOT / "docker" / "container-init.d" / "001-gradstore.sh"
INSTALL_SCRIPT = ROOT / "scripts" / "install-kubo.sh"
INSTALL_CLUSTER_SCRIPT = ROOT / "scripts" / "install-cluster.sh"
CLUSTER_START = ROOT / "docker" / "cluster" / "start.sh"
DOCKERFILE = ROOT / "docker" / "Dockerfile"

# Settings the test daemons use that a user's node must not: isolated test
# nodes run without routing; a user's node needs it to find remote peers.
TEST_ONLY_CONFIG = {"Routing.Type"}
TEST_ONLY_PROFILES = {"test"}


def _scalar(text: str) -> Any:
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    if text.startswith('"'):
        return json.loads(text)
    if text.startswith("'"):
        assert text.endswith("'"), text
        return text[1:-1].replace("''", "'")
    return text


def _strip_comment(line: str) -> str:
    out, quote = [], None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] == " "):
            break
        out.append(c)
    return "".join(out).rstrip()


def parse_yaml_subset(text: str) -> Any:
    lines = [
        (len(s) - len(s.lstrip(" ")), s.strip()) for s in map(_strip_comment, text.splitlines())
    ]
    lines = [(indent, s) for indent, s in lines if s]
    pos = 0

    def block(indent: int) -> Any:
        nonlocal pos
        if lines[pos][1].startswith("- "):
            items = []
            while pos < len(lines) and lines[pos][0] == indent and lines[pos][1].startswith("- "):
                items.append(_scalar(lines[pos][1][2:]))
                pos += 1
            return items
        mapping: dict[str, Any] = {}
        while pos < len(lines) and lines[pos][0] == indent:
            key, sep, rest = lines[pos][1].partition(":")
            assert sep and not key.startswith("- "), f"outside the subset: {lines[pos][1]!r}"
            pos += 1
            if rest.strip():
                mapping[key] = _scalar(rest)
            elif pos < len(lines) and lines[pos][0] > indent:
                mapping[key] = block(lines[pos][0])
            else:
                mapping[key] = None
        return mapping

    doc = block(0)
    assert pos == len(lines), f"unparsed from line {lines[pos][1]!r}"
    return doc


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = parse_yaml_subset(COMPOSE.read_text())
    return doc


def _pinned_kubo_version() -> str:
    match = re.search(
        r'^KUBO_VERSION="\$\{KUBO_VERSION:-(v[0-9.]+)\}"', INSTALL_SCRIPT.read_text(), re.M
    )
    assert match, "scripts/install-kubo.sh no longer pins KUBO_VERSION the way this test reads it"
    return match.group(1)


def _pinned_cluster_version() -> str:
    match = re.search(
        r'^CLUSTER_VERSION="\$\{CLUSTER_VERSION:-(v[0-9.]+)\}"',
        INSTALL_CLUSTER_SCRIPT.read_text(),
        re.M,
    )
    assert match, "scripts/install-cluster.sh no longer pins CLUSTER_VERSION the way this reads it"
    return match.group(1)


def _script_settings() -> tuple[set[str], dict[str, Any]]:
    """Profiles applied and ``ipfs config --json`` keys set by the init script."""
    profiles: set[str] = set()
    config: dict[str, Any] = {}
    for line in INIT_SCRIPT.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words[:4] == ["ipfs", "config", "profile", "apply"]:
            profiles.update(words[4].split(","))
        elif words[:3] == ["ipfs", "config", "--json"]:
            config[words[3]] = json.loads(words[4])
        elif words[:2] == ["ipfs", "config"]:
            config[words[2]] = words[3]
    return profiles, config


def test_parser_reads_the_subset() -> None:
    doc = parse_yaml_subset('a:\n  b: "x # y"  # c\n  l:\n    - 1\n    - "2"\n  t: ["CMD", "id"]\n')
    assert doc == {"a": {"b": "x # y", "l": ["1", "2"], "t": ["CMD", "id"]}}


def test_kubo_image_is_the_version_the_install_script_pins(compose: dict[str, Any]) -> None:
    image = compose["services"]["kubo"]["image"]
    version = _pinned_kubo_version()
    assert image == f"ipfs/kubo:{version}"
    numbers = tuple(int(n) for n in version.lstrip("v").split("."))
    assert numbers[:2] >= MIN_KUBO_VERSION


def test_init_script_sets_what_the_test_daemons_set() -> None:
    profiles, config = _script_settings()
    assert set(PROFILES.split(",")) - TEST_ONLY_PROFILES <= profiles
    assert "unixfs-v1-2025" in profiles
    for key, value in DAEMON_CONFIG.items():
        if key in TEST_ONLY_CONFIG:
            assert key not in config, f"{key} is for isolated test nodes, not users' nodes"
        else:
            assert config.get(key) == value, key
    assert config["Pubsub.Enabled"] is True


def test_fresh_repos_get_the_profile_at_init(compose: dict[str, Any]) -> None:
    kubo = compose["services"]["kubo"]
    assert kubo["environment"]["IPFS_PROFILE"] == "unixfs-v1-2025"
    assert "./container-init.d:/container-init.d:ro" in kubo["volumes"]


def test_init_script_is_executable_and_strict() -> None:
    assert INIT_SCRIPT.stat().st_mode & 0o111
    text = INIT_SCRIPT.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "\nset -eu\n" in text


def test_api_and_gateway_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    ports = compose["services"]["kubo"]["ports"]
    for container_port in ("5001", "8080"):
        published = [p for p in ports if p.split("/")[0].rsplit(":", 1)[-1] == container_port]
        assert published, f"port {container_port} not published"
        assert all(p.startswith("127.0.0.1:") for p in published), published
    for service in compose["services"].values():  # only the swarm ports are public
        for p in service.get("ports", []):
            assert p.startswith("127.0.0.1:") or p.split(":")[0] in ("4001", "9096"), p


def test_kubo_has_a_healthcheck_the_coordinator_waits_for(compose: dict[str, Any]) -> None:
    kubo, coordinator = compose["services"]["kubo"], compose["services"]["coordinator"]
    test = kubo["healthcheck"]["test"]
    assert test[0] == "CMD" and "ipfs" in test and "id" in test
    assert coordinator["depends_on"]["kubo"]["condition"] == "service_healthy"


def test_coordinator_is_built_here_and_talks_to_the_kubo_service(compose: dict[str, Any]) -> None:
    coordinator = compose["services"]["coordinator"]
    assert coordinator["build"] == {"context": "..", "dockerfile": "docker/Dockerfile"}
    assert any(v.endswith(":/job:ro") for v in coordinator["volumes"])
    dockerfile = DOCKERFILE.read_text()
    assert dockerfile.startswith("#") and "\nFROM python:3.11-slim\n" in dockerfile
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M)
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.M)
    assert entry and cmd, "Dockerfile has no exec-form ENTRYPOINT and CMD"
    assert json.loads(entry.group(1)) == ["gradstore"]
    # the key's name is the walkthrough's: job init and keygen leave job/coord.key
    assert json.loads(cmd.group(1)) == [
        "coordinator", "--config", "/job/job.toml", "--key", "/job/coord.key",
        "--api", "http://kubo:5001",
    ]  # fmt: skip
    assert "command" not in coordinator and "entrypoint" not in coordinator


def test_a_peer_service_runs_commands_against_the_kubo_service(compose: dict[str, Any]) -> None:
    peer = compose["services"]["peer"]
    assert peer["profiles"] == ["peer"]  # not started by `up`: `docker compose run --rm peer`
    assert peer["build"] == compose["services"]["coordinator"]["build"]
    assert peer["environment"]["GRADSTORE_API"] == "http://kubo:5001"
    assert peer["depends_on"]["kubo"]["condition"] == "service_healthy"
    assert any(v.endswith(":/job:ro") for v in peer["volumes"])
    assert peer["working_dir"] == "/work" and any(v.endswith(":/work") for v in peer["volumes"])
    assert "restart" not in peer


def test_coordinator_is_restarted_after_a_crash_not_after_its_job_is_done(
    compose: dict[str, Any],
) -> None:
    # exit 0 is "job complete" (also when started again on a finished job's state), so a
    # policy that restarts on exit 0 (always, unless-stopped) loops on a finished job
    assert compose["services"]["coordinator"]["restart"] in ("on-failure", "no")
    assert compose["services"]["kubo"]["restart"] == "unless-stopped"


def test_cluster_image_is_the_version_the_install_script_pins(compose: dict[str, Any]) -> None:
    version = _pinned_cluster_version()
    assert compose["services"]["cluster"]["image"] == f"ipfs/ipfs-cluster:{version}"
    assert version == CLUSTER_VERSION  # the version the test peers are looked up at


def test_cluster_runs_with_the_test_peers_settings(compose: dict[str, Any]) -> None:
    cluster = compose["services"]["cluster"]
    env = cluster["environment"]
    ours = loopback_settings("http://127.0.0.1:5001", "00" * 32)
    assert env["IPFS_CLUSTER_CONSENSUS"] == "crdt"  # ClusterPeer.init: --consensus crdt
    assert env["CLUSTER_MDNSINTERVAL"] == ours["cluster.mdns_interval"] == "0s"
    assert env["CLUSTER_ENABLERELAYHOP"] == "false" and ours["cluster.enable_relay_hop"] is False
    assert env["CLUSTER_IPFSHTTP_NODEMULTIADDRESS"] == "/dns4/kubo/tcp/5001"
    assert cluster["depends_on"]["kubo"]["condition"] == "service_healthy"
    # the secret comes from the environment, never from the file
    assert env["CLUSTER_SECRET"] == "${GRADSTORE_CLUSTER_SECRET:-}"
    assert cluster["profiles"] == ["cluster"]  # `up` without the profile runs no cluster
    assert "127.0.0.1:9094:9094" in cluster["ports"]
    assert cluster["healthcheck"]["test"][:2] == ["CMD", "ipfs-cluster-ctl"]


def test_cluster_refuses_to_start_without_a_secret(compose: dict[str, Any]) -> None:
    cluster = compose["services"]["cluster"]
    assert "./cluster/start.sh:/gradstore/start.sh:ro" in cluster["volumes"]
    assert cluster["entrypoint"] == ["/sbin/tini", "--", "/gradstore/start.sh"]
    assert CLUSTER_START.stat().st_mode & 0o111
    text = CLUSTER_START.read_text()
    assert text.startswith("#!/bin/sh\n") and "\nset -eu\n" in text
    assert 'if [ -z "${CLUSTER_SECRET:-}" ]; then' in text
    assert "exec /usr/local/bin/entrypoint.sh daemon" in text
