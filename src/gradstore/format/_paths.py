"""Error paths like ``$.meta.lr[2]``, assembled only when something fails."""

from __future__ import annotations

import json
import re

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class PathError(Exception):
    """Internal: content is wrong somewhere below; each level adds its segment while unwinding."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.segments: list[str | int] = []  # innermost first


def render(prefix: str, segments: list[str | int]) -> str:
    """``prefix`` followed by the segments (outermost first): ``.key``, ``["odd key"]``, ``[3]``."""
    out = [prefix]
    for seg in reversed(segments):
        if isinstance(seg, int):
            out.append(f"[{seg}]")
        elif _IDENT.match(seg):
            out.append(f".{seg}")
        else:
            out.append(f"[{json.dumps(seg)}]")
    return "".join(out)
