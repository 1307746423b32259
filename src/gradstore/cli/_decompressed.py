"""The dense gradient ``get`` and ``decode`` write: a compressed document (gradstore/2)
decompressed, to each tensor's declared dtype or (``--float64``) to the exact float64
values; a dense document as it is, untouched.

The declared dtype is what the user stored (float32 in, float32 out). Its dense bytes are
already bounded by the decoder, which counts them against ``--max-bytes`` as it does a
dense document's; the float64 values are bounded by ``CompressedGradient.decompress``.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..errors import FormatError
from ..files import check_npz_dtypes, is_safetensors
from ..format import CompressedGradient, CompressedTensor, Gradient
from ._documents import DocumentOptions
from ._exit import UsageError
from ._output import announce_written, save_output
from ._text import printable


def write_dense(
    document: Gradient | CompressedGradient,
    subject: str,
    options: DocumentOptions,
    *,
    output: str,
    float64: bool,
) -> None:
    """Write ``document`` (read or fetched as ``subject``) to ``-o output`` as ``get`` and
    ``decode`` do: decompressed if it is compressed (``--float64``: to the exact values,
    within ``options``' limits), saying so on stderr once it is written."""
    with options.named_limits(subject):
        gradient, note = _dense_to_write(document, subject, options, output, float64)
    save_output(output, gradient)
    if note is not None:
        print(note, file=sys.stderr)
    announce_written(output)


def _dense_to_write(
    document: Gradient | CompressedGradient,
    subject: str,
    options: DocumentOptions,
    output: str,
    float64: bool,
) -> tuple[Gradient, str | None]:
    """The gradient to write for ``document`` (fetched or read as ``subject``), and for a
    compressed one the line for stderr that says it was decompressed (printed once the
    file is written: a failure stays one error line)."""
    if isinstance(document, Gradient):
        if float64:
            raise UsageError(
                f"--float64 is for compressed documents; {subject} is a dense gradstore/1 "
                "document, whose tensors are written exactly as stored: drop --float64"
            )
        return document, None
    if float64:
        dense = document.decompress(max_bytes=options.limits.max_bytes)
        into = "float64"
    else:
        if not is_safetensors(output):  # refused before decompressing, not after
            check_npz_dtypes(
                output,
                ((n, t.dtype_code) for n, t in document.tensors.items()),
                also=" (or pass --float64)",
            )
        dense = Gradient(
            {
                name: _as_declared(t, f"{subject}: tensor {name!r}")
                for name, t in document.tensors.items()
            },
            dict(document.meta),
        )
        into = "each tensor's declared dtype"
    note = (
        f"{printable(subject)}: compressed with codec {document.codec} (gradstore/2); "
        f"decompressed to {into}"
    )
    return dense, note


def _as_declared(tensor: CompressedTensor, what: str) -> np.ndarray[Any, Any]:
    """``tensor`` decompressed and rounded once (to nearest, ties to even) to its dtype.

    Refuses a value beyond the dtype's range (``compress`` refuses the inputs that would
    give one, see ``compress._tensor.overflow_problem``; a hostile document may hold one),
    rather than writing an infinity that was never stored: the check the coordinator
    verifies inputs with (``aggregate.first_beyond_dtype``).
    """
    from ..aggregate import first_beyond_dtype

    out = np.empty(tensor.shape, tensor.dtype)
    if first_beyond_dtype(tensor, out.reshape(-1)) is not None:
        raise FormatError(
            f"{what}: a decompressed value is beyond the range of its declared "
            f"dtype {tensor.dtype}; --float64 writes the exact values"
        )
    return out
