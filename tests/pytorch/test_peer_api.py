"""TorchPeer's refusals, before anything reaches a node."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradstore.errors import CoordinatorError
from gradstore.format import Gradient
from gradstore.job import parse_job
from gradstore.messages import SigningKey
from gradstore.torch import TorchPeer, named_parameters, snapshot
from gradstore.torch._params import matched as _matched

KEY = SigningKey.from_seed(bytes([7]) * 32)
CONFIG = parse_job(
    {"job": "j", "coordinator": SigningKey.from_seed(bytes([9]) * 32).did, "peers": [KEY.did]}
)


def _model() -> torch.nn.Module:
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)  # frozen parameters do not travel
    return model


def test_only_trainable_parameters_travel() -> None:
    model = _model()
    assert list(named_parameters(model)) == ["weight"]
    base = snapshot(model)
    assert base["weight"].data_ptr() != model.weight.data_ptr()
    with pytest.raises(ValueError, match="no trainable parameters"):
        named_parameters(torch.nn.ReLU())


def test_publishing_before_backward_names_the_parameter() -> None:
    peer = TorchPeer(CONFIG, KEY, api="http://127.0.0.1:9")  # nothing is contacted yet
    with pytest.raises(ValueError, match=r"parameter 'weight' has no \.grad"):
        peer.publish_grads(_model(), 0, 10)


def test_a_closed_peer_says_how_to_open_it() -> None:
    model = _model()
    model.weight.grad = torch.zeros_like(model.weight)
    with pytest.raises(CoordinatorError, match="with TorchPeer"):
        TorchPeer(CONFIG, KEY).publish_grads(model, 0, 10)


def test_an_aggregate_that_does_not_fit_the_model_is_refused() -> None:
    params = named_parameters(_model())
    with pytest.raises(ValueError, match=r"missing \['weight'\], extra \['w'\]"):
        _matched(params, Gradient({"w": np.zeros((2, 3), np.float32)}))
    with pytest.raises(ValueError, match=r"shape \(2, 3\), the aggregate \(3, 2\)"):
        _matched(params, Gradient({"weight": np.zeros((3, 2), np.float32)}))
    [(name, p, value)] = _matched(params, Gradient({"weight": np.ones((2, 3), np.float32)}))
    assert name == "weight" and p is params["weight"] and value.sum().item() == 6.0


def test_a_key_that_is_not_the_jobs_peer_is_refused_on_open() -> None:
    stranger = SigningKey.from_seed(bytes([8]) * 32)
    with pytest.raises(CoordinatorError, match="is not among the job's peers"):
        TorchPeer(CONFIG, stranger, api="http://127.0.0.1:9").open()
