"""gradstore: a content-addressed gradient store on IPFS.

The names most programs need, re-exported from the layer modules:

    from gradstore import Gradient, KuboNode, SyncGradientStore
    with SyncGradientStore(KuboNode()) as store:
        cid = store.put(Gradient({"w": w}))
"""

from ._version import __version__
from .dag import CID, file_cid
from .errors import (
    AggregationError,
    CIDError,
    CoordinatorError,
    DAGError,
    FormatError,
    GradstoreError,
    IntegrityError,
    LimitExceededError,
    MessageError,
    NodeError,
)
from .format import Gradient, Limits, decode, encode
from .node import KuboNode, LocalNode, Node
from .store import GradientStore, SyncGradientStore

__all__ = [
    "CID",
    "AggregationError",
    "CIDError",
    "CoordinatorError",
    "DAGError",
    "FormatError",
    "Gradient",
    "GradientStore",
    "GradstoreError",
    "IntegrityError",
    "KuboNode",
    "LimitExceededError",
    "Limits",
    "LocalNode",
    "MessageError",
    "Node",
    "NodeError",
    "SyncGradientStore",
    "__version__",
    "decode",
    "encode",
    "file_cid",
]
