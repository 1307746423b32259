"""The canonical gradstore/1 document: Gradient <-> msgpack bytes (DESIGN section 1).

``encode`` streams the canonical bytes (header pieces plus zero-copy views of
the arrays); ``decode`` refuses every non-canonical byte string and returns
zero-copy ``np.frombuffer`` views, within caller-set :class:`Limits`.
"""

from ._decode import decode
from ._dtypes import DTYPES, numpy_dtype
from ._encode import FORMAT_ID, EncodedDocument, encode
from ._gradient import Gradient
from ._header import DocumentHeader, TensorInfo, read_header
from ._limits import DEFAULT_LIMITS, Limits

__all__ = [
    "DEFAULT_LIMITS",
    "DTYPES",
    "FORMAT_ID",
    "DocumentHeader",
    "EncodedDocument",
    "Gradient",
    "Limits",
    "TensorInfo",
    "decode",
    "encode",
    "numpy_dtype",
    "read_header",
]
