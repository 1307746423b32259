"""Imports point downwards through DESIGN's layers (plus job, audit and demo placed where they fit)."""

from __future__ import annotations

import ast
from pathlib import Path

import gradstore

RANK = {
    "errors": 0,
    "format": 1,
    "dag": 2,
    "node": 3,
    "store": 4,
    "aggregate": 5,
    "messages": 5,
    "job": 6,
    "peer": 7,
    "coordinator": 7,
    "audit": 8,
    "torch": 8,
    "flower": 8,
    "demo": 9,
    "cli": 10,
}
ROOT = Path(gradstore.__file__).parent


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "gradstore" else None


def _imports(path: Path) -> list[str]:
    package = ".".join(("gradstore", *path.relative_to(ROOT).with_suffix("").parts[:-1]))
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append(".".join([*base, *([node.module] if node.module else [])]))
            elif node.module:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def test_every_layer_imports_only_layers_below_it() -> None:
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if len(rel.parts) < 2:
            continue  # the package's own __init__ / __main__ re-export from every layer
        own = rel.parts[0]
        assert own in RANK, f"{own}: a new layer needs a place in RANK"
        for module in _imports(path):
            other = _layer_of(module)
            if other is not None and other != own and other in RANK and RANK[other] >= RANK[own]:
                wrong.append(f"{rel} imports {module}")
    assert not wrong, "\n".join(wrong)
