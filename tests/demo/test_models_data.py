"""The demo's models compute exact gradients, and its data split is what the README promises."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gradstore.demo import (
    MLP,
    SoftmaxRegression,
    accuracy,
    digits_split,
    full_batch_losses,
    local_sgd,
    make_model,
    split,
)

SEED = 1234


@pytest.mark.parametrize(
    "model", [SoftmaxRegression(6, 3), MLP(6, 3, hidden=5)], ids=lambda m: m.name
)
def test_gradient_matches_finite_differences(model):
    rng = np.random.default_rng(SEED)
    params = model.init(rng)
    params = {k: v + rng.normal(0, 0.3, v.shape) for k, v in params.items()}  # non-zero biases too
    x = rng.random((7, 6))
    y = rng.integers(0, 3, 7)
    _, grad = model.loss_and_gradient(params, x, y)
    eps = 1e-6
    for name, value in params.items():
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            up = {k: v.copy() for k, v in params.items()}
            down = {k: v.copy() for k, v in params.items()}
            up[name][idx] += eps
            down[name][idx] -= eps
            numeric[idx] = (model.loss(up, x, y) - model.loss(down, x, y)) / (2 * eps)
        np.testing.assert_allclose(
            grad[name], numeric, rtol=1e-5, atol=1e-8, err_msg=f"{name} seed={SEED}"
        )
        assert grad[name].dtype == np.float64 and grad[name].shape == value.shape


def test_loss_and_gradient_agree_on_the_loss():
    model = MLP(6, 3, hidden=4)
    rng = np.random.default_rng(SEED)
    params = model.init(rng)
    x, y = rng.random((5, 6)), rng.integers(0, 3, 5)
    assert model.loss_and_gradient(params, x, y)[0] == model.loss(params, x, y)


def test_make_model_refuses_unknown_names():
    assert make_model("mlp", 64, 10).name == "mlp"
    with pytest.raises(
        ValueError, match="unknown model 'resnet'; expected one of softmax, mlp, cnn"
    ):
        make_model("resnet", 64, 10)
    assert make_model("cnn", 64, 10).name == "cnn"  # the PyTorch one (torch extra)


def test_split_gives_equal_disjoint_shards_and_a_held_out_fifth():
    x = np.arange(103, dtype=np.float64).reshape(103, 1)
    y = np.arange(103) % 10
    s = split(x, y, peers=4, seed=SEED)
    assert len(s.y_test) == 21  # round(103 * 0.2)
    assert [len(sh) for sh in s.shards] == [20, 20, 20, 20]  # 82 // 4, remainder of 2 dropped
    rows = np.concatenate([s.x_test[:, 0], *[sh.x[:, 0] for sh in s.shards]])
    assert len(set(rows.tolist())) == len(rows)  # no sample twice
    again = split(x, y, peers=4, seed=SEED)
    assert np.array_equal(again.shards[2].x, s.shards[2].x)
    other = split(x, y, peers=4, seed=SEED + 1)
    assert not np.array_equal(other.shards[0].x, s.shards[0].x)


@pytest.mark.parametrize("peers", [0, 200])
def test_split_refuses_impossible_peer_counts(peers):
    x = np.zeros((100, 2))
    with pytest.raises(ValueError, match=r"peer|shards"):
        split(x, np.zeros(100, dtype=np.int64), peers=peers, seed=SEED)


def test_digits_are_scaled_and_have_ten_classes():
    data = digits_split(peers=3, seed=SEED)
    assert data.n_classes == 10 and data.n_features == 64
    assert data.x_train.min() >= 0.0 and data.x_train.max() <= 1.0
    assert data.x_train.dtype == np.float64
    assert len(data.y_test) == 359  # 20% of 1797


def test_local_sgd_is_seeded_and_learns():
    data = digits_split(peers=1, seed=SEED)
    model = SoftmaxRegression(64, 10)
    start = model.init(np.random.default_rng(SEED))
    kwargs = dict(epochs=2, batch_size=32, lr=0.1)
    a = local_sgd(model, start, data.shards[0], rng=np.random.default_rng(SEED), **kwargs)
    b = local_sgd(model, start, data.shards[0], rng=np.random.default_rng(SEED), **kwargs)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert accuracy(model, a, data.x_test, data.y_test) > 0.8


def test_full_batch_losses_decrease():
    data = digits_split(peers=2, seed=SEED)
    model = SoftmaxRegression(64, 10)
    losses = full_batch_losses(
        model, model.init(np.random.default_rng(SEED)), data, steps=5, lr=0.5
    )
    assert all(b < a for a, b in itertools.pairwise(losses))
