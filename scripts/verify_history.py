#!/usr/bin/env python3
"""verify_history: the same as `gradstore audit history` (see `gradstore audit history --help`)."""

import sys
from pathlib import Path

try:
    from gradstore.cli import main
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from gradstore.cli import main

if __name__ == "__main__":
    sys.exit(main(["audit", "history", *sys.argv[1:]]))
