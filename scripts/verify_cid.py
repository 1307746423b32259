#!/usr/bin/env python3
"""verify_cid: see `python scripts/verify_cid.py --help` and gradstore.audit (DESIGN section 7)."""

import sys
from pathlib import Path

try:
    from gradstore.audit import verify_cid_main
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from gradstore.audit import verify_cid_main

if __name__ == "__main__":
    sys.exit(verify_cid_main())
