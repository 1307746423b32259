#!/usr/bin/env python3
"""Write small example gradients for the README's walkthrough (alice.npz and bob.npz).

    python examples/make_gradients.py                  # alice.npz and bob.npz, here
    python examples/make_gradients.py a.npz b.npz c.npz

Each file holds what a tiny linear classifier's gradient looks like (``fc.weight`` 10 x 64
and ``fc.bias`` 10, float32). The values are seeded by the file's name, so running it
again writes the same bytes, and so the same CIDs. Your own gradients are any .npz of
named arrays (``np.savez("g.npz", **{name: array})``) or a .safetensors file.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np


def write_example(path: Path) -> None:
    """One example gradient at exactly ``path``."""
    rng = np.random.default_rng(zlib.crc32(path.name.encode("utf-8")))
    tensors = {
        "fc.weight": (0.01 * rng.standard_normal((10, 64))).astype(np.float32),
        "fc.bias": (0.01 * rng.standard_normal(10)).astype(np.float32),
    }
    with open(path, "wb") as f:  # a file object: np.savez would append ".npz" to a name
        np.savez(f, **tensors)


def main(argv: list[str]) -> int:
    for name in argv or ["alice.npz", "bob.npz"]:
        write_example(Path(name))
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
