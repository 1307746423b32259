#!/usr/bin/env python3
"""verify_cid: the same as `gradstore audit cid` (see `gradstore audit cid --help`)."""

import sys
from pathlib import Path

try:
    from gradstore.cli import main
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from gradstore.cli import main

if __name__ == "__main__":
    sys.exit(main(["audit", "cid", *sys.argv[1:]]))
