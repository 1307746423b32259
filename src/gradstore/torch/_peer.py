"""A job's peer for a PyTorch training loop, with a synchronous face.

gradstore's :class:`~gradstore.peer.Peer` is asyncio; a training loop usually is not.
``TorchPeer`` runs a Peer on a private event loop in a background thread, and every
method blocks until its step is done, so a data-parallel loop reads::

    with TorchPeer(config, key) as peer:
        for round_, (x, y) in enumerate(batches):
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            peer.sync_grads(model, round_, num_samples=len(x))  # .grad := the round's aggregate
            optimizer.step()

and a federated one (each peer trains locally, the job averages the model deltas)::

            base = snapshot(model)
            ...local epochs...
            peer.sync_delta(model, base, round_, num_samples)  # params := base + mean delta
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from .._sync import LoopThread
from ..dag import CID
from ..errors import CoordinatorError
from ..format import Gradient
from ..job import JobConfig, load_job
from ..messages import SigningKey
from ..node import Node, connect
from ..peer import AggregateResult, Peer
from ._convert import numpy_to_tensor, to_gradient

T = TypeVar("T")

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


class TorchPeer:
    """One peer of a job, for a synchronous PyTorch loop; use it as a context manager.

    ``config`` is a JobConfig or the path of a job file; ``key`` a SigningKey or the path
    of a key file (None: await results only). The node is Kubo at ``api`` (else where
    ``gradstore.node.connect`` finds it: $GRADSTORE_API, $IPFS_PATH/api, 127.0.0.1:5001), or
    what ``node()`` returns (called on the peer's own event loop). ``timeout`` bounds each
    publish and each wait, in seconds.
    """

    def __init__(
        self,
        config: JobConfig | str | Path,
        key: SigningKey | str | Path | None = None,
        *,
        api: str | None = None,
        node: Callable[[], Node] | None = None,
        timeout: float | None = 600.0,
        first_backoff_s: float = 1.0,
    ) -> None:
        self.config = config if isinstance(config, JobConfig) else load_job(config)
        self.key = key if isinstance(key, SigningKey) or key is None else SigningKey.load(key)
        if node is None:
            node = lambda: connect(api)  # noqa: E731  (an httpx client per loop)
        self._make_node = node
        self.timeout = timeout
        self._first_backoff_s = first_backoff_s
        self._loop: LoopThread | None = None
        self._node: Node | None = None
        self._peer: Peer | None = None

    def __enter__(self) -> TorchPeer:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Start the event loop, connect to the node and subscribe to the job's results."""
        if self._loop is not None:
            return
        self._loop = LoopThread("gradstore-torch-peer")

        async def start() -> tuple[Node, Peer]:
            node = self._make_node()
            try:
                peer = Peer(self.config, node, self.key, first_backoff_s=self._first_backoff_s)
                await peer.__aenter__()
            except BaseException:
                await node.aclose()
                raise
            return node, peer

        try:
            self._node, self._peer = self._loop.run(start())
        except BaseException:
            self._loop.close()
            self._loop = None
            raise

    def close(self) -> None:
        """Unsubscribe, close the node's connection and stop the event loop."""
        if self._loop is None:
            return
        node, peer = self._node, self._peer

        async def stop() -> None:
            try:
                if peer is not None:
                    await peer.__aexit__(None, None, None)
            finally:
                if node is not None:
                    await node.aclose()

        try:
            self._loop.run(stop())
        finally:
            self._loop.close()
            self._loop, self._node, self._peer = None, None, None

    def _run(self, make: Callable[[Peer], Coroutine[Any, Any, T]]) -> T:
        if self._loop is None or self._peer is None:
            raise CoordinatorError("use the TorchPeer as `with TorchPeer(...) as peer` (or open())")
        return self._loop.run(make(self._peer))

    # -- gradients in and out -------------------------------------------------------------

    def publish(self, gradient: Gradient, round_: int, num_samples: int) -> CID:
        """Store ``gradient`` (pinned), announce it for ``round_``, wait for the acknowledgement."""
        return self._run(lambda p: p.publish(gradient, round_, num_samples, timeout=self.timeout))

    def await_result(self, round_: int) -> AggregateResult:
        """The round's aggregate, verified against the coordinator's signature and its CID."""
        return self._run(lambda p: p.await_result(round_, timeout=self.timeout))

    # -- data-parallel: gradients -----------------------------------------------------------

    def publish_grads(self, model: Parameters, round_: int, num_samples: int) -> CID:
        """Publish the ``.grad`` of every trainable parameter (shared, not copied, on CPU)."""
        grads = {}
        for name, p in named_parameters(model).items():
            if p.grad is None:
                raise ValueError(f"parameter {name!r} has no .grad: call loss.backward() first")
            grads[name] = p.grad
        return self.publish(to_gradient(grads, {"kind": "gradient"}), round_, num_samples)

    def await_grads(self, model: Parameters, round_: int) -> AggregateResult:
        """Await the round's aggregate and write it into each parameter's ``.grad``."""
        result = self.await_result(round_)
        params = named_parameters(model)
        for _, p, value in _matched(params, result.gradient):
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(value)  # to the parameter's device and dtype
        return result

    def sync_grads(self, model: Parameters, round_: int, num_samples: int) -> AggregateResult:
        """publish_grads, then await_grads: after it, ``.grad`` is the round's aggregate."""
        self.publish_grads(model, round_, num_samples)
        return self.await_grads(model, round_)

    # -- federated: model deltas ------------------------------------------------------------

    def publish_delta(
        self, model: Parameters, base: Mapping[str, torch.Tensor], round_: int, num_samples: int
    ) -> CID:
        """Publish ``parameter - base`` for every trainable parameter (what local training moved)."""
        params = named_parameters(model)
        _same_names(params, base, "base")
        delta = {name: p.detach() - base[name].to(p.device) for name, p in params.items()}
        return self.publish(to_gradient(delta, {"kind": "delta"}), round_, num_samples)

    def apply_delta(
        self, model: Parameters, base: Mapping[str, torch.Tensor], round_: int
    ) -> AggregateResult:
        """Await the round's aggregate delta and set each parameter to ``base + delta``."""
        result = self.await_result(round_)
        params = named_parameters(model)
        _same_names(params, base, "base")
        with torch.no_grad():
            for name, p, value in _matched(params, result.gradient):
                p.copy_(base[name].to(p.device) + value.to(p.device, p.dtype))
        return result

    def sync_delta(
        self, model: Parameters, base: Mapping[str, torch.Tensor], round_: int, num_samples: int
    ) -> AggregateResult:
        """publish_delta, then apply_delta: after it, the parameters are the round's model."""
        self.publish_delta(model, base, round_, num_samples)
        return self.apply_delta(model, base, round_)


def _same_names(params: Mapping[str, Any], other: Mapping[str, Any], what: str) -> None:
    if params.keys() != other.keys():
        missing = sorted(params.keys() - other.keys())
        extra = sorted(other.keys() - params.keys())
        raise ValueError(
            f"the model's parameters and the {what} differ (missing {missing}, extra {extra})"
        )


def _matched(
    params: Mapping[str, torch.Tensor], aggregate: Gradient
) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, parameter, aggregate tensor) for every parameter; the aggregate must match exactly."""
    _same_names(params, aggregate.tensors, "round's aggregate")
    out = []
    for name, p in params.items():
        value = numpy_to_tensor(aggregate.tensors[name], name)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(
                f"parameter {name!r} has shape {tuple(p.shape)}, the aggregate {tuple(value.shape)}"
            )
        out.append((name, p, value))
    return out
