"""Every module gradstore imports at run time is the standard library's, ours, or declared.

Imports under ``if TYPE_CHECKING:`` are for the type checker only (mypy reads
``typing_extensions`` from its own typeshed); every other import, at module
level or inside a function, must come from a distribution pyproject names: the
core dependencies, or an optional extra (a feature's package, such as torch for
``gradstore.torch``); never from the ``dev`` extra, which users do not install.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import gradstore

ROOT = Path(gradstore.__file__).parent
PYPROJECT = ROOT.parent.parent / "pyproject.toml"


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_normalise(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}  # type: ignore[union-attr]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(source: str) -> set[str]:
    """Top-level names of absolute imports outside ``if TYPE_CHECKING:`` blocks."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def test_every_runtime_import_is_declared() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    allowed = _names(project["dependencies"])
    for extra, requirements in project["optional-dependencies"].items():
        if extra != "dev":
            allowed |= _names(requirements)
    dists = packages_distributions()
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        for name in sorted(runtime_imports(path.read_text())):
            if name in sys.stdlib_module_names or name in ("gradstore", "__future__"):
                continue
            provided = {_normalise(d) for d in dists.get(name, [])}
            if not provided & allowed:
                wrong.append(f"{path.relative_to(ROOT)}: {name} (from {sorted(provided)})")
    assert not wrong, "imported at run time but not declared in pyproject:\n" + "\n".join(wrong)


def test_the_check_skips_type_checking_imports_only() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import numpy as np\n"
        "if TYPE_CHECKING:\n"
        "    from typing_extensions import Buffer\n"
        "def f():\n"
        "    import sklearn.datasets\n"
    )
    assert runtime_imports(source) == {"typing", "numpy", "sklearn"}
