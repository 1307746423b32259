"""GradientStore: put/get/verify gradstore/1 (and compressed gradstore/2) documents over any Node;
a stepped round's model-level document assembled from its steps' outputs (``put_model``).

Names are loaded on first use (``_lazy_exports``): ``GradientStore.put_document`` needs no
NumPy, and ``gradstore put`` does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ._assemble import ModelDocument, StepOutput, model_cid, open_model, open_output, put_model
    from ._fetch import Sink
    from ._put import ByteProgress, Progress
    from ._read_ahead import ReadAhead, ReadAheadPool, read_ahead
    from ._spilled import (
        SpilledDocument,
        SpillWriter,
        fits,
        free_space,
        spilled_source,
    )
    from ._store import GradientStore, VerifyReport
    from ._stored import StoredDocument, StoredGradient
    from ._stored_compressed import StoredCompressed, StoredSparse
    from ._sync import SyncGradientStore

_HOMES = {
    "Sink": "_fetch",
    "ByteProgress": "_put",
    "ModelDocument": "_assemble",
    "StepOutput": "_assemble",
    "model_cid": "_assemble",
    "open_model": "_assemble",
    "open_output": "_assemble",
    "put_model": "_assemble",
    "Progress": "_put",
    "GradientStore": "_store",
    "ReadAhead": "_read_ahead",
    "ReadAheadPool": "_read_ahead",
    "read_ahead": "_read_ahead",
    "VerifyReport": "_store",
    "SpilledDocument": "_spilled",
    "SpillWriter": "_spilled",
    "fits": "_spilled",
    "free_space": "_spilled",
    "spilled_source": "_spilled",
    "StoredDocument": "_stored",
    "StoredGradient": "_stored",
    "StoredCompressed": "_stored_compressed",
    "StoredSparse": "_stored_compressed",
    "SyncGradientStore": "_sync",
}
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "ByteProgress",
    "GradientStore",
    "ModelDocument",
    "Progress",
    "ReadAhead",
    "ReadAheadPool",
    "Sink",
    "SpillWriter",
    "SpilledDocument",
    "StepOutput",
    "StoredCompressed",
    "StoredDocument",
    "StoredGradient",
    "StoredSparse",
    "SyncGradientStore",
    "VerifyReport",
    "fits",
    "free_space",
    "model_cid",
    "open_model",
    "open_output",
    "put_model",
    "read_ahead",
    "spilled_source",
]
