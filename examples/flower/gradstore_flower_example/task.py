"""The model and data: softmax regression on scikit-learn's 8x8 digits (shipped, no download)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.datasets import load_digits

Array = np.ndarray[Any, Any]
N_FEATURES, N_CLASSES = 64, 10


def initial_model() -> dict[str, Array]:
    """Zero weights: every run starts from the same model."""
    return {
        "linear.weight": np.zeros((N_CLASSES, N_FEATURES), np.float32),
        "linear.bias": np.zeros(N_CLASSES, np.float32),
    }


def data(partition: int, partitions: int, seed: int) -> tuple[Array, Array, Array, Array]:
    """(x, y) of this partition's training shard, and the held-out set everyone is scored on."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(y))
    x, y = x[order], y[order]
    held = len(y) // 5
    x_train, y_train = x[held:], y[held:]
    return x_train[partition::partitions], y_train[partition::partitions], x[:held], y[:held]


def _probabilities(model: dict[str, Array], x: Array) -> Array:
    logits = x @ model["linear.weight"].T + model["linear.bias"]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    return p / p.sum(axis=1, keepdims=True)


def train(model: dict[str, Array], x: Array, y: Array, epochs: int, lr: float) -> dict[str, Array]:
    """Full-batch gradient descent on the cross-entropy; returns the new weights."""
    w = model["linear.weight"].astype(np.float32).copy()
    b = model["linear.bias"].astype(np.float32).copy()
    onehot = np.eye(N_CLASSES, dtype=np.float32)[y]
    for _ in range(epochs):
        p = _probabilities({"linear.weight": w, "linear.bias": b}, x)
        err = (p - onehot) / len(y)
        w -= lr * (err.T @ x)
        b -= lr * err.sum(axis=0)
    return {"linear.weight": w, "linear.bias": b}


def accuracy(model: dict[str, Array], x: Array, y: Array) -> float:
    return float((_probabilities(model, x).argmax(axis=1) == y).mean())
