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

from collections.abc import Callable, Coroutine, Mapping
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
from ._convert import to_gradient
from ._params import Parameters, matched, named_parameters, same_names, write_grads
from ._streamed import StreamedRound, SyncStreamedRound

T = TypeVar("T")


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
        write_grads(named_parameters(model), result.gradient, "round's aggregate")
        return result

    def sync_grads(self, model: Parameters, round_: int, num_samples: int) -> AggregateResult:
        """publish_grads, then await_grads: after it, ``.grad`` is the round's aggregate."""
        self.publish_grads(model, round_, num_samples)
        return self.await_grads(model, round_)

    def streaming(self, model: Parameters, round_: int, num_samples: int) -> SyncStreamedRound:
        """A stepped job's data-parallel round streamed out of backward::

            with peer.streaming(model, round_, num_samples=len(x)):
                loss_fn(model(x), y).backward()   # each step put and announced when ready
            optimizer.step()                      # .grad := each step's aggregate

        Each step this peer is in is stored and announced as soon as autograd has its
        gradients; each step's aggregate (every step's, this peer's or not) is written into
        its parameters' ``.grad`` as it arrives, and leaving the block waits until all are.
        ``StepsFailedError`` if steps failed: the others are applied, the failed ones'
        ``.grad`` is None. The result is bit for bit ``sync_grads``'s for element-wise
        methods; L2 clipping and krum see each step apart.
        """
        if self._loop is None or self._peer is None:
            raise CoordinatorError("use the TorchPeer as `with TorchPeer(...) as peer` (or open())")
        inner = StreamedRound(self._peer, model, round_, num_samples, timeout=self.timeout)
        return SyncStreamedRound(self._loop, inner)

    # -- federated: model deltas ------------------------------------------------------------

    def publish_delta(
        self, model: Parameters, base: Mapping[str, torch.Tensor], round_: int, num_samples: int
    ) -> CID:
        """Publish ``parameter - base`` for every trainable parameter (what local training moved)."""
        params = named_parameters(model)
        same_names(params, base, "base")
        delta = {name: p.detach() - base[name].to(p.device) for name, p in params.items()}
        return self.publish(to_gradient(delta, {"kind": "delta"}), round_, num_samples)

    def apply_delta(
        self, model: Parameters, base: Mapping[str, torch.Tensor], round_: int
    ) -> AggregateResult:
        """Await the round's aggregate delta and set each parameter to ``base + delta``."""
        result = self.await_result(round_)
        params = named_parameters(model)
        same_names(params, base, "base")
        with torch.no_grad():
            for name, p, value in matched(params, result.gradient):
                p.copy_(base[name].to(p.device) + value.to(p.device, p.dtype))
        return result

    def sync_delta(
        self, model: Parameters, base: Mapping[str, torch.Tensor], round_: int, num_samples: int
    ) -> AggregateResult:
        """publish_delta, then apply_delta: after it, the parameters are the round's model."""
        self.publish_delta(model, base, round_, num_samples)
        return self.apply_delta(model, base, round_)
