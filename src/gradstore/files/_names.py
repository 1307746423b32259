"""The tensor names a file is written with: those a gradstore document accepts.

A ``Gradient`` built in Python may hold names the format refuses (``"../x"``, controls):
refused before a file is opened, so what is written can be stored and read back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import FormatError
from ..format import name_problem

if TYPE_CHECKING:
    from ..format import Gradient


def check_names(target: str | Path, gradient: Gradient) -> None:
    """Refuse (FormatError naming ``target``) a tensor name the format refuses."""
    for name in gradient.tensors:
        problem = name_problem(name)
        if problem is not None:
            raise FormatError(f"{target}: tensor name {name!r} {problem}")


def stream_name(stream: object) -> str:
    """What refusals call a stream: its file name, if it has one."""
    name = getattr(stream, "name", None)
    return name if isinstance(name, str) else "<stream>"
