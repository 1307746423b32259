"""Every module gradstore imports at run time is the standard library's, ours, or declared,
and an optional extra's package is imported only behind a guard that names the extra.

Imports under ``if TYPE_CHECKING:`` are for the type checker only (mypy reads
``typing_extensions`` from its own typeshed); every other import, at module
level or inside a function, must come from a distribution pyproject names: the
core dependencies, or an optional extra (a feature's package, such as torch for
``gradstore.torch``); never from the ``dev`` extra, which users do not install.

These tests hold on an install without the extras too (scripts/test runs this file in
one): a package that is not installed is known by its distribution's name
(``_DISTRIBUTIONS`` for the few whose import name differs), and without an extra every
module either imports or raises ``MissingExtraError`` naming it.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import gradstore

ROOT = Path(gradstore.__file__).parent
PYPROJECT = ROOT.parent.parent / "pyproject.toml"

#: Import names of extras' packages that differ from their distribution's name: how an
#: import is traced to pyproject when the extra is not installed here.
_DISTRIBUTIONS = {"sklearn": "scikit-learn"}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_normalise(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}  # type: ignore[union-attr]


def _project() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())["project"]  # type: ignore[no-any-return]


def _core() -> set[str]:
    return _names(_project()["dependencies"])


def _extras() -> set[str]:
    """Distributions of the optional extras users install (not ``dev``)."""
    extras: set[str] = set()
    for extra, requirements in _project()["optional-dependencies"].items():
        if extra != "dev":
            extras |= _names(requirements)
    return extras


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


@dataclass(frozen=True)
class ImportSite:
    """One run-time import: its top-level name, line, and whether a guard names the extra."""

    name: str
    line: int
    guarded: bool  # inside ``try:`` whose ``except ImportError`` raises MissingExtraError


def _names_extra(handler: ast.ExceptHandler) -> bool:
    """An ``except`` clause that catches ImportError and raises MissingExtraError."""
    caught = handler.type
    types = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    if not any(
        isinstance(t, ast.Name) and t.id in ("ImportError", "ModuleNotFoundError") for t in types
    ):
        return False
    return any(
        isinstance(node, ast.Raise)
        and isinstance(node.exc, ast.Call)
        and isinstance(node.exc.func, ast.Name)
        and node.exc.func.id == "MissingExtraError"
        for stmt in handler.body
        for node in ast.walk(stmt)
    )


def import_sites(source: str) -> list[ImportSite]:
    """Absolute imports outside ``if TYPE_CHECKING:`` blocks, each with its guard."""
    found: list[ImportSite] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, guarded)
            return
        if isinstance(node, ast.Try):
            inner = guarded or any(_names_extra(h) for h in node.handlers)
            for child in node.body:
                visit(child, inner)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, guarded)
            return
        if isinstance(node, ast.Import):
            found.extend(ImportSite(a.name.split(".")[0], node.lineno, guarded) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(ImportSite(node.module.split(".")[0], node.lineno, guarded))
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)

    visit(ast.parse(source), False)
    return found


def runtime_imports(source: str) -> set[str]:
    """Top-level names of absolute imports outside ``if TYPE_CHECKING:`` blocks."""
    return {site.name for site in import_sites(source)}


def _sources() -> Iterator[tuple[Path, list[ImportSite]]]:
    for path in sorted(ROOT.rglob("*.py")):
        sites = [
            s
            for s in import_sites(path.read_text())
            if s.name not in sys.stdlib_module_names and s.name not in ("gradstore", "__future__")
        ]
        yield path, sites


def _distributions(name: str, installed: dict[str, list[str]]) -> set[str]:
    """The distributions that provide the import ``name``: as installed, else by its name."""
    if name in installed:
        return {_normalise(d) for d in installed[name]}
    return {_normalise(_DISTRIBUTIONS.get(name, name))}


def _extras_only_imports() -> dict[str, set[str]]:
    """Import name -> the extras' distributions providing it, for packages no core one does."""
    core, extras, installed = _core(), _extras(), packages_distributions()
    found: dict[str, set[str]] = {}
    for _, sites in _sources():
        for site in sites:
            provided = _distributions(site.name, installed)
            if provided & extras and not provided & core:
                found[site.name] = provided & extras
    return found


def test_every_runtime_import_is_declared() -> None:
    allowed = _core() | _extras()
    installed = packages_distributions()
    wrong = []
    for path, sites in _sources():
        for name in sorted({s.name for s in sites}):
            provided = _distributions(name, installed)
            if not provided & allowed:
                wrong.append(f"{path.relative_to(ROOT)}: {name} (from {sorted(provided)})")
    assert not wrong, "imported at run time but not declared in pyproject:\n" + "\n".join(wrong)


def test_an_extras_package_is_imported_only_behind_a_guard_naming_the_extra() -> None:
    """Inside ``try: ... except ImportError: raise MissingExtraError(...)``, or in a package
    whose ``__init__`` imports it so (``gradstore.torch``, ``gradstore.flower``)."""
    extras_only = _extras_only_imports()
    assert {"torch", "flwr", "safetensors", "sklearn", "matplotlib"} <= set(extras_only)
    guarded_packages = {
        (path.parent, site.name)
        for path, sites in _sources()
        if path.name == "__init__.py"
        for site in sites
        if site.guarded
    }
    bare = []
    for path, sites in _sources():
        for site in sites:
            if site.name not in extras_only or site.guarded:
                continue
            if any((folder, site.name) in guarded_packages for folder in path.parents):
                continue
            bare.append(f"{path.relative_to(ROOT)}:{site.line}: {site.name}")
    assert not bare, "an extra's package imported with no MissingExtraError:\n" + "\n".join(bare)


#: Run in a fresh interpreter: block the extras' packages, then import every module and call
#: the functions that import an extra when called. Prints ``module: extra`` per refusal.
_WITHOUT_EXTRAS = """
import importlib, pkgutil, sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # `import name` fails, as on an install without it
import gradstore
from gradstore.errors import MissingExtraError
for info in pkgutil.walk_packages(gradstore.__path__, "gradstore.", onerror=lambda name: None):
    if info.name.endswith("__main__"):
        continue  # runs the command line
    try:
        importlib.import_module(info.name)
    except MissingExtraError as exc:
        print(f"{info.name}: {exc.extra}")
from gradstore import demo
calls = {
    "demo.load_digits_data": lambda: demo.load_digits_data(),
    "demo.write_plot": lambda: demo.write_plot([], "unused.png"),
    "demo.make_model(cnn)": lambda: demo.make_model("cnn", 64, 10),
}
for what, call in calls.items():
    try:
        call()
    except MissingExtraError as exc:
        print(f"{what}: {exc.extra}")
    else:
        raise AssertionError(what + " worked without its extra")
"""


def test_without_the_extras_every_module_imports_or_names_its_extra() -> None:
    blocked = sorted(_extras_only_imports())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS, *blocked],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr  # an ImportError that names no extra, say
    assert done.stdout.splitlines() == [
        "gradstore.demo._torch_model: torch",
        "gradstore.flower: flower",
        "gradstore.torch: torch",
        "demo.load_digits_data: demo",
        "demo.write_plot: demo",
        "demo.make_model(cnn): torch",
    ]


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


def test_a_guard_is_an_except_import_error_that_raises_missing_extra_error() -> None:
    source = (
        "try:\n"
        "    import torch\n"
        "except ImportError:\n"
        "    raise MissingExtraError('torch', 'x') from None\n"
        "try:\n"
        "    import flwr\n"
        "except ImportError:\n"
        "    raise GradstoreError('install flwr')\n"
        "def f():\n"
        "    try:\n"
        "        import sklearn\n"
        "    except (ModuleNotFoundError, OSError) as exc:\n"
        "        raise MissingExtraError('demo', 'y') from exc\n"
        "    import matplotlib\n"
    )
    assert [(s.name, s.guarded) for s in import_sites(source)] == [
        ("torch", True),
        ("flwr", False),
        ("sklearn", True),
        ("matplotlib", False),
    ]
