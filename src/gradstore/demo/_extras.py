"""The extras a demo run needs, checked before it starts: a missing one is named with every
extra of the run, not found only after the node, the job and the first round's training."""

from __future__ import annotations

import importlib.util
from typing import Final

from ..errors import MissingExtraError

#: What each extra brings that the demo imports: (import name, distribution).
_MODULES: Final = {"torch": ("torch", "PyTorch"), "demo": ("sklearn", "scikit-learn")}
_PLOT: Final = ("matplotlib", "matplotlib")  # the demo extra's, for --plot only


def demo_extras(framework: str) -> tuple[str, ...]:
    """The extras ``gradstore demo --framework FRAMEWORK`` needs, as ``pip install`` names them."""
    return ("torch", "demo") if framework == "torch" else ("demo",)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def check_demo_extras(framework: str, plot: bool = False) -> None:
    """Raise ``MissingExtraError`` naming every extra the run needs if a package of one is
    missing (``--plot`` adds matplotlib, which the demo extra brings)."""
    extras = demo_extras(framework)
    wanted = [_MODULES[extra] for extra in extras] + ([_PLOT] if plot else [])
    missing = [name for module, name in wanted if not _installed(module)]
    if missing:
        what = f"gradstore demo --framework {framework}" + (" --plot" if plot else "")
        raise MissingExtraError(",".join(extras), f"{what} needs {' and '.join(missing)}")
