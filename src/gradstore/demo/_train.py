"""Local training steps and the single-process baseline the data-parallel demo must match."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from ._data import DigitsSplit, Shard
from ._models import Model, Params


def sgd_step(params: Params, gradient: Params, lr: float) -> Params:
    """``params - lr * gradient`` (new arrays)."""
    return {name: value - lr * gradient[name] for name, value in params.items()}


def local_sgd(
    model: Model,
    params: Params,
    shard: Shard,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    rng: np.random.Generator,
    train: Collection[str] | None = None,
) -> Params:
    """Mini-batch SGD over ``shard`` for ``epochs`` epochs, reshuffled each epoch with ``rng``;
    with ``train``, only those parameters move (the others stay as given: a peer of the
    demo's body step does not train the head)."""
    params = {name: np.array(value, dtype=np.float64) for name, value in params.items()}
    n = len(shard)
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            _, grad = model.loss_and_gradient(params, shard.x[idx], shard.y[idx])
            if train is None:
                params = sgd_step(params, grad, lr)
            else:
                params = {
                    name: value - lr * grad[name] if name in train else value
                    for name, value in params.items()
                }
    return params


def full_batch_losses(
    model: Model, params: Params, data: DigitsSplit, *, steps: int, lr: float
) -> list[float]:
    """Training loss after each of ``steps`` full-batch gradient-descent steps on all shards.

    The reference for ``--mode data-parallel``: with equal shards the fedavg of
    the shard gradients is this full-batch gradient.
    """
    x, y = data.x_train, data.y_train
    losses = []
    for _ in range(steps):
        _, grad = model.loss_and_gradient(params, x, y)
        params = sgd_step(params, grad, lr)
        losses.append(model.loss(params, x, y))
    return losses
