"""The demo's orchestration: one coordinator and N peers, all through the real stack.

Every round each peer computes on its shard, stores its tensors on the node
(``Peer.publish``: put, signed announcement over pubsub, re-announced until the
coordinator acknowledges), the in-process ``Coordinator`` fetches and verifies
every input, aggregates them (fedavg unless ``DemoConfig.method`` says otherwise),
stores the aggregate and a signed round record and announces the result; each peer
awaits that result, fetches and verifies the aggregate and continues from it. Nothing is shared between the parties except
through the node.

- ``data-parallel``: peers publish the loss gradient at the shared parameters and
  take one SGD step with the aggregate; with equal shards this is full-batch
  gradient descent on their union.
- ``federated``: peers run local mini-batch SGD from the global model and publish
  their model state (meta kind "state"); the aggregate of the states is the next
  global model (with fedavg: FedAvg, McMahan et al. 2017).

With ``compress`` (a spec such as ``topk:0.015,values=int8``) every peer compresses its
update with error feedback (its residual kept in memory across rounds): data-parallel
peers their gradient, federated peers their model delta (state minus the global model,
meta kind "delta"), and the peers add the aggregate of the deltas to the global model.

With ``steps`` a round is two steps (``_steps``): the output layer, which only the first
half of the peers train and send, and the other layers, which every peer does; the
coordinator closes and publishes each on its own, the peers take each step's aggregate as
it closes, and the round ends with a model-level output and a round/5 record.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..aggregate import AggregationParams
from ..compress import parse_spec, with_feedback
from ..coordinator import Coordinator, RoundOutcome
from ..dag import CID
from ..errors import AggregationError, CoordinatorError
from ..format import CompressedGradient, Gradient, encode
from ..job import JobConfig, parse_job
from ..messages import SigningKey
from ..node import Node
from ..peer import Peer, apply
from ._data import DigitsSplit, Shard
from ._models import FRAMEWORK_MODELS, Model, Params, accuracy, make_model
from ._steps import DemoStep, StepRow, StepWatch, demo_steps, head_peers, steps_tables
from ._steps import publish_steps as publish_own_steps
from ._train import local_sgd

MODES = ("federated", "data-parallel")
_METHOD_PARAMETERS = ("trim_ratio", "byzantine", "select", "clip_input_norm", "clip_output_norm")
DEFAULT_LR = {"federated": 0.1, "data-parallel": 0.5}


@dataclass(frozen=True)
class DemoConfig:
    """What to train and how; ``lr=None`` takes the mode's default (``DEFAULT_LR``)."""

    peers: int = 4
    rounds: int = 20
    mode: str = "federated"
    model: str = "mlp"
    framework: str = "numpy"
    seed: int = 0
    lr: float | None = None
    local_epochs: int = 2
    batch_size: int = 32
    deadline_s: float = 120.0
    compress: str | None = None  # a compression spec: peers send compressed updates
    hidden: int | None = None  # the mlp's hidden units (default 64)
    # The coordinator's aggregation: any job file method with its parameters (None: unset).
    method: str = "fedavg"
    trim_ratio: float | None = None
    byzantine: int | None = None
    select: int | None = None
    clip_input_norm: float | None = None
    clip_output_norm: float | None = None
    #: Each round in two steps: the output layer (half the peers) and the rest (all).
    steps: bool = False

    def __post_init__(self) -> None:
        if self.compress is not None:
            parse_spec(self.compress)  # CompressionError (a ValueError) for a bad spec
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; expected one of {', '.join(MODES)}")
        models = FRAMEWORK_MODELS.get(self.framework)
        if models is None:
            raise ValueError(
                f"unknown framework {self.framework!r}; expected one of "
                f"{', '.join(FRAMEWORK_MODELS)}"
            )
        if self.model not in models:
            raise ValueError(
                f"model {self.model!r} is not a {self.framework} model; "
                f"expected one of {', '.join(models)}"
            )
        if self.hidden is not None and self.model != "mlp":
            raise ValueError(f"--hidden is an mlp setting, not {self.model}'s")
        if self.hidden is not None and self.hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {self.hidden}")
        for name in ("peers", "rounds", "local_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.steps and self.model == "softmax":
            raise ValueError(
                "--steps splits the model into its output layer and the rest; softmax has "
                "one layer: use --model mlp (or --framework torch)"
            )
        self._check_aggregation()

    def _check_aggregation(self) -> None:
        """The aggregator's own checks, for every round's ``peers`` inputs (AggregationError,
        a ValueError): an unknown method, a parameter it does not take or lacks, too few peers."""
        params = AggregationParams(
            self.method,
            weights=(1.0,) * self.peers if self.method == "weighted" else None,
            trim_ratio=self.trim_ratio,
            byzantine=self.byzantine,
            select=self.select,
            clip_input_norm=self.clip_input_norm,
            clip_output_norm=self.clip_output_norm,
        )
        try:
            params.validate(self.peers)
        except AggregationError as exc:
            raise AggregationError(
                f"--method {self.method} with --peers {self.peers}: {exc}"
            ) from exc
        if self.steps:  # the head step aggregates only its own peers' inputs
            head = head_peers(self.peers)
            try:
                params.validate(head)
            except AggregationError as exc:
                raise AggregationError(
                    f"--method {self.method} with --steps: the head step has {head} of the "
                    f"{self.peers} peers: {exc}"
                ) from exc
        if self.method == "sum" and self.mode == "federated" and self.compress is None:
            raise AggregationError(
                "sum of the peers' model states is no model (it grows with every round): "
                "use it with --mode data-parallel or --compress (the sum of model deltas)"
            )

    def _method_params(self) -> dict[str, float | int]:
        """The parameters that are set, by their job file names."""
        values = {name: getattr(self, name) for name in _METHOD_PARAMETERS}
        return {name: value for name, value in values.items() if value is not None}

    def aggregation(self, peers: list[str]) -> dict[str, Any]:
        """The job file's ``[aggregation]`` table for ``peers`` (dids); ``weighted`` gives
        every peer weight 1."""
        table: dict[str, Any] = {"method": self.method, **self._method_params()}
        if self.method == "weighted":
            table["weights"] = dict.fromkeys(peers, 1.0)
        return table

    @property
    def method_text(self) -> str:
        """``median``, ``krum (byzantine 1)``: the method and its parameters, for people."""
        params = self._method_params()
        if not params:
            return self.method
        return f"{self.method} ({', '.join(f'{k} {v}' for k, v in params.items())})"

    @property
    def learning_rate(self) -> float:
        return DEFAULT_LR[self.mode] if self.lr is None else self.lr


@dataclass(frozen=True)
class RoundRow:
    """One finished round: the global model's training loss and held-out accuracy after it.

    ``input_bytes``: the bytes of the input documents the peers stored, one each (what
    compression shrinks). ``traffic_bytes``: the document bytes put to or fetched from the
    node, each input put by its peer and fetched by the coordinator, the aggregate (dense,
    whatever the inputs) put by the coordinator and fetched by every peer; so compressed
    inputs shrink it far less. Neither counts round records or pubsub messages. With steps,
    a peer stores one input per step it is in, each step's aggregate counts as the aggregate
    does, and the round's model-level output is put once and fetched by the first peer.
    """

    round: int
    loss: float
    accuracy: float
    aggregate: CID
    record: CID
    input_bytes: int
    traffic_bytes: int
    seconds: float
    #: With steps: each step as it closed, in closing order (``aggregate`` and ``record``
    #: are then the round's model-level output and round/5 record).
    steps: tuple[StepRow, ...] = ()


@dataclass
class DemoResult:
    """Everything a demo run produced."""

    config: DemoConfig
    node: str
    job: str
    coordinator: str
    rows: list[RoundRow] = field(default_factory=list)
    #: With steps: the job's steps, output layer first.
    steps: tuple[DemoStep, ...] = ()

    @property
    def head_record(self) -> CID | None:
        """The last round's record: walk its ``prev`` links for the whole history."""
        return self.rows[-1].record if self.rows else None


class _Party:
    """One peer's private state: its key, shard and current parameters."""

    def __init__(self, index: int, key: SigningKey, shard: Shard, params: Params) -> None:
        self.index = index
        self.key = key
        self.shard = shard
        self.params = params
        self.residual: dict[str, np.ndarray] | None = None  # error feedback, when compressing


def job_config(
    job: str,
    coordinator: SigningKey,
    peers: list[SigningKey],
    rounds: int,
    deadline_s: float,
    schema: Params,
    aggregation: dict[str, Any] | None = None,
    steps: list[dict[str, Any]] | None = None,
) -> JobConfig:
    """The in-memory job: ``aggregation`` (a job file's table; default fedavg), every peer
    needed in every round (in every step of ``steps``, ``[[steps]]`` tables, if given), a
    generous deadline, and the model's tensors as the schema every input must have."""
    raw: dict[str, Any] = {
        "job": job,
        "coordinator": coordinator.did,
        "peers": [k.did for k in peers],
        "aggregation": aggregation or {"method": "fedavg"},
        "rounds": {"count": rounds, "quorum": len(peers), "deadline_s": deadline_s},
        "schema": [
            {"name": name, "dtype": a.dtype.str, "shape": list(a.shape)}
            for name, a in schema.items()
        ],
    }
    if steps:
        raw["steps"] = steps
    return parse_job(raw, source="demo job")


def plan_steps(config: DemoConfig, data: DigitsSplit) -> tuple[DemoStep, ...]:
    """The steps ``run_demo`` makes of ``config``'s model for ``data`` (none without
    ``config.steps``), for saying what the job is before it runs."""
    if not config.steps:
        return ()
    model = make_model(config.model, data.n_features, data.n_classes, config.hidden)
    return demo_steps(list(model.init(np.random.default_rng(config.seed))), config.peers)


async def run_demo(
    config: DemoConfig,
    node: Node,
    data: DigitsSplit,
    *,
    node_name: str = "",
    state_dir: str | Path | None = None,
    coordinator_key: SigningKey | None = None,
    on_round: Callable[[RoundRow], None] | None = None,
    on_phase: Callable[[int, str], None] | None = None,
    on_step: Callable[[StepRow], None] | None = None,
) -> DemoResult:
    """Train for ``config.rounds`` rounds over ``node``; ``on_round`` sees each finished round
    and, with ``config.steps``, ``on_step`` each step as the first peer holds its aggregate.

    ``data`` must have ``config.peers`` shards. Keys are fresh unless
    ``coordinator_key`` is given (the CLI prints its did before the run starts).
    """
    if len(data.shards) != config.peers:
        raise ValueError(f"{len(data.shards)} shards for {config.peers} peers")
    model = make_model(config.model, data.n_features, data.n_classes, config.hidden)
    ckey = coordinator_key or SigningKey.generate()
    keys = [SigningKey.generate() for _ in range(config.peers)]
    initial = model.init(np.random.default_rng(config.seed))
    steps = demo_steps(list(initial), config.peers) if config.steps else ()
    dids = [k.did for k in keys]
    job = job_config(
        f"digits-{secrets.token_hex(4)}",
        ckey,
        keys,
        config.rounds,
        config.deadline_s,
        initial,
        config.aggregation(dids),
        steps_tables(steps, dids) if steps else None,
    )
    parties = [
        _Party(i, k, shard, {n: a.copy() for n, a in initial.items()})
        for i, (k, shard) in enumerate(zip(keys, data.shards, strict=True))
    ]
    result = DemoResult(config, node_name, job.job, ckey.did, steps=steps)
    with contextlib.ExitStack() as stack:
        if state_dir is None:
            state_dir = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="gradstore-demo-state-")
            )
        await _train(
            config,
            model,
            data,
            job,
            ckey,
            node,
            Path(state_dir),
            parties,
            result,
            on_round,
            on_phase,
            on_step,
        )
    return result


async def _train(
    config: DemoConfig,
    model: Model,
    data: DigitsSplit,
    job: JobConfig,
    ckey: SigningKey,
    node: Node,
    state_dir: Path,
    parties: list[_Party],
    result: DemoResult,
    on_round: Callable[[RoundRow], None] | None,
    on_phase: Callable[[int, str], None] | None,
    on_step: Callable[[StepRow], None] | None,
) -> None:
    """Run the coordinator as a task and the peers' rounds until done; stop the coordinator."""
    failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def outcome(o: RoundOutcome) -> None:
        if o.status != "closed" and not failure.done():
            failure.set_exception(CoordinatorError(f"round {o.round} failed: {o.reason}"))

    coordinator = Coordinator(job, ckey, node, state_dir, linger_s=0.0, on_round=outcome)
    stop = asyncio.Event()
    coordinator_task = asyncio.create_task(coordinator.run(stop), name="demo-coordinator")
    try:
        async with contextlib.AsyncExitStack() as stack:
            peers = [
                await stack.enter_async_context(Peer(job, node, p.key, first_backoff_s=0.5))
                for p in parties
            ]
            x_train, y_train = data.x_train, data.y_train
            numbers = {p.key.did: p.index + 1 for p in parties}
            for r in range(config.rounds):
                if on_phase is not None:
                    on_phase(r, "peers training, coordinator aggregating")
                start = time.perf_counter()
                watch = StepWatch(r, start, numbers, on_step) if job.stepped else None
                steps = asyncio.gather(
                    *(
                        _step(config, model, job.job, peer, party, r, watch)
                        for peer, party in zip(peers, parties, strict=True)
                    )
                )
                await _settle(steps, coordinator_task, failure, r)
                moved = steps.result()
                first = moved[0]
                if any(m.agreed != first.agreed for m in moved):
                    raise CoordinatorError(f"round {r}: peers received different aggregates")
                assert first.aggregate is not None and first.record is not None
                params = parties[0].params
                result.rows.append(
                    row := RoundRow(
                        round=r,
                        loss=model.loss(params, x_train, y_train),
                        accuracy=accuracy(model, params, data.x_test, data.y_test),
                        aggregate=first.aggregate,
                        record=first.record,
                        input_bytes=sum(m.input_bytes for m in moved),
                        # every input put and fetched once, the aggregate (each step's) put
                        # once and fetched by every peer; with steps, the model-level output
                        # put once and fetched by the first peer
                        traffic_bytes=sum(2 * m.input_bytes + m.aggregate_bytes for m in moved)
                        + first.aggregate_bytes
                        + 2 * first.model_bytes,
                        seconds=time.perf_counter() - start,
                        steps=() if watch is None else tuple(watch.rows.values()),
                    )
                )
                if on_round is not None:
                    on_round(row)
    finally:
        stop.set()
        if not failure.done():
            failure.cancel()
        elif not failure.cancelled():
            failure.exception()  # retrieved: it was raised already, or the round ended anyway
        done, _ = await asyncio.wait({coordinator_task}, timeout=30.0)
        if not done:
            coordinator_task.cancel()
            await asyncio.gather(coordinator_task, return_exceptions=True)
    if not coordinator_task.cancelled():
        coordinator_task.result()  # a coordinator that crashed after the last round


async def _settle(
    steps: asyncio.Future[list[_Moved]],
    coordinator_task: asyncio.Task[Any],
    failure: asyncio.Future[None],
    round_: int,
) -> None:
    """Wait for the peers' round, unless the round failed or the coordinator crashed first."""
    waiting: set[asyncio.Future[Any]] = {steps, failure}
    if not coordinator_task.done():
        waiting.add(coordinator_task)
    while not steps.done():
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if steps in done:
            break
        if failure in done or coordinator_task.exception() is not None:
            steps.cancel()
            await asyncio.gather(steps, return_exceptions=True)
            if failure.done():
                failure.result()
            coordinator_task.result()
        # The coordinator finished its last round: the peers are fetching its result.
        waiting.discard(coordinator_task)
    steps.result()


@dataclass(frozen=True)
class _Moved:
    """What one peer's round moved: its input documents (put, then fetched by the
    coordinator), the aggregates it fetched (with steps: every step's), the round's
    aggregate (with steps: its model-level output, fetched by the first peer alone, so
    None for the others) and record, and what every peer must agree on."""

    input_bytes: int
    aggregate_bytes: int
    aggregate: CID | None
    record: CID | None
    agreed: object  # the aggregate's CID; with steps, each step's by name
    model_bytes: int = 0  # with steps: the model-level output's document, if fetched


async def _step(
    config: DemoConfig,
    model: Model,
    job: str,
    peer: Peer,
    party: _Party,
    round_: int,
    watch: StepWatch | None = None,
) -> _Moved:
    """One peer's round: compute, publish, await the aggregate, update its parameters. With
    ``watch`` (a stepped job) it trains and sends only its own steps' tensors and takes
    every step's aggregate as it closes (``watch`` reports each step once)."""
    shard = party.shard
    lr = config.learning_rate
    # with steps, the tensors of this peer's steps: the head's are the first half's alone
    own = None if watch is None else set(peer.steps.mine_of(Gradient(party.params)).tensors)
    if config.mode == "data-parallel":
        _, tensors = model.loss_and_gradient(party.params, shard.x, shard.y)
        kind = "gradient"
    else:
        rng = np.random.default_rng([config.seed, party.index, round_])
        tensors = local_sgd(
            model,
            party.params,
            shard,
            epochs=config.local_epochs,
            batch_size=config.batch_size,
            lr=lr,
            rng=rng,
            train=own,
        )
        kind = "state"
    if own is not None:
        tensors = {n: a for n, a in tensors.items() if n in own}
    if config.compress is not None and config.mode == "federated":
        # the model delta: what this round changed, small and mostly near zero
        tensors = {n: tensors[n] - party.params[n] for n in tensors}
        kind = "delta"
    # The exact meta Peer.publish writes, so the document size below is the stored one.
    meta = {
        "kind": kind,
        "model": model.name,
        "round": round_,
        "peer": party.key.did,
        "num_samples": len(shard),
        "job": job,
    }
    update: Gradient | CompressedGradient = Gradient(tensors, meta)
    if config.compress is not None:
        update, party.residual = with_feedback(
            Gradient(tensors, meta), config.compress, party.residual
        )
    if watch is None:
        await peer.publish(update, round_, len(shard), timeout=config.deadline_s)
        got = await peer.await_result(round_, timeout=config.deadline_s + 30.0)
        party.params = _updated(config, party.params, got.gradient)
        return _Moved(encode(update).size, encode(got.gradient).size, got.cid, got.record, got.cid)
    stepped = await publish_own_steps(
        peer, update, round_, len(shard), timeout=config.deadline_s, watch=watch
    )
    party.params = _updated(config, party.params, stepped.aggregate)
    agreed = dict(stepped.steps)
    if party.index != 0:
        return _Moved(stepped.input_bytes, stepped.aggregate_bytes, None, None, agreed)
    # the first peer also takes the round's own result: its model-level output and record
    got = await peer.await_result(round_, timeout=config.deadline_s + 30.0)
    return _Moved(
        stepped.input_bytes,
        stepped.aggregate_bytes,
        got.cid,
        got.record,
        agreed,
        encode(got.gradient).size,
    )


def _updated(config: DemoConfig, params: Params, aggregate: Gradient) -> Params:
    """The global model after a round with ``aggregate``: an SGD step (data-parallel), the
    model plus the aggregate of the deltas (compressed federated), or the aggregate."""
    if config.mode == "data-parallel":
        return apply(params, aggregate, config.learning_rate)
    if config.compress is not None:
        return {
            n: params[n] + np.asarray(a, dtype=np.float64) for n, a in aggregate.tensors.items()
        }
    return {n: np.array(a, dtype=np.float64) for n, a in aggregate.tensors.items()}
