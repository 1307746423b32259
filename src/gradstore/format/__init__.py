"""The canonical gradstore/1 document: Gradient <-> msgpack bytes (docs/design.md, "The gradient document").

``encode`` streams the canonical bytes (header pieces plus zero-copy views of
the arrays); ``decode`` refuses every non-canonical byte string and returns
zero-copy ``np.frombuffer`` views, within caller-set :class:`Limits`.
``dtype_code``/``numpy_dtype`` map NumPy dtypes to the document's type strings and
back (bfloat16 and float8 through ``ml_dtypes``).
"""

from ._decode import decode
from ._dtypes import DTYPES, EXTENDED, ITEMSIZE, is_float, numpy_dtype
from ._dtypes import canonical_dtype as dtype_code
from ._encode import FORMAT_ID, EncodedDocument, encode
from ._fits import check_fits
from ._gradient import Gradient
from ._header import DocumentHeader, TensorInfo, read_header
from ._limits import DEFAULT_LIMITS, Limits
from ._names import name_problem

__all__ = [
    "DEFAULT_LIMITS",
    "DTYPES",
    "EXTENDED",
    "FORMAT_ID",
    "ITEMSIZE",
    "DocumentHeader",
    "EncodedDocument",
    "Gradient",
    "Limits",
    "TensorInfo",
    "check_fits",
    "decode",
    "dtype_code",
    "encode",
    "is_float",
    "name_problem",
    "numpy_dtype",
    "read_header",
]
