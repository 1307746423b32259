"""gradstore's benchmarks, each against a reference run on the same machine (docs/performance.md).

Run one from the repository root with ``python -m benchmarks <name> [args]``;
``python -m benchmarks --list`` names them. Not part of the gradstore package.
"""
