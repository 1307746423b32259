"""Package names loaded from their modules on first use (PEP 562), so importing a package
costs only what its caller uses.

``gradstore.format``, ``dag`` and ``store`` re-export names from modules that need NumPy;
``gradstore cid`` and ``put`` of an ``.npz`` need none of them, and NumPy is 40-60 ms of
such a command's start. A package lists where each name lives, and imports the same names
under ``TYPE_CHECKING`` for type checkers and readers (a test keeps the two lists equal)::

    __getattr__, __dir__ = lazy_exports(__name__, {"Gradient": "_gradient", ...})
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``homes`` maps each name to the
    submodule that defines it (``"_dtypes:canonical_dtype"`` when it is exported under
    another name). A loaded name is kept in the package's namespace."""
    namespace = vars(sys.modules[package])

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = home.partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attribute or name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
