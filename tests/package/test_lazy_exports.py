"""Packages that load their names on first use say the same thing twice: the ``_HOMES``
table the loader follows, and the ``TYPE_CHECKING`` imports type checkers and readers see.
These tests keep the two equal, and every name loadable from where the table says."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

LAZY = ["gradstore", "gradstore.dag", "gradstore.files", "gradstore.format", "gradstore.store"]


def _type_checking_imports(package: str) -> dict[str, str]:
    """name -> "module[:attribute]" for every import under ``if TYPE_CHECKING:``."""
    module = importlib.import_module(package)
    tree = ast.parse(Path(module.__file__ or "").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.level == 1, ast.dump(stmt)
                for alias in stmt.names:
                    name = alias.asname or alias.name
                    home = stmt.module or ""
                    found[name] = home if alias.asname is None else f"{home}:{alias.name}"
    return found


@pytest.mark.parametrize("package", LAZY)
def test_the_table_and_the_type_checking_imports_name_the_same_homes(package: str) -> None:
    module = importlib.import_module(package)
    homes = dict(module._HOMES)
    assert _type_checking_imports(package) == homes
    assert set(module.__all__) - {"__version__"} == set(homes)


@pytest.mark.parametrize("package", LAZY)
def test_every_name_loads_from_its_home(package: str) -> None:
    module = importlib.import_module(package)
    for name, home in module._HOMES.items():
        submodule, _, attribute = home.partition(":")
        expected = getattr(importlib.import_module(f"{package}.{submodule}"), attribute or name)
        assert getattr(module, name) is expected, name
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018


def test_the_byte_moving_half_of_the_format_loads_without_numpy() -> None:
    """What the command line needs to write a document from a file's bytes."""
    code = (
        "import sys\n"
        "from gradstore.format import DEFAULT_LIMITS, FORMAT_ID, ITEMSIZE, EncodedDocument\n"
        "from gradstore.format._fits import check_layout\n"
        "from gradstore.format._layout import TensorSlot, dense_head, tensor_layout\n"
        "assert 'numpy' not in sys.modules, sorted(m for m in sys.modules if 'numpy' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
