"""The math of one stage of a layered NumPy model (the demo's MLP cut at its layers): a dense
layer's forward pass, its backward pass, and the last stage's loss. Pure functions of arrays,
so a stage's forward pass can be re-executed from its recorded inputs (``audit``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Array = np.ndarray[Any, Any]
Params = dict[str, Array]


@dataclass(frozen=True)
class DenseStage:
    """``activation(x @ {layer}.weight.T + {layer}.bias)``; the last stage of a model has no
    activation and ends in the mean cross-entropy."""

    layer: str
    activation: Literal["tanh", "none"] = "none"

    def names(self) -> tuple[str, str]:
        """The stage's tensor names: its weight and bias."""
        return f"{self.layer}.weight", f"{self.layer}.bias"

    def forward(self, params: Mapping[str, Array], x: Array) -> Array:
        """The stage's output for input rows ``x``."""
        w, b = self.names()
        z: Array = x @ params[w].T + params[b]
        return np.tanh(z) if self.activation == "tanh" else z

    def backward(
        self, params: Mapping[str, Array], x: Array, out: Array, grad_out: Array
    ) -> tuple[Array, Params]:
        """d(loss)/d(x) and d(loss)/d(parameters) from d(loss)/d(output)."""
        w, b = self.names()
        dz = grad_out * (1.0 - out * out) if self.activation == "tanh" else grad_out
        return dz @ params[w], {w: dz.T @ x, b: dz.sum(axis=0)}

    def loss_backward(
        self, params: Mapping[str, Array], x: Array, y: Array, n: int
    ) -> tuple[float, Array, Params]:
        """The last stage: the summed cross-entropy of these rows over ``n`` (the lane's
        rows in the round, so the micro-batches add up to its mean), d(it)/d(x) and
        d(it)/d(parameters)."""
        logits = self.forward(params, x)
        shifted = logits - logits.max(axis=1, keepdims=True)
        logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        rows = np.arange(len(y))
        loss = -float(logp[rows, y].sum()) / n
        dlogits = np.exp(logp)
        dlogits[rows, y] -= 1.0
        dlogits /= n
        grad_x, grads = self.backward(params, x, logits, dlogits)
        return loss, grad_x, grads


def mlp_stages() -> tuple[DenseStage, DenseStage]:
    """The demo MLP's two stages: ``fc1`` with tanh, then ``fc2`` and the loss."""
    return DenseStage("fc1", "tanh"), DenseStage("fc2")
