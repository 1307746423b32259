"""`gradstore audit stage` on real Kubo: a first-stage replica's forward pass, re-executed from
the input and parameter CIDs it recorded in a real 2-stage run, passes bit for bit (pinned
to the job file, and against a stage after the first); an output the stage forged passes
every check of its documents and fails ``output-cid``, also when a lying body replica
announced it in a real lane and the head took it; each other check is named when its
document is not the one it must be. The forger is the stage itself, so the signature on
its announcement is no defence: only re-execution is."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.cli import main
from gradstore.dag.cid import CID
from gradstore.demo import digits_split
from gradstore.demo._pipeline import PipelineDemoConfig, run_pipeline_demo
from gradstore.errors import AuditError
from gradstore.format import Gradient
from gradstore.job import parse_job
from gradstore.node import KuboDaemon
from gradstore.pipeline.audit import StageReport, verify_stage
from gradstore.pipeline.layers import Array, DenseStage
from gradstore.pipeline.runner import ACTIVATION
from gradstore.store import GradientStore

from .lane import M, lane_job, lane_raw, run_lane

ROUNDS = 2


@dataclass(frozen=True)
class Run:
    """The CIDs a 1-lane run of the demo recorded in its last round, and its job."""

    job: dict[str, Any]
    body: str  # dids
    head: str
    inputs: dict[int, CID]  # body's: its rows
    outputs: dict[int, CID]  # body's activations = the head's inputs
    params: CID  # body's
    head_params: CID


@pytest.fixture(scope="module")
def run(kubo: KuboDaemon) -> Run:
    config = PipelineDemoConfig(replicas=1, rounds=ROUNDS, micro_batches=3, seed=5)

    async def go() -> Run:
        async with kubo.node() as node:
            result = await run_pipeline_demo(config, node, digits_split(1, config.seed))
        (body, b), (head, h) = result.last.items()
        assert b.params is not None and h.params is not None
        job = {
            "job": result.job,
            "coordinator": result.coordinator,
            "peers": [body, head],
            "stages": [
                {"name": "body", "tensors": ["fc1.*"], "peers": [body]},
                {"name": "head", "tensors": ["fc2.*"], "peers": [head]},
            ],
            "pipeline": {"micro_batches": 3},
        }
        return Run(job, body, head, b.inputs, b.outputs, b.params, h.params)

    return asyncio.run(go())


def toml(job: dict[str, Any], path: Path) -> Path:
    """``job`` as a job file (JSON strings and lists are TOML's too)."""
    lines = [f"{k} = {json.dumps(job[k])}" for k in ("job", "coordinator", "peers")]
    for stage in job["stages"]:
        lines += ["[[stages]]", *(f"{k} = {json.dumps(v)}" for k, v in stage.items())]
    lines += ["[pipeline]", f"micro_batches = {job['pipeline']['micro_batches']}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def cli(kubo: KuboDaemon, capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["audit", "stage", *map(str, argv), "--api", kubo.api_url])
    out = capsys.readouterr()
    return code, out.out + out.err


def check(kubo: KuboDaemon, activation: str = "tanh", **kw: Any) -> StageReport:
    async def go() -> StageReport:
        async with kubo.node() as node:
            return await verify_stage(GradientStore(node), activation, **kw)

    return asyncio.run(go())


def failed(kubo: KuboDaemon, activation: str = "tanh", **kw: Any) -> str:
    with pytest.raises(AuditError) as err:
        check(kubo, activation, **kw)
    return err.value.check


def put(kubo: KuboDaemon, doc: Gradient) -> CID:
    async def go() -> CID:
        async with kubo.node() as node:
            return await GradientStore(node).put(doc)

    return asyncio.run(go())


def get(kubo: KuboDaemon, cid: CID) -> Gradient:
    async def go() -> Gradient:
        async with kubo.node() as node:
            return await GradientStore(node).get(cid)

    return asyncio.run(go())


def forged_output(kubo: KuboDaemon, run: Run, nudge: float) -> CID:
    """What the stage could have announced for micro-batch 1: its output with one value
    moved by ``nudge``, under the honest output's meta."""
    honest = get(kubo, run.outputs[1])
    value = np.array(honest.tensors[ACTIVATION])
    value[0, 0] += nudge
    return put(kubo, Gradient({ACTIVATION: value}, dict(honest.meta)))


def honest(run: Run, mb: int = 1) -> dict[str, CID]:
    return {"output_cid": run.outputs[mb], "input_cid": run.inputs[mb], "params_cid": run.params}


@pytest.fixture
def job_file(run: Run, tmp_path: Path) -> Iterator[Path]:
    yield toml(run.job, tmp_path / "job.toml")


def test_an_honest_stage_passes_bit_for_bit_pinned_to_its_job_file(
    kubo: KuboDaemon, run: Run, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, said = cli(
        kubo, capsys, run.outputs[1], "--input", run.inputs[1], "--params", run.params,
        "--activation", "tanh", "--config", job_file,
    )  # fmt: skip
    assert code == 0, said
    assert said.startswith(
        f"ok stage body of round {ROUNDS - 1} of job {run.job['job']}, micro-batch 1, peer "
        f"{run.body}: input {run.inputs[1]} (the job's rows, "
    ), said
    assert said.rstrip().endswith(f"output {run.outputs[1]} matches bit for bit"), said


def test_a_forged_output_fails_output_cid(
    kubo: KuboDaemon, run: Run, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = forged_output(kubo, run, 1e-3)
    code, said = cli(
        kubo, capsys, forged, "--input", run.inputs[1], "--params", run.params,
        "--activation", "tanh", "--config", job_file,
    )  # fmt: skip
    assert code == 1, said
    assert said.startswith("error: check output-cid failed: re-executing fc1 (tanh) over input ")
    assert f"not the published {forged}: the activations differ by up to 0.001" in said


@dataclass(frozen=True)
class Lying(DenseStage):
    """fc1 with tanh, whose outputs are moved by 1e-3: what the stage sends and records."""

    def forward(self, params: Mapping[str, Array], x: Array) -> Array:
        return super().forward(params, x) + 1e-3


def test_a_stage_that_announced_a_forged_output_fails_output_cid(
    kubo: KuboDaemon, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A body replica that computes other than fc1's forward pass and announces it, signed
    by its own key, in a real lane: the head takes it (the signature is valid; so is every
    document), the round closes, and re-executing body's recorded micro-batch fails."""
    body, head = run_lane(kubo, tmp_path, lane_job(in_flight=M), body_layer=Lying("fc1", "tanh"))
    assert head.inputs == body.outputs  # the head took what body announced
    assert body.params is not None
    job = toml(lane_raw(), tmp_path / "job.toml")
    argv = [body.outputs[2], "--input", body.inputs[2], "--params", body.params]
    code, said = cli(kubo, capsys, *argv, "--activation", "tanh", "--config", job)
    assert code == 1, said
    assert said.startswith("error: check output-cid failed: re-executing fc1 (tanh) over input ")
    assert f"not the published {body.outputs[2]}: the activations differ by up to 0.001" in said


def test_a_tolerance_passes_a_difference_within_it_and_says_so(
    kubo: KuboDaemon, run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    """As on another machine whose BLAS rounds the last bits otherwise."""
    forged = forged_output(kubo, run, 1e-13)
    argv = [forged, "--input", run.inputs[1], "--params", run.params, "--activation", "tanh"]
    assert cli(kubo, capsys, *argv)[0] == 1
    code, said = cli(kubo, capsys, *argv, "--tolerance", "1e-12")
    assert code == 0, said
    assert "matches within tolerance 1e-12 (activations differ by up to 1e-13" in said
    assert "(not pinned to a job file: see --config)" in said


def test_the_wrong_activation_fails_output_cid(kubo: KuboDaemon, run: Run) -> None:
    assert failed(kubo, "none", **honest(run)) == "output-cid"


def test_a_stage_after_the_first_passes_from_the_activation_it_took(
    kubo: KuboDaemon, run: Run
) -> None:
    """The head sends no activations; its input is body's output, bound by that meta: the
    head's parameters over it give the head's logits, which nobody published."""
    body_out = get(kubo, run.outputs[0])
    head_params = get(kubo, run.head_params)
    logits = np.asarray(body_out.tensors[ACTIVATION]) @ head_params.tensors["fc2.weight"].T
    logits = logits + head_params.tensors["fc2.bias"]
    meta = {**body_out.meta, "stage": "head", "peer": run.head}
    out = put(kubo, Gradient({ACTIVATION: logits}, meta))
    report = check(
        kubo, "none", output_cid=out, input_cid=run.outputs[0], params_cid=run.head_params,
        config=parse_job(run.job),
    )  # fmt: skip
    assert report.audit.matches and not report.first_stage and report.stage == "head"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("input of another micro-batch", "input-meta"),
        ("parameters of another round", "params-meta"),
        ("another stage's parameters", "params-meta"),
        ("parameters of two layers", "params-schema"),
        ("an output of float32", "output-schema"),
        ("an output without its meta", "output-schema"),
        ("a wider input", "stage-shapes"),
    ],
)
def test_each_document_that_is_not_the_one_named_fails_its_check(
    kubo: KuboDaemon, run: Run, change: str, named: str
) -> None:
    cids = honest(run)
    params, out, x = get(kubo, run.params), get(kubo, run.outputs[1]), get(kubo, run.inputs[1])
    tensors, value = dict(params.tensors), np.asarray(out.tensors[ACTIVATION])
    if change == "input of another micro-batch":
        cids["input_cid"] = run.inputs[2]
    elif change == "parameters of another round":
        cids["params_cid"] = put(kubo, Gradient(tensors, {**params.meta, "round": 0}))
    elif change == "another stage's parameters":
        cids["params_cid"] = run.head_params
    elif change == "parameters of two layers":
        extra = {**tensors, "fc9.bias": tensors["fc1.bias"]}
        cids["params_cid"] = put(kubo, Gradient(extra, dict(params.meta)))
    elif change == "an output of float32":
        f32 = Gradient({ACTIVATION: value.astype(np.float32)}, dict(out.meta))
        cids["output_cid"] = put(kubo, f32)
    elif change == "an output without its meta":
        cids["output_cid"] = put(kubo, Gradient({ACTIVATION: value}))
    else:
        wide = np.hstack([np.asarray(x.tensors[ACTIVATION])] * 2)
        cids["input_cid"] = put(kubo, Gradient({ACTIVATION: wide}, dict(x.meta)))
    assert failed(kubo, **cids) == named, change


def test_pinned_to_a_job_whose_stage_another_peer_holds_fails_stage_peer(
    kubo: KuboDaemon, run: Run
) -> None:
    job = dict(run.job)
    job["stages"] = [dict(s) for s in run.job["stages"]]
    job["stages"][0]["peers"], job["stages"][1]["peers"] = [run.head], [run.body]
    assert failed(kubo, config=parse_job(job), **honest(run)) == "stage-peer"
    other = {**run.job, "job": "another-job"}
    assert failed(kubo, config=parse_job(other), **honest(run)) == "expected-job"


def test_a_negative_tolerance_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    cid = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    argv = [cid, "--input", cid, "--params", cid, "--activation", "tanh", "--tolerance", "-1"]
    assert main(["audit", "stage", *argv]) == 2
    assert "--tolerance must be >= 0, got -1.0" in capsys.readouterr().err
