"""Re-executing a stage's forward pass from the CIDs it recorded: its input activations and
its parameters give, on the same software and machine, the very document (the same CID) it
published as its output (docs/design/pipeline.md says how far that holds)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..dag.cid import CID
from ..format import Gradient
from ..store import GradientStore
from .layers import DenseStage
from .runner import ACTIVATION


@dataclass(frozen=True)
class ForwardAudit:
    """The published output CID, the one re-execution gives, and the largest absolute
    difference of their activations (0.0 when the CIDs agree)."""

    published: CID
    recomputed: CID
    max_abs_diff: float

    @property
    def matches(self) -> bool:
        """Whether re-execution gave the published document bit for bit."""
        return self.published == self.recomputed


async def reexecute_forward(
    store: GradientStore, layer: DenseStage, *, input_cid: CID, params_cid: CID, output_cid: CID
) -> ForwardAudit:
    """Fetch (verified) the input and parameter documents, run ``layer``'s forward pass, and
    rebuild the output document with the published one's meta: its CID must be
    ``output_cid``."""
    x = (await store.get(input_cid)).tensors[ACTIVATION]
    params = (await store.get(params_cid)).tensors
    published = await store.get(output_cid)
    out = layer.forward(params, np.asarray(x, dtype=np.float64))
    recomputed = await store.put(
        Gradient({ACTIVATION: np.ascontiguousarray(out)}, dict(published.meta)), pin=False
    )
    diff = float(np.max(np.abs(out - np.asarray(published.tensors[ACTIVATION]))))
    return ForwardAudit(output_cid, recomputed, diff)
