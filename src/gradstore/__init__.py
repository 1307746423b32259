"""gradstore: a content-addressed gradient store on IPFS.

The names most programs need, re-exported from the layer modules:

    from gradstore import Gradient, KuboNode, SyncGradientStore
    with SyncGradientStore(KuboNode()) as store:
        cid = store.put(Gradient({"w": w}))

They are imported on first use, so ``import gradstore.cli`` (every command's
start, ``gradstore --help``) does not load NumPy and httpx for nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy_exports import lazy_exports
from ._version import __version__

if TYPE_CHECKING:
    from .compress import ErrorFeedback
    from .dag import CID, file_cid
    from .errors import (
        AggregationError,
        AssemblyError,
        CIDError,
        CompressionError,
        ConfigError,
        CoordinatorError,
        DAGError,
        FormatError,
        GradstoreError,
        IntegrityError,
        LimitExceededError,
        MessageError,
        MissingExtraError,
        NodeError,
        Reason,
        RefusedError,
        StepError,
    )
    from .format import CompressedGradient, Gradient, Limits, decode, decode_any, encode
    from .node import KuboNode, LocalNode, Node
    from .store import GradientStore, SyncGradientStore

_ERRORS = (
    "AggregationError",
    "AssemblyError",
    "CIDError",
    "CompressionError",
    "ConfigError",
    "CoordinatorError",
    "DAGError",
    "FormatError",
    "GradstoreError",
    "IntegrityError",
    "LimitExceededError",
    "MessageError",
    "MissingExtraError",
    "NodeError",
    "Reason",
    "RefusedError",
    "StepError",
)
_HOMES: dict[str, str] = {
    "CID": "dag",
    "file_cid": "dag",
    "ErrorFeedback": "compress",
    **dict.fromkeys(_ERRORS, "errors"),
    "CompressedGradient": "format",
    "Gradient": "format",
    "Limits": "format",
    "decode": "format",
    "decode_any": "format",
    "encode": "format",
    "KuboNode": "node",
    "LocalNode": "node",
    "Node": "node",
    "GradientStore": "store",
    "SyncGradientStore": "store",
}
"""Where each re-exported name lives (the TYPE_CHECKING imports above say the same)."""


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


__all__ = [
    "CID",
    "AggregationError",
    "AssemblyError",
    "CIDError",
    "CompressedGradient",
    "CompressionError",
    "ConfigError",
    "CoordinatorError",
    "DAGError",
    "ErrorFeedback",
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
    "MissingExtraError",
    "Node",
    "NodeError",
    "Reason",
    "RefusedError",
    "StepError",
    "SyncGradientStore",
    "__version__",
    "decode",
    "decode_any",
    "encode",
    "file_cid",
]
