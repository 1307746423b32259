"""What a peer refuses before it sends anything in a job with steps (issue 19 part 6): no
step, a step the job does not have or the peer is not in, a tensor in no step, a step's
tensor missing; and how a gradient is cut into steps (the same arrays, no copy).

No network: the peer runs on a LocalNode, and "nothing sent" means nothing pinned and
nothing announced on the job's gradients topic.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradstore.compress import compress
from gradstore.dag import CID
from gradstore.dag.cid import RAW
from gradstore.errors import ConfigError, StepError, UncoveredTensorError
from gradstore.format import Gradient
from gradstore.job import JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.node import LocalNode
from gradstore.peer import Peer, PeerSteps

from ..coordinator.harness import key, make_job
from .scripted import STEP_TENSORS, stepped_job
from .test_steps import whole_gradient

Attempt = Callable[[Peer], Awaitable[Any]]


def _nothing_sent(
    tmp_path: Path, config: JobConfig, who: SigningKey, attempt: Attempt
) -> BaseException:
    """Run ``attempt`` on an entered peer; return what it raised, after checking that
    nothing was stored or announced."""

    async def go() -> BaseException:
        node = LocalNode(tmp_path / "node")
        async with node.subscribe(config.gradients_topic) as heard, Peer(config, node, who) as p:
            try:
                await attempt(p)
            except Exception as exc:
                raised = exc
            else:
                raise AssertionError("the attempt did not raise")
            assert await node.pins() == set()
            with pytest.raises(TimeoutError):
                await heard.get(timeout=0.2)
            return raised

    return asyncio.run(go())


def _whole() -> Gradient:
    return whole_gradient()


CASES: list[tuple[str, Attempt, type[Exception], str]] = [
    (
        "no step",
        lambda p: p.publish(_whole(), 0, 1),
        StepError,
        "job 'steps-job' is made of steps ('head', 'body', 'embed'): name the step "
        "(this peer's: 'head', 'body', 'embed'), or publish them all with publish_steps",
    ),
    (
        "unknown step",
        lambda p: p.publish(_whole(), 0, 1, step="tail"),
        StepError,
        "job 'steps-job' has no step 'tail' (its steps: 'head', 'body', 'embed')",
    ),
    (
        "a tensor in no step",
        lambda p: p.publish(Gradient({**_whole().tensors, "stray": np.ones(2)}), 0, 1, step="head"),
        UncoveredTensorError,
        "no step of the job covers tensor 'stray'",
    ),
    (
        "a tensor of the step missing",
        lambda p: p.publish(Gradient({"body.w": np.ones(2), "head.w": np.ones(2)}), 0, 1, step="body"),
        StepError,
        "the gradient lacks tensor 'body.b' of step 'body'",
    ),
    (
        "no tensor for a pattern",
        lambda p: p.publish(Gradient({"body.w": np.ones(2), "body.b": np.ones(2)}), 0, 1, step="head"),
        StepError,
        "the gradient has no tensor 'head.*' of step 'head'",
    ),
    (
        "publish_steps with a step missing",
        lambda p: p.publish_steps(Gradient({"head.w": np.ones(2), "embed": np.ones(2)}), 0, 1),
        StepError,
        "the gradient lacks tensor 'body.w' of step 'body'",
    ),
    (
        "announce without a step",
        lambda p: p.announce(CID.hash(RAW, b"stored before"), 0, 1),
        StepError,
        "name the step",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("case", "attempt", "error", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_publish_that_does_not_fit_the_steps_is_refused_before_anything_is_sent(
    tmp_path: Path, case: str, attempt: Attempt, error: type[Exception], message: str
) -> None:
    config, _, keys = stepped_job()
    raised = _nothing_sent(tmp_path, config, keys[0], attempt)
    assert type(raised) is error and message in str(raised), (case, raised)


def test_a_step_the_peer_is_not_in_is_refused_naming_its_steps(tmp_path: Path) -> None:
    config, _, keys = stepped_job()
    raised = _nothing_sent(
        tmp_path, config, keys[1], lambda p: p.publish(_whole(), 0, 1, step="body")
    )
    assert isinstance(raised, StepError) and raised.step == "body"
    assert str(raised) == (
        f"{keys[1].did} is not among the peers of step 'body' of job 'steps-job' "
        "(this peer's steps: 'head', 'embed')"
    )


def test_a_step_in_a_job_without_steps_is_refused(tmp_path: Path) -> None:
    config, _, keys = make_job(2)
    g = Gradient({"w": np.ones(3, np.float32)})
    raised = _nothing_sent(tmp_path, config, keys[0], lambda p: p.publish(g, 0, 1, step="all"))
    assert isinstance(raised, StepError)
    assert str(raised) == "job 'test-job' has no [[steps]]: publish without a step"
    assert isinstance(raised, ConfigError)  # a caller's mistake about the job, nothing ran


@pytest.mark.parametrize("stepped", [True, False])
def test_awaiting_a_step_the_job_does_not_have_is_refused_at_once(
    tmp_path: Path, stepped: bool
) -> None:
    config = stepped_job()[0] if stepped else make_job(2)[0]

    async def go() -> None:
        async with Peer(config, LocalNode(tmp_path / "n")) as p:
            with pytest.raises(StepError, match=r"no step 'tail'|no \[\[steps\]\]"):
                await p.await_result(0, step="tail", timeout=30)

    asyncio.run(go())


def test_cutting_keeps_the_same_arrays_and_drops_the_other_steps() -> None:
    config, _, keys = stepped_job()
    steps = PeerSteps(config, keys[1].did)  # head and embed
    whole = whole_gradient()
    whole.meta["note"] = "kept"
    parts = steps.cut_steps(whole, ["head", "embed"])
    for name, part in parts.items():
        assert sorted(part.tensors) == sorted(STEP_TENSORS[name])
        assert all(part.tensors[n] is whole.tensors[n] for n in part.tensors)
        assert part.meta == {"note": "kept"}
    mine = steps.mine_of(whole)
    assert sorted(mine.tensors) == sorted(STEP_TENSORS["head"] + STEP_TENSORS["embed"])
    assert all(mine.tensors[n] is whole.tensors[n] for n in mine.tensors)
    # a compressed gradient is cut the same way, its compressed tensors shared
    packed = compress(whole, "bf16")
    head = steps.cut(packed, "head")
    assert head.codec == packed.codec
    assert all(head.tensors[n] is packed.tensors[n] for n in STEP_TENSORS["head"])


def test_with_a_schema_the_steps_tensors_are_the_schemas() -> None:
    config, _, keys = stepped_job(
        schema=[
            {"name": n, "dtype": "<f4", "shape": [2]}
            for n in ("body.b", "body.w", "embed", "head.b", "head.w", "head.x")
        ]
    )
    steps = PeerSteps(config, keys[0].did)
    with pytest.raises(StepError, match=re.escape("lacks tensor 'head.x' of step 'head'")):
        steps.cut(whole_gradient(), "head")


def test_a_key_outside_the_job_is_refused_by_its_steps() -> None:
    config, _, _ = stepped_job()
    with pytest.raises(ConfigError, match="is not among the job's peers"):
        PeerSteps(config, key(50).did)


def test_without_steps_the_document_and_announcement_are_todays(tmp_path: Path) -> None:
    """The meta a job without steps stores is the one it stored before steps existed."""
    config, _, keys = make_job(2)
    g = Gradient({"w": np.arange(4, dtype=np.float32)}, {"note": 1})

    async def go() -> None:
        async with Peer(config, LocalNode(tmp_path / "n"), keys[0]) as p:
            doc = p.prepare(g, 3, 9)
            assert doc.meta == {
                "note": 1, "kind": "gradient", "round": 3, "peer": keys[0].did,
                "num_samples": 9, "job": config.job,
            }  # fmt: skip
            assert list(doc.meta) == ["note", "kind", "round", "peer", "num_samples", "job"]
            assert doc.tensors["w"] is g.tensors["w"]

    asyncio.run(go())


def test_a_steps_document_names_its_step_after_todays_meta(tmp_path: Path) -> None:
    config, _, keys = stepped_job()

    async def go() -> None:
        async with Peer(config, LocalNode(tmp_path / "n"), keys[0]) as p:
            doc = p.prepare(whole_gradient(), 3, 9, step="embed")
            assert list(doc.meta) == ["kind", "round", "peer", "num_samples", "job", "step"]
            assert doc.meta["step"] == "embed" and list(doc.tensors) == ["embed"]

    asyncio.run(go())


def test_a_peer_in_no_step_publishes_no_steps(tmp_path: Path) -> None:
    _, coord, keys = make_job(2)
    config = parse_job(
        {
            "job": "lonely",
            "coordinator": coord.did,
            "peers": [k.did for k in keys],
            "rounds": {"quorum": 1},
            "steps": [{"name": "only", "tensors": ["w"], "peers": [keys[0].did]}],
        }
    )
    g = Gradient({"w": np.ones(2, np.float32)})
    raised = _nothing_sent(tmp_path, config, keys[1], lambda p: p.publish_steps(g, 0, 1))
    assert isinstance(raised, StepError)
    assert str(raised) == f"{keys[1].did} is among the peers of no step of job 'lonely'"
