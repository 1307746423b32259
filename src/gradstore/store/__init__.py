"""GradientStore: put/get/verify gradstore/1 documents over any Node."""

from ._put import Progress
from ._store import GradientStore, VerifyReport
from ._stored import StoredDocument, StoredGradient
from ._sync import SyncGradientStore

__all__ = [
    "GradientStore",
    "Progress",
    "StoredDocument",
    "StoredGradient",
    "SyncGradientStore",
    "VerifyReport",
]
