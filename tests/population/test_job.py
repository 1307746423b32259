"""The [population] job section: members, Ray's knobs with Ray's defaults, the space, initial values."""

from __future__ import annotations

import pytest

from gradstore.errors import ConfigError
from gradstore.population import Choice, Range

from .helpers import MEMBER_KEYS, job, key


def test_defaults() -> None:
    pop = job().population
    assert pop is not None
    assert pop.members == tuple(sorted(k.did for k in MEMBER_KEYS))
    assert (pop.intervals, pop.interval_steps, pop.seed) == (3, 5, 7)
    assert pop.params.quantile_fraction == 0.25
    assert pop.params.resample_probability == 0.25
    assert pop.params.perturbation_factors == (1.2, 0.8)
    assert pop.params.mutations == {
        "lr": Choice((0.001, 0.003, 0.01, 0.03, 0.1)),
        "wd": Range(0.0, 0.001),
    }
    assert pop.deadline_s == 60.0


def test_initial_hyperparameters_given_or_seeded() -> None:
    m0 = MEMBER_KEYS[0].did
    pop = job(initial={m0: {"lr": 0.1, "wd": 0.0}}).population
    assert pop is not None
    first = pop.first_hparams()
    assert first[m0] == {"lr": 0.1, "wd": 0.0}
    assert len(first) == 8
    assert first == pop.first_hparams()  # seeded: the same every time
    other = job(seed=8).population
    assert other is not None and other.first_hparams() != first


@pytest.mark.parametrize(
    ("population", "match"),
    [
        ({"members": [key(60).did]}, "is not one of the job's peers"),
        ({"quantile_fraction": 0.75}, "quantile_fraction"),
        ({"hyperparam_mutations": {}}, "hyperparam_mutations"),
        ({"hyperparam_mutations": {"wd": {"low": 1.0, "high": 0.5}}}, "low < high"),
        ({"initial": {key(60).did: {"lr": 0.1, "wd": 0.0}}}, "not a member"),
        ({"initial": {MEMBER_KEYS[0].did: {"lr": 0.1}}}, "not the space"),
        ({"intervals": 0}, "intervals"),
        ({"mode": "best"}, "mode"),
        ({"unknown": 1}, "not a known key"),
    ],
)
def test_bad_sections_are_refused(population: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        job(**population)
