"""A model's trainable parameters by name, and an aggregate matched to them: what every
part of the PyTorch bridge (the peer, the steps, the stream) reads a model through."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..format import Gradient
from ._convert import numpy_to_tensor

#: What gradients are taken from: a module, or its ``named_parameters()``-like pairs.
Parameters = torch.nn.Module | Iterable[tuple[str, torch.Tensor]]


def named_parameters(model: Parameters) -> dict[str, torch.Tensor]:
    """The trainable parameters by name (``requires_grad``), in the module's order."""
    pairs = model.named_parameters() if isinstance(model, torch.nn.Module) else model
    params = {name: p for name, p in pairs if p.requires_grad}
    if not params:
        raise ValueError("the model has no trainable parameters")
    return params


def snapshot(model: Parameters) -> dict[str, torch.Tensor]:
    """A copy of the trainable parameters: the base a federated round's delta is taken from."""
    return {name: p.detach().clone() for name, p in named_parameters(model).items()}


def same_names(params: Mapping[str, Any], other: Mapping[str, Any], what: str) -> None:
    """ValueError naming the missing and extra names unless both hold the same names."""
    if params.keys() != other.keys():
        missing = sorted(params.keys() - other.keys())
        extra = sorted(other.keys() - params.keys())
        raise ValueError(
            f"the model's parameters and the {what} differ (missing {missing}, extra {extra})"
        )


def matched(
    params: Mapping[str, torch.Tensor], aggregate: Gradient, what: str = "round's aggregate"
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, parameter, aggregate tensor) for every parameter; the aggregate must match exactly."""
    same_names(params, aggregate.tensors, what)
    out = []
    for name, p in params.items():
        value = numpy_to_tensor(aggregate.tensors[name], name)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"parameter {name!r} has shape {tuple(p.shape)}, the aggregate {tuple(value.shape)}"
            )
        out.append((name, p, value))
    return out


def write_grads(params: Mapping[str, torch.Tensor], aggregate: Gradient, what: str) -> None:
    """Write ``aggregate`` into each parameter's ``.grad`` (made where it is None), converted
    to the parameter's device and dtype."""
    for _, p, value in matched(params, aggregate, what):
        if p.grad is None:
            p.grad = torch.empty_like(p)
        p.grad.copy_(value)
