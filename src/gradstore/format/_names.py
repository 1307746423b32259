"""Which tensor names a document may carry (the encoder and the decoder apply the same rule).

A name travels from a peer to other people's file names (``.npz`` members, which are
zip paths) and terminals (``gradstore inspect``), so a name must be neither a path that
leaves the folder it is unpacked in nor text that drives a terminal. The rule uses fixed
code point ranges, not Unicode categories, so that whether a document is valid never
depends on the Unicode version of the Python that decodes it.
"""

from __future__ import annotations

import re
from typing import Final

#: C0 controls, DEL, C1 controls (ESC and CSI start terminal escapes), the bidirectional
#: controls (they reorder what a terminal shows) and the line and paragraph separators.
_FORBIDDEN: Final = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_SEPARATORS: Final = re.compile(r"[/\\]")
_DRIVE: Final = re.compile(r"[A-Za-z]:[/\\]")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a tensor name, or None when it can.

    Refused: control characters (C0, DEL, C1), bidirectional controls and line
    separators; a ``..`` path segment (``/`` and ``\\`` both separate segments); and
    a name that a file system reads as absolute (``/x``, ``\\x``, ``C:/x``).
    ``layer1/weight``, ``conv1:0`` and ``a.b`` are fine.
    """
    bad = _FORBIDDEN.search(name)
    if bad is not None:
        return f"contains the control character U+{ord(bad.group()):04X}"
    if name[:1] in ("/", "\\") or _DRIVE.match(name):
        return "is an absolute path"
    if ".." in _SEPARATORS.split(name):
        return "has a '..' path segment"
    return None
