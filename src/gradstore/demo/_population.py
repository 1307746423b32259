"""``gradstore demo --mode population``: population-based training of the demo's MLP.

Eight members train on the digits training set with their own learning rate and weight
decay, ``interval_steps`` mini-batch steps per interval, and are scored on a validation
part of it (never on the held-out set). After each interval a ``PopulationController``
decides, over the node, who copies whom; each ``PopulationMember`` reports its checkpoint
and score and continues from the decision. The baseline is the same members, same
initial weights and batches, trained for the same number of steps with their initial
hyperparameters fixed; the comparison is on the held-out set: the member PBT ranks best
at the end against the median of the fixed members.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..dag import CID
from ..format import Gradient
from ..job import JobConfig, parse_job
from ..messages import SigningKey
from ..node import Node
from ..pbt.space import HValue
from ..store import GradientStore
from ._data import DigitsSplit, Shard
from ._models import Model, Params, accuracy, make_model

#: The space: both lists (perturbation walks them one step at a time, log-scale).
LEARNING_RATES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
WEIGHT_DECAYS = (0.0, 0.0001, 0.001, 0.01, 0.03, 0.1)
VALIDATION_FRACTION = 0.2


@dataclass(frozen=True)
class PopulationDemoConfig:
    """What the population demo trains, and for how long."""

    members: int = 8
    intervals: int = 8
    interval_steps: int = 25
    batch_size: int = 32
    seed: int = 0
    hidden: int | None = None
    quantile_fraction: float = 0.25
    deadline_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("members", "intervals", "interval_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.members < 2:
            raise ValueError("a population needs at least 2 members")

    @property
    def budget(self) -> int:
        """Mini-batch steps each member trains, in all."""
        return self.intervals * self.interval_steps


@dataclass(frozen=True)
class PopulationSplit:
    """The training rows members train on, the validation rows they are scored on, and the
    held-out rows the result is reported on."""

    train: Shard
    valid: Shard
    test: Shard
    n_features: int
    n_classes: int


def population_split(data: DigitsSplit) -> PopulationSplit:
    """Cut the last ``VALIDATION_FRACTION`` of the (already shuffled) training rows off
    for scoring; the held-out rows stay held out."""
    x, y = data.x_train, data.y_train
    cut = len(y) - round(len(y) * VALIDATION_FRACTION)
    return PopulationSplit(
        Shard(x[:cut], y[:cut]),
        Shard(x[cut:], y[cut:]),
        Shard(data.x_test, data.y_test),
        data.n_features,
        data.n_classes,
    )


def train_steps(
    model: Model,
    params: Params,
    shard: Shard,
    hparams: Mapping[str, HValue],
    rng: np.random.Generator,
    *,
    steps: int,
    batch_size: int,
) -> Params:
    """``steps`` mini-batch SGD steps with decoupled weight decay:
    ``p - lr * (grad + wd * p)``, batches drawn from ``rng``."""
    lr, wd = float(hparams["lr"]), float(hparams["wd"])
    params = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
    for _ in range(steps):
        idx = rng.choice(len(shard), size=batch_size, replace=False)
        _, grad = model.loss_and_gradient(params, shard.x[idx], shard.y[idx])
        params = {k: v - lr * (grad[k] + wd * v) for k, v in params.items()}
    return params


def member_rngs(cfg: PopulationDemoConfig, dids: list[str]) -> dict[str, np.random.Generator]:
    """Each member's own batch stream (by its place in did order), the same in both runs."""
    return {d: np.random.default_rng([cfg.seed, 1, i]) for i, d in enumerate(sorted(dids))}


def initial_params(cfg: PopulationDemoConfig, model: Model, dids: list[str]) -> dict[str, Params]:
    """Each member's initial weights (by its place in did order), the same in both runs."""
    return {
        d: model.init(np.random.default_rng([cfg.seed, 2, i])) for i, d in enumerate(sorted(dids))
    }


def fixed_baseline(
    cfg: PopulationDemoConfig,
    split: PopulationSplit,
    hparams: Mapping[str, Mapping[str, HValue]],
) -> dict[str, float]:
    """Held-out accuracy of each member trained ``cfg.budget`` steps with its initial
    hyperparameters fixed (same weights and batches as in the population)."""
    model = make_model("mlp", split.n_features, split.n_classes, cfg.hidden)
    dids = sorted(hparams)
    rngs, params = member_rngs(cfg, dids), initial_params(cfg, model, dids)
    out = {}
    for d in dids:
        p = train_steps(
            model,
            params[d],
            split.train,
            hparams[d],
            rngs[d],
            steps=cfg.budget,
            batch_size=cfg.batch_size,
        )
        out[d] = accuracy(model, p, split.test.x, split.test.y)
    return out


def population_job(cfg: PopulationDemoConfig, controller: str, members: list[str]) -> JobConfig:
    """The demo's population job: its members, the space, Ray Tune's other defaults."""
    return parse_job(
        {
            "job": "demo-population",
            "coordinator": controller,
            "peers": sorted(members),
            "population": {
                "intervals": cfg.intervals,
                "interval_steps": cfg.interval_steps,
                "deadline_s": cfg.deadline_s,
                "seed": cfg.seed,
                "quantile_fraction": cfg.quantile_fraction,
                "hyperparam_mutations": {"lr": list(LEARNING_RATES), "wd": list(WEIGHT_DECAYS)},
            },
        }
    )


@dataclass(frozen=True)
class IntervalRow:
    """One decision as the demo prints it."""

    interval: int
    record: CID
    best: str
    best_score: float
    best_hparams: dict[str, HValue]
    copies: list[tuple[str, str, dict[str, HValue]]]


@dataclass
class PopulationDemoResult:
    """The population's result against the fixed baseline, and the records' head."""

    head: CID
    controller: str
    best: str
    best_hparams: dict[str, HValue]
    pbt_accuracy: float
    fixed: dict[str, float]
    rows: list[IntervalRow] = field(default_factory=list)

    @property
    def fixed_median(self) -> float:
        return float(np.median(list(self.fixed.values())))

    @property
    def fixed_best(self) -> float:
        return max(self.fixed.values())


async def run_population_demo(
    cfg: PopulationDemoConfig,
    node: Node,
    data: DigitsSplit,
    *,
    controller_key: SigningKey,
    member_keys: list[SigningKey] | None = None,
    run: str | None = None,
    on_interval: Callable[[IntervalRow], None] | None = None,
) -> PopulationDemoResult:
    """Run the population over ``node`` (controller and members in this process, talking
    only through the node), then the fixed baseline; return both. ``run`` (default: a
    fresh id) keys the decisions' draws: with it and ``member_keys`` fixed, a run repeats."""
    from ..population.controller import IntervalResult
    from ..population.member import PopulationMember
    from ..population.service import PopulationController

    keys = member_keys or [SigningKey.generate() for _ in range(cfg.members)]
    by_did = {k.did: k for k in keys}
    config = population_job(cfg, controller_key.did, list(by_did))
    pop = config.population
    assert pop is not None
    split = population_split(data)
    model = make_model("mlp", split.n_features, split.n_classes, cfg.hidden)
    dids = sorted(by_did)
    rngs, start = member_rngs(cfg, dids), initial_params(cfg, model, dids)
    rows: list[IntervalRow] = []

    def row(result: IntervalResult) -> None:
        rec = result.record
        best = max(rec.members, key=lambda m: (m.report.score, m.report.member)).report
        copies = [(c.member, c.source, dict(c.hparams)) for c in rec.copies]
        r = IntervalRow(
            rec.interval, result.record_cid, best.member, best.score, best.hparams, copies
        )
        rows.append(r)
        if on_interval is not None:
            on_interval(r)

    async def member(m: PopulationMember) -> None:
        did = m.key.did
        hp = await m.start(timeout=cfg.deadline_s)
        params = start[did]
        while True:
            params = train_steps(
                model,
                params,
                split.train,
                hp,
                rngs[did],
                steps=cfg.interval_steps,
                batch_size=cfg.batch_size,
            )
            score = accuracy(model, params, split.valid.x, split.valid.y)
            ckpt = Gradient(dict(params), {"kind": "state"})
            d = await m.report(m.interval, ckpt, score, timeout=2 * cfg.deadline_s + 30)
            if d.checkpoint is not None:
                params = {k: np.array(v) for k, v in d.checkpoint.tensors.items()}
            hp = d.hparams
            if d.done:
                return

    controller = PopulationController(
        config, controller_key, node, run=run, rebroadcast_s=0.5, linger_s=0.5, on_interval=row
    )
    members = [PopulationMember(config, by_did[d], node, rebroadcast_s=0.5) for d in dids]
    for m in members:
        await m.__aenter__()
    try:
        await asyncio.gather(controller.run(), *(member(m) for m in members))
    finally:
        for m in members:
            await m.__aexit__()
    results = controller.results
    last = results[-1].record
    best = max(last.members, key=lambda m: (m.report.score, m.report.member)).report
    # the best member's weights after its last interval are what it reported (a copy made
    # by the last decision is for training that is not in the budget)
    got = await GradientStore(node).get(best.checkpoint)
    best_params = {k: np.array(v) for k, v in got.tensors.items()}
    return PopulationDemoResult(
        head=results[-1].record_cid,
        controller=controller_key.did,
        best=best.member,
        best_hparams=dict(best.hparams),
        pbt_accuracy=accuracy(model, best_params, split.test.x, split.test.y),
        fixed=fixed_baseline(cfg, split, pop.first_hparams()),
        rows=rows,
    )
