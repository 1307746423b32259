"""Flower runs its rounds through the coordinator's public face (the round kernel), never
through its rooms: a change inside ``coordinator`` cannot break Flower unseen."""

from __future__ import annotations

import ast
from pathlib import Path

import gradstore

ROOT = Path(gradstore.__file__).parent


def _coordinator_imports(path: Path) -> list[str]:
    """Every module under ``gradstore.coordinator`` that ``path`` (in ``flower/``) imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 2:  # from ..x import y, in gradstore/flower/
                module = f"gradstore.{module}" if module else "gradstore"
            elif node.level:
                continue  # flower's own modules
            names = (
                [f"{module}.{a.name}" for a in node.names] if module == "gradstore" else [module]
            )
            found += [m for m in names if m.startswith("gradstore.coordinator")]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("gradstore.coordinator")]
    return found


def test_flower_imports_the_coordinator_only_through_its_public_face() -> None:
    files = sorted((ROOT / "flower").rglob("*.py"))
    assert files
    private = {
        f"{path.name}: {module}"
        for path in files
        for module in _coordinator_imports(path)
        if module != "gradstore.coordinator"
    }
    assert not private
    assert any(_coordinator_imports(path) for path in files)  # it does use the kernel
