"""The model-level output of a stepped round: one document holding every step's tensors.

Each step's aggregate is read back from the node (every block verified), and the model
document is written from the steps' arrays as they are (no copy): it holds every tensor
of the steps' outputs, in the document's canonical order, with the meta given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..dag import CID
from ..errors import InvalidDocumentError
from ..format import Gradient
from ._store import GradientStore


async def put_steps_output(
    store: GradientStore, outputs: Sequence[CID], meta: Mapping[str, Any]
) -> CID:
    """Store (pinned) the document holding every tensor of the ``outputs`` (the steps'
    aggregates), with ``meta``, and return its CID. Two outputs with one tensor name are
    refused (``InvalidDocumentError``): a tensor belongs to one step."""
    tensors: dict[str, Any] = {}
    for cid in outputs:
        step = await store.get(cid)
        for name, array in step.tensors.items():
            if name in tensors:
                raise InvalidDocumentError(
                    f"tensor {name[:80]!r} is in two steps' outputs (the second: {cid})", "$"
                )
            tensors[name] = array
    return await store.put(Gradient(tensors, dict(meta)))
