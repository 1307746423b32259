"""The digits data set for the demo: scaled, shuffled with a seed, held-out split, equal shards.

``sklearn.datasets.load_digits`` ships inside scikit-learn (8x8 images, 1797
samples, 10 classes): no download. scikit-learn is imported only here, so the
rest of gradstore works without the ``demo`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MissingExtraError

Array = np.ndarray[Any, Any]
HELD_OUT_FRACTION = 0.2


@dataclass(frozen=True)
class Shard:
    """One peer's training data."""

    x: Array
    y: Array

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class DigitsSplit:
    """Equal training shards (one per peer) and the held-out set everyone is scored on."""

    shards: tuple[Shard, ...]
    x_test: Array
    y_test: Array
    n_classes: int

    @property
    def n_features(self) -> int:
        return int(self.x_test.shape[1])

    @property
    def x_train(self) -> Array:
        """All shards stacked: the training set a single process would use."""
        return np.concatenate([s.x for s in self.shards])

    @property
    def y_train(self) -> Array:
        return np.concatenate([s.y for s in self.shards])


def load_digits_data() -> tuple[Array, Array]:
    """Features scaled to [0, 1] (pixel values are 0..16) as float64, labels as int64."""
    try:
        from sklearn.datasets import load_digits  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError as exc:
        raise MissingExtraError("demo", "the demo needs scikit-learn") from exc
    bunch = load_digits()
    return np.asarray(bunch.data, dtype=np.float64) / 16.0, np.asarray(bunch.target, dtype=np.int64)


def split(
    x: Array, y: Array, peers: int, seed: int, held_out: float = HELD_OUT_FRACTION
) -> DigitsSplit:
    """Shuffle with ``seed``, hold out ``held_out`` of the rows, cut the rest into ``peers`` shards.

    Shards have equal sizes (the remainder is dropped), so fedavg weights them
    equally and data-parallel training equals full-batch training on their union.
    """
    if peers < 1:
        raise ValueError(f"need at least one peer, got {peers}")
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = round(len(y) * held_out)
    test, train = order[:n_test], order[n_test:]
    per_peer = len(train) // peers
    if per_peer < 1:
        raise ValueError(f"{len(train)} training samples cannot make {peers} non-empty shards")
    shards = tuple(
        Shard(
            x[train[i * per_peer : (i + 1) * per_peer]], y[train[i * per_peer : (i + 1) * per_peer]]
        )
        for i in range(peers)
    )
    return DigitsSplit(shards, x[test], y[test], int(y.max()) + 1)


def digits_split(peers: int, seed: int) -> DigitsSplit:
    """The demo's data: digits, split for ``peers`` peers with ``seed``."""
    x, y = load_digits_data()
    return split(x, y, peers, seed)
