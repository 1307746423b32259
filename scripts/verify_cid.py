#!/usr/bin/env python3
"""verify_cid: the same as `gradstore audit cid` (see `gradstore audit cid --help`)."""

import sys

from gradstore.cli import main  # the installed package (pip install -e ., or scripts/demo)

if __name__ == "__main__":
    sys.exit(main(["audit", "cid", *sys.argv[1:]]))
