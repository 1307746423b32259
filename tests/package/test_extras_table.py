"""docs/frameworks.md's "Install" table holds: every extra it names is pyproject's, and each
way in it lists runs with only its extras' packages installed, and without them stops
naming every one of its extras (``pip install 'gradstore[a,b]'``).

Each way in is probed in a fresh interpreter where the packages of the other extras cannot
be imported (as on an install without them): an import hook refuses them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from functools import cache
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "frameworks.md"

#: Runs ``sys.argv[2]`` (Python) with the top-level packages in ``sys.argv[1]`` (comma-separated)
#: refused on import; ``TMP`` is ``sys.argv[3]``, ``ROOT`` the repository.
_HARNESS = """
import importlib.abc, sys
from pathlib import Path
BLOCKED = set(filter(None, sys.argv[1].split(",")))
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
TMP, ROOT = Path(sys.argv[3]), Path(sys.argv[4])
exec(sys.argv[2])
"""

_DEMO = "from gradstore.cli import main; sys.exit(main(['demo', '--peers', '2', '--rounds', '1', '--quiet', '--local', str(TMP / 'node'), '--plot', str(TMP / 'p.png')"
_SAFETENSORS = """
import json, struct
header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
header += b" " * (-len(header) % 8)
(TMP / "x.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
from gradstore.files import load_gradient
assert load_gradient(TMP / "x.safetensors").tensors["w"].tolist() == [0.0, 0.0]
"""

#: The first code span of each row's first cell -> Python that uses that way in.
PROBES = {
    "gradstore": (
        "import numpy as np; np.savez(TMP / 'g.npz', w=np.ones(3, np.float32))\n"
        "import gradstore.peer, gradstore.coordinator\n"
        "from gradstore.cli import main; sys.exit(main(['cid', str(TMP / 'g.npz')]))"
    ),
    "gradstore demo": _DEMO + "]))",
    "gradstore demo --framework torch": _DEMO + ", '--framework', 'torch']))",
    "gradstore.torch": "import gradstore.torch",
    "examples/torch/run.py": (
        "import runpy; runpy.run_path(str(ROOT / 'examples/torch/run.py'), run_name='probe')"
    ),
    "gradstore.flower": "import gradstore.flower",
    "examples/flower/run.py": (
        "import runpy; runpy.run_path(str(ROOT / 'examples/flower/run.py'), run_name='probe')\n"
        "sys.path.insert(0, str(ROOT / 'examples/flower'))\n"
        "import gradstore_flower_example.server_app, gradstore_flower_example.client_app"
    ),
    ".safetensors": _SAFETENSORS,
}


def table(page: str) -> dict[str, tuple[str, ...]]:
    """The Install section's rows: way in (its first code span) -> the extras it names."""
    section = page.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue  # prose, the header or its rule
        way = re.match(r"`([^`]+)`", cells[0]).group(1)  # type: ignore[union-attr]
        rows[way] = () if cells[1] == "none" else tuple(re.findall(r"`([^`]+)`", cells[1]))
    return rows


@cache
def rows() -> dict[str, tuple[str, ...]]:
    return table(PAGE.read_text("utf-8"))


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distributions(requirements: list[str]) -> set[str]:
    return {_normalise(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}  # type: ignore[union-attr]


@cache
def extras_packages() -> dict[str, frozenset[str]]:
    """Each user extra -> the top-level import names of its distributions (the core's left out)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = _distributions(project["dependencies"])
    by_distribution: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            by_distribution.setdefault(_normalise(dist), set()).add(module)
    out = {}
    for extra, requirements in project["optional-dependencies"].items():
        if extra == "dev":
            continue
        dists = _distributions(requirements) - core
        out[extra] = frozenset(m for d in dists for m in by_distribution.get(d, ()))
    return out


def probe(way: str, blocked: set[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "GRADSTORE_API")}
    return subprocess.run(
        [sys.executable, "-c", _HARNESS, ",".join(sorted(blocked)), PROBES[way], str(tmp), str(ROOT)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp,
    )  # fmt: skip


def test_the_table_names_pyprojects_extras_and_every_way_in_is_probed() -> None:
    assert rows().keys() == PROBES.keys()
    named = {extra for extras in rows().values() for extra in extras}
    assert named <= extras_packages().keys(), named - extras_packages().keys()
    assert all(extras_packages()[e] for e in named)  # installed here: their packages are known


def test_the_table_is_read_as_written() -> None:
    text = (
        "\n## Install\n\n| To run | Extras |\n| --- | --- |\n| `a b` (c) | none |\n"
        "| `x.y` | `p`, `q` |\n\nprose | with `a` bar\n## Next\n| `z` | `r` |\n"
    )
    assert table(text) == {"a b": (), "x.y": ("p", "q")}


@pytest.mark.parametrize("way", [w for w in PROBES if w != "gradstore"])
def test_without_its_extras_a_way_in_names_them_all(way: str, tmp_path: Path) -> None:
    blocked = set().union(*extras_packages().values())
    done = probe(way, blocked, tmp_path)
    assert done.returncode != 0, done.stdout + done.stderr
    wanted = f"pip install 'gradstore[{','.join(rows()[way])}]'"
    assert wanted in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("way", list(PROBES))
def test_a_way_in_runs_with_its_extras_only(way: str, tmp_path: Path) -> None:
    others = set(extras_packages()) - set(rows()[way])
    blocked = set().union(*(extras_packages()[e] for e in others)) - set().union(
        *(extras_packages()[e] for e in rows()[way])
    )
    done = probe(way, blocked, tmp_path)
    assert done.returncode == 0, f"blocked {sorted(blocked)}:\n" + done.stdout + done.stderr
