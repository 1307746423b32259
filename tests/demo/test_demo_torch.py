"""`gradstore demo --framework torch`: a PyTorch CNN trained across peers through the real stack."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradstore.cli import main
from gradstore.demo import DemoConfig, digits_split, full_batch_losses, make_model, run_demo
from gradstore.node import LocalNode

SEED = 7


def _run(config, node):
    data = digits_split(config.peers, config.seed)
    return asyncio.run(run_demo(config, node, data)), data


@pytest.mark.slow
def test_federated_cnn_reaches_95_percent_held_out_accuracy_in_20_rounds(tmp_path):
    config = DemoConfig(peers=4, rounds=20, model="cnn", framework="torch", seed=SEED)
    result, _ = _run(config, LocalNode(tmp_path / "node"))
    accuracies = [row.accuracy for row in result.rows]
    assert len(accuracies) == 20
    assert accuracies[-1] >= 0.95, f"seed {SEED}: {accuracies}"
    assert accuracies[0] < accuracies[-1]


def test_data_parallel_cnn_equals_full_batch_gradient_descent(tmp_path):
    config = DemoConfig(
        peers=3, rounds=3, mode="data-parallel", model="cnn", framework="torch", seed=SEED
    )
    result, data = _run(config, LocalNode(tmp_path / "node"))
    model = make_model("cnn", data.n_features, data.n_classes)
    init = model.init(np.random.default_rng(config.seed))
    reference = full_batch_losses(model, init, data, steps=3, lr=config.learning_rate)
    losses = [row.loss for row in result.rows]
    np.testing.assert_allclose(losses, reference, rtol=0, atol=1e-5, err_msg=f"seed {SEED}")
    assert losses[-1] < losses[0]


def test_cnn_gradient_is_autograds_and_travels_as_float64_arrays():
    data = digits_split(2, SEED)
    model = make_model("cnn", data.n_features, data.n_classes)
    params = model.init(np.random.default_rng(SEED))
    x, y = data.x_train[:50], data.y_train[:50]
    loss, grads = model.loss_and_gradient(params, x, y)
    assert grads.keys() == params.keys()
    assert all(g.dtype == np.float64 and g.shape == params[n].shape for n, g in grads.items())
    # central difference on one weight agrees with autograd
    eps = 1e-6
    for index in [(0, 0, 1, 1), (3, 0, 0, 2)]:
        up = {n: a.copy() for n, a in params.items()}
        down = {n: a.copy() for n, a in params.items()}
        up["conv.weight"][index] += eps
        down["conv.weight"][index] -= eps
        numeric = (model.loss(up, x, y) - model.loss(down, x, y)) / (2 * eps)
        assert abs(numeric - grads["conv.weight"][index]) < 1e-6
    assert abs(loss - model.loss(params, x, y)) < 1e-12


def test_the_demo_command_runs_the_torch_cnn(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GRADSTORE_API", raising=False)
    argv = ["demo", "--framework", "torch", "--local", str(tmp_path / "node"), "--peers", "2"]
    code = main([*argv, "--rounds", "2", "--quiet", "--seed", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "job: federated cnn, 2 peers" in out and "done: held-out accuracy" in out


@pytest.mark.parametrize(
    ("framework", "model"), [("numpy", "cnn"), ("torch", "mlp"), ("jax", "cnn")]
)
def test_models_belong_to_their_framework(framework, model):
    with pytest.raises(ValueError, match=r"framework|model"):
        DemoConfig(framework=framework, model=model)
