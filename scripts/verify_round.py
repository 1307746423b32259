#!/usr/bin/env python3
"""verify_round: the same as `gradstore audit round` (see `gradstore audit round --help`)."""

import sys

from gradstore.cli import main  # the installed package (pip install -e ., or scripts/demo)

if __name__ == "__main__":
    sys.exit(main(["audit", "round", *sys.argv[1:]]))
