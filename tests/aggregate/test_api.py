"""The public face of gradstore.aggregate."""

from __future__ import annotations

import types

import gradstore.aggregate as aggregate_pkg


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name, value in vars(aggregate_pkg).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }

    # isort style, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then functions.
    def style(name: str) -> tuple[int, str]:
        return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)

    assert aggregate_pkg.__all__ == sorted(aggregate_pkg.__all__, key=style)
    assert set(aggregate_pkg.__all__) == public
