#!/usr/bin/env python3
"""verify_history: the same as `gradstore audit history` (see `gradstore audit history --help`)."""

import sys

from gradstore.cli import main  # the installed package (pip install -e ., or scripts/demo)

if __name__ == "__main__":
    sys.exit(main(["audit", "history", *sys.argv[1:]]))
