"""GradientStore: put/get/verify gradstore/1 (and compressed gradstore/2) documents over any Node."""

from ._put import Progress
from ._store import GradientStore, VerifyReport
from ._stored import StoredDocument, StoredGradient
from ._stored_compressed import StoredCompressed, StoredSparse
from ._sync import SyncGradientStore

__all__ = [
    "GradientStore",
    "Progress",
    "StoredCompressed",
    "StoredDocument",
    "StoredGradient",
    "StoredSparse",
    "SyncGradientStore",
    "VerifyReport",
]
