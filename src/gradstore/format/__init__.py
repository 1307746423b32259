"""The canonical documents: Gradient <-> gradstore/1, CompressedGradient <-> gradstore/2
(docs/spec.md, section 2; the reasons: docs/design/documents.md, docs/design/compression.md).

``encode`` streams the canonical bytes (header pieces plus zero-copy views of
the arrays); ``decode`` refuses every non-canonical byte string and returns
zero-copy ``np.frombuffer`` views, within caller-set :class:`Limits`; ``decode_any``
also takes compressed documents (their payloads decompress to float64 on request).
``dtype_code``/``numpy_dtype`` map NumPy dtypes to the document's type strings and
back (bfloat16 and float8 through ``ml_dtypes``).

Names are loaded on first use (``_lazy_exports``): the dtype tables, limits and the
document's layout need no NumPy, and a command that only moves bytes does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ._compressed import CompressedGradient, CompressedTensor
    from ._decode import decode, decode_any, decode_with_header, from_header
    from ._dtype_codes import DTYPES, EXTENDED, FLOATS, ITEMSIZE, NUMPY_CODES
    from ._dtypes import canonical_dtype as dtype_code
    from ._dtypes import is_float, numpy_dtype
    from ._encode import encode
    from ._finite import all_finite
    from ._fits import check_fits, check_layout
    from ._gradient import Gradient
    from ._header import DocumentHeader, TensorInfo, read_header
    from ._header_walk import HeaderWalk
    from ._layout import COMPRESSED_FORMAT_ID, FORMAT_ID, EncodedDocument, dense_layout
    from ._limits import DEFAULT_LIMITS, Limits
    from ._names import name_problem
    from ._payload import CHECK_SCRATCH_BYTES, read_range, sparse_range
    from .codecs import CODECS, Codec
    from .codecs.topk import VALUE_FORMATS

_HOMES = {
    "CODECS": "codecs",
    "VALUE_FORMATS": "codecs.topk",
    "Codec": "codecs",
    "CompressedGradient": "_compressed",
    "CompressedTensor": "_compressed",
    "decode": "_decode",
    "decode_any": "_decode",
    "decode_with_header": "_decode",
    "from_header": "_decode",
    "DTYPES": "_dtype_codes",
    "EXTENDED": "_dtype_codes",
    "FLOATS": "_dtype_codes",
    "ITEMSIZE": "_dtype_codes",
    "NUMPY_CODES": "_dtype_codes",
    "dtype_code": "_dtypes:canonical_dtype",
    "is_float": "_dtypes",
    "numpy_dtype": "_dtypes",
    "encode": "_encode",
    "all_finite": "_finite",
    "check_fits": "_fits",
    "check_layout": "_fits",
    "Gradient": "_gradient",
    "DocumentHeader": "_header",
    "TensorInfo": "_header",
    "read_header": "_header",
    "HeaderWalk": "_header_walk",
    "COMPRESSED_FORMAT_ID": "_layout",
    "FORMAT_ID": "_layout",
    "EncodedDocument": "_layout",
    "dense_layout": "_layout",
    "DEFAULT_LIMITS": "_limits",
    "Limits": "_limits",
    "name_problem": "_names",
    "CHECK_SCRATCH_BYTES": "_payload",
    "read_range": "_payload",
    "sparse_range": "_payload",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "CHECK_SCRATCH_BYTES",
    "CODECS",
    "COMPRESSED_FORMAT_ID",
    "DEFAULT_LIMITS",
    "DTYPES",
    "EXTENDED",
    "FLOATS",
    "FORMAT_ID",
    "ITEMSIZE",
    "NUMPY_CODES",
    "VALUE_FORMATS",
    "Codec",
    "CompressedGradient",
    "CompressedTensor",
    "DocumentHeader",
    "EncodedDocument",
    "Gradient",
    "HeaderWalk",
    "Limits",
    "TensorInfo",
    "all_finite",
    "check_fits",
    "check_layout",
    "decode",
    "decode_any",
    "decode_with_header",
    "dense_layout",
    "dtype_code",
    "encode",
    "from_header",
    "is_float",
    "name_problem",
    "numpy_dtype",
    "read_header",
    "read_range",
    "sparse_range",
]
