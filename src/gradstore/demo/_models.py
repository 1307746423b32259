"""Two small NumPy classifiers for the demo: softmax regression and a one-hidden-layer MLP.

Parameters are ``dict[str, ndarray]`` (float64, PyTorch-style names and
``(out, in)`` weight shapes), so a gradient or a model state is directly a
gradstore tensor map. Losses are the mean cross-entropy over the batch and
gradients are its exact derivative, so the sample-weighted average of shard
gradients is the full-batch gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

Array = np.ndarray[Any, Any]
Params = dict[str, Array]


class Model(Protocol):
    """What the demo needs from a model: init, loss, gradient and predictions."""

    @property
    def name(self) -> str:
        """Short name: "softmax" or "mlp" (written into each document's meta)."""
        ...

    def init(self, rng: np.random.Generator) -> Params:
        """Fresh float64 parameters drawn from ``rng``."""
        ...

    def loss(self, params: Params, x: Array, y: Array) -> float:
        """Mean cross-entropy of ``params`` on ``(x, y)``."""
        ...

    def loss_and_gradient(self, params: Params, x: Array, y: Array) -> tuple[float, Params]:
        """The mean cross-entropy and its gradient with respect to every parameter."""
        ...

    def predict(self, params: Params, x: Array) -> Array:
        """Predicted class of each row of ``x``."""
        ...


def _log_softmax(logits: Array) -> Array:
    shifted = logits - logits.max(axis=1, keepdims=True)
    out: Array = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return out


def _cross_entropy(logits: Array, y: Array) -> tuple[float, Array]:
    """Mean cross-entropy and d(loss)/d(logits)."""
    logp = _log_softmax(logits)
    n = logits.shape[0]
    loss = -float(logp[np.arange(n), y].mean())
    dlogits = np.exp(logp)
    dlogits[np.arange(n), y] -= 1.0
    dlogits /= n
    return loss, dlogits


@dataclass(frozen=True)
class SoftmaxRegression:
    """Multinomial logistic regression: ``logits = x @ weight.T + bias``."""

    n_features: int
    n_classes: int
    name: str = "softmax"

    def init(self, rng: np.random.Generator) -> Params:
        return {
            "linear.weight": rng.normal(0.0, 0.01, (self.n_classes, self.n_features)),
            "linear.bias": np.zeros(self.n_classes),
        }

    def _logits(self, params: Params, x: Array) -> Array:
        out: Array = x @ params["linear.weight"].T + params["linear.bias"]
        return out

    def loss(self, params: Params, x: Array, y: Array) -> float:
        return _cross_entropy(self._logits(params, x), y)[0]

    def loss_and_gradient(self, params: Params, x: Array, y: Array) -> tuple[float, Params]:
        loss, dlogits = _cross_entropy(self._logits(params, x), y)
        return loss, {"linear.weight": dlogits.T @ x, "linear.bias": dlogits.sum(axis=0)}

    def predict(self, params: Params, x: Array) -> Array:
        out: Array = self._logits(params, x).argmax(axis=1)
        return out


@dataclass(frozen=True)
class MLP:
    """``fc2(tanh(fc1(x)))``: one hidden layer, Xavier-style initialisation."""

    n_features: int
    n_classes: int
    hidden: int = 64
    name: str = "mlp"

    def init(self, rng: np.random.Generator) -> Params:
        return {
            "fc1.weight": rng.normal(
                0.0, 1.0 / np.sqrt(self.n_features), (self.hidden, self.n_features)
            ),
            "fc1.bias": np.zeros(self.hidden),
            "fc2.weight": rng.normal(
                0.0, 1.0 / np.sqrt(self.hidden), (self.n_classes, self.hidden)
            ),
            "fc2.bias": np.zeros(self.n_classes),
        }

    def _forward(self, params: Params, x: Array) -> tuple[Array, Array]:
        h = np.tanh(x @ params["fc1.weight"].T + params["fc1.bias"])
        logits: Array = h @ params["fc2.weight"].T + params["fc2.bias"]
        return h, logits

    def loss(self, params: Params, x: Array, y: Array) -> float:
        return _cross_entropy(self._forward(params, x)[1], y)[0]

    def loss_and_gradient(self, params: Params, x: Array, y: Array) -> tuple[float, Params]:
        h, logits = self._forward(params, x)
        loss, dlogits = _cross_entropy(logits, y)
        dh = (dlogits @ params["fc2.weight"]) * (1.0 - h * h)
        return loss, {
            "fc1.weight": dh.T @ x,
            "fc1.bias": dh.sum(axis=0),
            "fc2.weight": dlogits.T @ h,
            "fc2.bias": dlogits.sum(axis=0),
        }

    def predict(self, params: Params, x: Array) -> Array:
        out: Array = self._forward(params, x)[1].argmax(axis=1)
        return out


MODELS = ("softmax", "mlp")

#: The models of each framework: NumPy's are written out by hand; PyTorch's use autograd.
FRAMEWORK_MODELS = {"numpy": MODELS, "torch": ("cnn",)}


def make_model(name: str, n_features: int, n_classes: int, hidden: int | None = None) -> Model:
    """The model called ``name`` (one in ``FRAMEWORK_MODELS``) for this data's shape.

    ``hidden``: the MLP's hidden units (default 64). "cnn" is a PyTorch network and needs
    the ``torch`` extra.
    """
    if hidden is not None and name != "mlp":
        raise ValueError(f"hidden units are an mlp setting, not {name}'s")
    if name == "softmax":
        return SoftmaxRegression(n_features, n_classes)
    if name == "mlp":
        return MLP(n_features, n_classes) if hidden is None else MLP(n_features, n_classes, hidden)
    if name == "cnn":
        from ._torch_model import DigitsCNN  # imports torch: only when asked for

        return DigitsCNN(n_features, n_classes)
    known = [m for models in FRAMEWORK_MODELS.values() for m in models]
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(known)}")


def accuracy(model: Model, params: Params, x: Array, y: Array) -> float:
    """Fraction of rows of ``x`` whose predicted class is ``y``."""
    return float((model.predict(params, x) == y).mean())
