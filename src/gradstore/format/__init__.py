"""The canonical documents: Gradient <-> gradstore/1, CompressedGradient <-> gradstore/2
(docs/design.md, "The gradient document", "Compressed updates").

``encode`` streams the canonical bytes (header pieces plus zero-copy views of
the arrays); ``decode`` refuses every non-canonical byte string and returns
zero-copy ``np.frombuffer`` views, within caller-set :class:`Limits`; ``decode_any``
also takes compressed documents (their payloads decompress to float64 on request).
``dtype_code``/``numpy_dtype`` map NumPy dtypes to the document's type strings and
back (bfloat16 and float8 through ``ml_dtypes``).
"""

from ._codec import CODECS, VALUE_FORMATS, Codec
from ._compressed import CompressedGradient, CompressedTensor
from ._decode import decode, decode_any, decode_with_header
from ._dtypes import DTYPES, EXTENDED, FLOATS, ITEMSIZE, is_float, numpy_dtype
from ._dtypes import canonical_dtype as dtype_code
from ._encode import COMPRESSED_FORMAT_ID, FORMAT_ID, EncodedDocument, encode
from ._fits import check_fits
from ._gradient import Gradient
from ._header import DocumentHeader, TensorInfo, read_header
from ._limits import DEFAULT_LIMITS, Limits
from ._names import name_problem
from ._payload import read_range, sparse_range

__all__ = [
    "CODECS",
    "COMPRESSED_FORMAT_ID",
    "DEFAULT_LIMITS",
    "DTYPES",
    "EXTENDED",
    "FLOATS",
    "FORMAT_ID",
    "ITEMSIZE",
    "VALUE_FORMATS",
    "Codec",
    "CompressedGradient",
    "CompressedTensor",
    "DocumentHeader",
    "EncodedDocument",
    "Gradient",
    "Limits",
    "TensorInfo",
    "check_fits",
    "decode",
    "decode_any",
    "decode_with_header",
    "dtype_code",
    "encode",
    "is_float",
    "name_problem",
    "numpy_dtype",
    "read_header",
    "read_range",
    "sparse_range",
]
