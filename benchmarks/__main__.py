"""The one runner: ``python -m benchmarks <name> [args]``; ``--list`` names every benchmark.

``python -m benchmarks store --mib 256`` runs ``benchmarks/bench_store.py`` as ``__main__``
with the arguments after the name, exactly as ``python -m benchmarks.bench_store --mib 256``.
"""

from __future__ import annotations

import ast
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

HERE: Final = Path(__file__).resolve().parent
PREFIX: Final = "bench_"
USAGE: Final = "usage: python -m benchmarks <name> [args]  (python -m benchmarks <name> --help)"


def benchmarks() -> dict[str, str]:
    """Each benchmark's name (its module without ``bench_``) and its docstring's first line.

    Read from the source, not imported: a benchmark's imports (torch, Flower) load only when it runs.
    """
    found: dict[str, str] = {}
    for path in sorted(HERE.glob(f"{PREFIX}*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        found[path.stem.removeprefix(PREFIX)] = doc.splitlines()[0] if doc else ""
    return found


def listing(found: dict[str, str]) -> str:
    """One line per benchmark: its name, then what it measures."""
    width = max(len(name) for name in found)
    return "\n".join(f"{name.ljust(width)}  {about}" for name, about in found.items())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark ``argv[0]`` names with the rest of ``argv``; exit 2 on an unknown name."""
    args = list(sys.argv[1:] if argv is None else argv)
    found = benchmarks()
    if not args or args[0] in ("-h", "--help"):
        print(f"{USAGE}\n\n{listing(found)}", file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "--list":
        print(listing(found))
        return 0
    name = args[0].removeprefix(PREFIX)
    if name not in found:
        print(
            f"benchmarks: no benchmark {args[0]!r}; these are:\n{listing(found)}", file=sys.stderr
        )
        return 2
    sys.argv = [sys.argv[0], *args[1:]]  # run_module puts the benchmark's own path first
    runpy.run_module(f"benchmarks.{PREFIX}{name}", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
