"""Imports point downwards through the layers of docs/design/layers.md.

Every ``import`` statement counts, wherever it is: at module level, inside a
function, or under ``if TYPE_CHECKING:`` (a cycle that only the type checker
sees is still two modules that cannot be understood apart).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import gradstore

RANK = {
    "_version": 0,
    "errors": 0,
    "_closing": 0,
    "_lazy_exports": 0,
    "_sync": 0,
    "format": 1,
    "compress": 2,
    "dag": 2,
    "files": 3,
    "node": 3,
    "store": 4,
    "aggregate": 5,
    "messages": 5,
    "job": 6,
    "peer": 7,
    "coordinator": 7,
    "population": 7,
    "pbt": 3,
    "audit": 8,
    "torch": 8,
    "flower": 8,
    "demo": 9,
    "cli": 10,
}
ROOT = Path(gradstore.__file__).parent
Graph = Mapping[str, set[str]]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "gradstore" else None


def imports(module: str, source: str, *, is_package: bool, known: set[str]) -> set[str]:
    """The modules ``module`` names in any import statement, relative ones resolved.

    ``from package import name`` points at ``package.name`` when that is a module
    (in ``known``), else at ``package``. Parents that Python imports on the way
    are not edges: only what the source names is.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    found.discard(module)
    return found


def _graph() -> dict[str, set[str]]:
    known = set(MODULES)
    return {
        name: imports(name, path.read_text(), is_package=path.name == "__init__.py", known=known)
        & known
        for name, path in MODULES.items()
    }


def cycles(graph: Graph) -> list[list[str]]:
    """Every strongly connected group of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_layer_imports_only_layers_below_it() -> None:
    wrong = []
    for name, path in MODULES.items():
        if path.parent == ROOT and path.name in ("__init__.py", "__main__.py"):
            continue  # the package's own __init__ / __main__ re-export from every layer
        own = _layer_of(name)
        assert own in RANK, f"{own}: a new layer needs a place in RANK"
        for module in imports(name, path.read_text(), is_package=False, known=set(MODULES)):
            if module == "gradstore":
                wrong.append(f"{name} imports the package root (which imports every layer)")
                continue
            other = _layer_of(module)
            if other is not None and other != own and other in RANK and RANK[other] >= RANK[own]:
                wrong.append(f"{name} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_no_module_is_part_of_an_import_cycle() -> None:
    graph = _graph()
    found = cycles(graph)
    detail = [
        " <-> ".join(group)
        + ": "
        + "; ".join(f"{a} -> {b}" for a in group for b in sorted(graph[a] & set(group)))
        for group in found
    ]
    assert not found, "import cycles:\n" + "\n".join(detail)


def test_the_cycle_check_sees_type_checking_and_function_level_imports() -> None:
    known = {"gradstore.node", "gradstore.node.kubo", "gradstore.node.guard", "gradstore.store"}
    guard = imports(
        "gradstore.node.guard",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .kubo import KuboNode\n",
        is_package=False,
        known=known,
    )
    kubo = imports(
        "gradstore.node.kubo",
        "def make():\n    from . import guard\n",
        is_package=False,
        known=known,
    )
    assert guard == {"typing", "gradstore.node.kubo"}
    assert kubo == {"gradstore.node.guard"}
    graph = {"gradstore.node.guard": guard & known, "gradstore.node.kubo": kubo & known}
    assert cycles(graph) == [["gradstore.node.guard", "gradstore.node.kubo"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_a_submodule_importing_the_package_root_is_a_cycle() -> None:
    known = {"gradstore", "gradstore.node", "gradstore.node.local"}
    local = imports(
        "gradstore.node.local", "from .. import __version__\n", is_package=False, known=known
    )
    assert local == {"gradstore"}
    graph = {
        "gradstore": {"gradstore.node"},
        "gradstore.node": {"gradstore.node.local"},
        "gradstore.node.local": local,
    }
    assert cycles(graph) == [sorted(known)]
