"""The demo's PyTorch network: a small CNN on the 8x8 digits, trained with torch autograd.

It speaks the demo's :class:`~gradstore.demo.Model` protocol (parameters as NumPy arrays
by name), converting with ``gradstore.torch`` at the boundary: parameters come in as
tensors over the arrays' memory, gradients go out as arrays over the tensors' memory,
so what travels through the store is exactly what ``to_gradient`` gives a PyTorch user.
Float64 throughout, like the NumPy models, so the demo's data-parallel mode still equals
full-batch gradient descent to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MissingExtraError

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    raise MissingExtraError("torch", "the demo's cnn model (PyTorch)") from None

from ..torch import numpy_to_tensor, tensor_to_numpy

Array = np.ndarray[Any, Any]
Params = dict[str, Array]


@dataclass(frozen=True)
class DigitsCNN:
    """conv 3x3 (1 -> ``channels``, padding 1) -> ReLU -> 2x2 max-pool -> linear to the classes."""

    n_features: int
    n_classes: int
    channels: int = 16
    name: str = "cnn"

    def __post_init__(self) -> None:
        side = math.isqrt(self.n_features)
        if side * side != self.n_features or side % 2:
            raise ValueError(f"the CNN needs square images of even side, got {self.n_features}")

    @property
    def side(self) -> int:
        return math.isqrt(self.n_features)

    def init(self, rng: np.random.Generator) -> Params:
        flat = self.channels * (self.side // 2) ** 2
        return {
            "conv.weight": rng.normal(0.0, np.sqrt(2.0 / 9), (self.channels, 1, 3, 3)),
            "conv.bias": np.zeros(self.channels),
            "fc.weight": rng.normal(0.0, np.sqrt(1.0 / flat), (self.n_classes, flat)),
            "fc.bias": np.zeros(self.n_classes),
        }

    def _logits(self, p: dict[str, torch.Tensor], x: Array) -> torch.Tensor:
        images = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64))
        h = F.conv2d(
            images.view(-1, 1, self.side, self.side), p["conv.weight"], p["conv.bias"], padding=1
        )
        h = F.max_pool2d(F.relu(h), 2)
        return F.linear(h.flatten(1), p["fc.weight"], p["fc.bias"])

    def _tensors(self, params: Params, grad: bool) -> dict[str, torch.Tensor]:
        return {
            name: numpy_to_tensor(np.asarray(a, np.float64), name).requires_grad_(grad)
            for name, a in params.items()
        }

    def loss(self, params: Params, x: Array, y: Array) -> float:
        with torch.no_grad():
            logits = self._logits(self._tensors(params, False), x)
            return float(F.cross_entropy(logits, torch.from_numpy(np.asarray(y, np.int64))))

    def loss_and_gradient(self, params: Params, x: Array, y: Array) -> tuple[float, Params]:
        p = self._tensors(params, True)
        loss = F.cross_entropy(self._logits(p, x), torch.from_numpy(np.asarray(y, np.int64)))
        loss.backward()  # type: ignore[no-untyped-call]
        grads = {}
        for name, t in p.items():
            assert t.grad is not None
            grads[name] = tensor_to_numpy(t.grad, name)
        return float(loss.detach()), grads

    def predict(self, params: Params, x: Array) -> Array:
        with torch.no_grad():
            out: Array = self._logits(self._tensors(params, False), x).argmax(dim=1).numpy()
        return out
