"""Compressing a loaded gradient for put and peer publish, with an error-feedback residual file.

The residual is saved (atomically) only once the caller says the update was taken: a
failed put or publish leaves it as it was, so retrying the same gradient stores the same
document (docs/design/compression.md, "Error feedback").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from ..compress import compress, load_residual, parse_spec, save_residual, with_feedback
from ..format import CompressedGradient, Gradient
from ._exit import UsageError


def residual_next_to_key(key: str | Path, job: str, step: str | None = None) -> Path:
    """``KEY.residual-JOB`` in the key's folder (the job name made safe for a file name), and
    ``KEY.residual-JOB@STEP`` for one step of a stepped job (``@`` is in no job or step name)."""
    path = Path(key)
    name = f"{path.name}.residual-{_safe(job)}"
    return path.with_name(name if step is None else f"{name}@{_safe(step)}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def compressed_update(
    spec: str | None,
    residual: str | None,
    gradient: Gradient,
    *,
    default_residual: Path | None = None,
) -> tuple[Gradient | CompressedGradient, Callable[[], None]]:
    """What to store for ``gradient`` under ``--compress spec``/``--residual residual``, and
    the call that saves the new residual once the update has been taken (a no-op without
    one)."""
    if spec is None:
        if residual is not None:
            raise UsageError("--residual keeps what compression leaves out: add --compress")
        return gradient, lambda: None
    codec = parse_spec(spec)
    path = Path(residual) if residual is not None else default_residual
    if path is None:
        return compress(gradient, codec), lambda: None
    document, left = with_feedback(gradient, codec, load_residual(path))

    def save() -> None:
        save_residual(path, left, codec)

    return document, save
