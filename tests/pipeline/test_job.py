"""[[stages]] in a job file: each stage is the step of its name (output stage first as steps
are), its peers the replicas; what a pipeline needs of them is refused with the key named."""

from __future__ import annotations

import pytest

from gradstore.errors import ConfigError
from gradstore.job import parse_job

from .helpers import BODY, HEAD, KEYS, job, job_raw


def test_stages_are_the_steps_of_the_round_output_stage_first() -> None:
    config = job()
    assert config.stepped
    assert [s.name for s in config.steps] == ["head", "body"]
    assert config.steps[0].peers == tuple(HEAD) and config.steps[1].peers == tuple(BODY)
    assert config.plan.step_of("fc1.weight").name == "body"  # type: ignore[union-attr]
    pipe = config.pipeline
    assert pipe is not None
    assert [s.name for s in pipe.stages] == ["body", "head"]
    assert pipe.width == 2 and pipe.micro_batches == 4 and pipe.in_flight == 4
    assert pipe.place(HEAD[1]) == (1, 1) and pipe.place(KEYS[4].did) is None


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda r: r.update(steps=[{"name": "x", "tensors": ["a"]}]), "`steps`"),
        (lambda r: r["stages"].pop(), "`stages`"),
        (lambda r: r["stages"][1].update(peers=HEAD[:1]), "`stages[1].peers`"),
        (lambda r: r["stages"][1].update(peers=[BODY[0], HEAD[0]]), "`stages[1].peers`"),
        (lambda r: r["stages"][0].pop("peers"), "`stages[0].peers`"),
        (lambda r: r["pipeline"].update(in_flight=5), "`pipeline.in_flight`"),
        (lambda r: r["pipeline"].update(micro_batches=0), "`pipeline.micro_batches`"),
        (lambda r: r["pipeline"].update(lanes=2), "`pipeline.lanes`"),
        (lambda r: r.pop("stages"), "`pipeline`"),
        # errors inside a stage's table name the user's stages[i], not the reversed steps[i]
        (lambda r: r["stages"][0].update(tensors=["fc*"]), "`stages[0].tensors[0]`"),
        (lambda r: r["stages"][1].update(name="body"), "`stages[0].name`"),
        (lambda r: r["stages"][1].update(tensors=["fc2.*", "x*"]), "`stages[1].tensors[1]`"),
    ],
)
def test_what_a_pipeline_cannot_run_is_refused_naming_the_key(change, key) -> None:  # type: ignore[no-untyped-def]
    raw = job_raw()
    change(raw)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        parse_job(raw)
