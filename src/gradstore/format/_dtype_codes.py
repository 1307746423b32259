"""The dtype strings a document may hold and their element sizes: plain data, no NumPy.

The NumPy mapping of each (and ``ml_dtypes`` for the narrow floats) is ``_dtypes``; these
tables are what a reader or writer needs that moves bytes and never builds an array.
"""

from __future__ import annotations

from typing import Final

#: The extended floats: document name -> bytes per element. In memory they need ``ml_dtypes``.
EXTENDED: Final[dict[str, int]] = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

#: The optional extra that brings ``ml_dtypes``.
ML_DTYPES_EXTRA: Final = "ml-dtypes"

#: NumPy's little-endian type strings a document may hold, in the order of ``DTYPES``.
NUMPY_CODES: Final[tuple[str, ...]] = (
    "<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1",
)  # fmt: skip

#: Every type string allowed in ``dtype`` (docs/spec.md, section 2.2), in this order.
DTYPES: Final[tuple[str, ...]] = (*NUMPY_CODES, *EXTENDED)

#: The floating-point type strings: the dtypes a compressed tensor may stand for.
FLOATS: Final[tuple[str, ...]] = ("<f2", "<f4", "<f8", *EXTENDED)

#: Bytes per element of every allowed type string (``"<f4"``: the digits after the kind).
ITEMSIZE: Final[dict[str, int]] = {**{s: int(s[2:]) for s in NUMPY_CODES}, **EXTENDED}
