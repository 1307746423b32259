"""steps_from_module: a job's [[steps]] from a real module tree, output side first, each
trainable parameter in exactly one step, at most MAX_STEPS, accepted by parse_job (with a
[[schema]] of the model) as tables and as the TOML text steps_toml writes."""

from __future__ import annotations

import itertools
import tomllib
from typing import Any

import pytest
import torch
from torch import nn

from gradstore.job import MAX_STEPS, JobConfig, parse_job
from gradstore.messages import SigningKey
from gradstore.messages.schema import JOB_NAME
from gradstore.torch import CODES, steps_from_module, steps_toml

COORD = SigningKey.from_seed(bytes([200]) * 32).did
PEERS = [SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(2)]


class SmallCNN(nn.Module):
    """Conv-BN-conv-linear, a parameter on the root, and a frozen bias (not a step's)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)
        self.conv1.bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x))).flatten(1)
        return self.fc(x) * self.scale


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3)
    )


def block() -> nn.Module:
    return nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)


MODELS = {"mlp": mlp, "cnn": SmallCNN, "transformer": block}


def trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def schema(model: nn.Module) -> list[dict[str, Any]]:
    return [
        {"name": n, "dtype": CODES[p.dtype], "shape": list(p.shape)}
        for n, p in trainable(model).items()
    ]


def job(model: nn.Module, steps: list[dict[str, Any]]) -> JobConfig:
    raw = {"job": "j", "coordinator": COORD, "peers": PEERS, "schema": schema(model)}
    return parse_job({**raw, "steps": steps}, source="job.toml")


def expanded(cfg: JobConfig, model: nn.Module) -> list[list[str]]:
    """Each step's parameter names, in the order the steps list them (step by step)."""
    names = list(trainable(model))
    return [[n for n in names if step.covers(n)] for step in cfg.steps]


@pytest.mark.parametrize("bucket_bytes", [None, 1, 2_000, 10_000])
@pytest.mark.parametrize("kind", MODELS)
def test_every_model_gets_steps_parse_job_accepts_each_tensor_in_one(
    kind: str, bucket_bytes: int | None
) -> None:
    model = MODELS[kind]()
    if bucket_bytes is None:
        steps = steps_from_module(model)
    else:
        steps = steps_from_module(model, by="size", bucket_bytes=bucket_bytes)
    assert 1 <= len(steps) <= MAX_STEPS
    assert all(set(s) == {"name", "tensors"} and JOB_NAME.fullmatch(s["name"]) for s in steps)
    cfg = job(model, steps)  # with [[schema]]: every tensor in a step, every selector used
    assert [s.name for s in cfg.steps] == [s["name"] for s in steps]
    names = list(trainable(model))
    parts = cfg.plan.partition(names)
    flat = [n for part in parts.values() for n in part]
    assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))  # each exactly once
    assert all(parts.values())
    # backward order: the steps, read one after the other, list the parameters in reverse
    # registration order (within a step, in the step's own order)
    order = {n: i for i, n in enumerate(reversed(names))}
    steps_of = [sorted(part, key=order.__getitem__) for part in expanded(cfg, model)]
    assert [n for part in steps_of for n in part] == sorted(names, key=order.__getitem__)
    # and steps_toml's text reads back as the same tables and the same job
    text = steps_toml(steps)
    assert tomllib.loads(text)["steps"] == steps
    assert job(model, tomllib.loads(text)["steps"]).steps == cfg.steps


def test_children_are_steps_output_side_first() -> None:
    def names(model: nn.Module) -> list[tuple[str, list[str]]]:
        return [(s["name"], s["tensors"]) for s in steps_from_module(model)]

    assert names(mlp()) == [("4", ["4.*"]), ("2", ["2.*"]), ("0", ["0.*"])]
    assert names(SmallCNN()) == [  # the root's own parameter last (registered first)
        ("fc", ["fc.*"]),
        ("conv2", ["conv2.*"]),
        ("bn1", ["bn1.*"]),
        ("conv1", ["conv1.*"]),  # its frozen bias is not sent, and `conv1.*` may cover it
        ("root", ["scale"]),
    ]
    # the reverse of registration, as DDP's buckets: the block registers norm1 and norm2 after
    # its linears, though its forward uses norm1 before them (docs/frameworks.md says so)
    assert [n for n, _ in names(block())] == ["norm2", "norm1", "linear2", "linear1", "self_attn"]


def test_size_buckets_fill_up_to_the_target_a_larger_tensor_alone() -> None:
    model = block()
    params = trainable(model)
    size = {n: p.numel() * p.element_size() for n, p in params.items()}
    target = 8_000  # under each linear weight (8,192 bytes): those go alone
    steps = steps_from_module(model, by="size", bucket_bytes=target)
    cfg = job(model, steps)
    parts = expanded(cfg, model)
    assert [s["name"] for s in steps] == [f"bucket{k}" for k in range(len(steps))]
    for part in parts:
        total = sum(size[n] for n in part)
        assert total <= target or len(part) == 1, (part, total)
    # greedy: no bucket could have taken the next bucket's first tensor
    backward = list(reversed(params))
    for part, following in itertools.pairwise(parts):
        first = min(following, key=backward.index)
        assert sum(size[n] for n in part) + size[first] > target
    # a whole module that fits is one pattern; a split one is named tensor by tensor
    assert ["self_attn.out_proj.*", "self_attn.in_proj_bias"] in [s["tensors"] for s in steps]
    assert all("self_attn.*" not in s["tensors"] for s in steps)
    # DDP's 25 MiB: this small block is one step, one pattern per top-level child
    (whole,) = steps_from_module(model, by="size")
    assert whole == {
        "name": "bucket0",
        "tensors": ["norm2.*", "norm1.*", "linear2.*", "linear1.*", "self_attn.*"],
    }


def test_more_children_or_buckets_than_max_steps_merge_neighbours() -> None:
    deep = nn.Sequential(*[nn.Linear(2, 2) for _ in range(100)])
    for steps in (steps_from_module(deep), steps_from_module(deep, by="size", bucket_bytes=1)):
        assert len(steps) <= MAX_STEPS
        cfg = job(deep, steps)
        parts = expanded(cfg, deep)
        sizes = {len(p) for p in parts}
        assert max(sizes) - min(sizes) <= 2  # balanced: no step takes most of the model
    merged = steps_from_module(deep)
    assert merged[0] == {"name": "99-98", "tensors": ["99.*", "98.*"]}
    assert merged[-1] == {"name": "1-0", "tensors": ["1.*", "0.*"]}
    exactly = nn.Sequential(*[nn.Linear(2, 2) for _ in range(MAX_STEPS)])
    assert len(steps_from_module(exactly)) == MAX_STEPS  # no merge when they fit


def test_child_names_become_valid_unique_step_names_and_toml_survives_them() -> None:
    model = nn.Module()
    model.bias = nn.Parameter(torch.zeros(2))  # the root's own: step "root", as a child's
    for name in ("root", "a b", "a_b", "_hidden", 'q"uote\\', "é", "x" * 80):
        model.add_module(name, nn.Linear(2, 2))
    steps = steps_from_module(model)
    names = [s["name"] for s in steps]
    assert all(JOB_NAME.fullmatch(n) for n in names) and len(set(names)) == len(names)
    assert names == ["x" * 64, "s_", "q_uote_", "s_hidden", "a_b", "a_b-2", "root", "root-2"]
    assert steps[2]["tensors"] == ['q"uote\\.*']
    text = steps_toml(steps)
    assert tomllib.loads(text)["steps"] == steps
    cfg = job(model, tomllib.loads(text)["steps"])
    assert cfg.plan.step_of('q"uote\\.weight') is cfg.steps[2]
    assert cfg.plan.step_of("bias") is cfg.steps[-1]
    assert cfg.plan.step_of("root.bias") is cfg.steps[-2]


def test_names_limit_the_steps_to_some_parameters() -> None:
    model = SmallCNN()
    steps = steps_from_module(model, names=["fc.weight", "fc.bias", "conv2.weight"])
    assert steps == [
        {"name": "fc", "tensors": ["fc.*"]},
        {"name": "conv2", "tensors": ["conv2.*"]},  # conv2.bias is not sent: the pattern may
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"by": "layers"}, "by must be 'children' or 'size', not 'layers'"),
        ({"by": "size", "bucket_bytes": 0}, "bucket_bytes must be a positive integer, not 0"),
        ({"bucket_bytes": 2.5}, "bucket_bytes must be a positive integer, not 2.5"),
        ({"names": ["fc.weight", "conv1.bias"]}, "not trainable parameters of the model: "),
        ({"names": []}, "names lists no parameter"),
        ({"names": "fc.weight"}, "names must be a collection of parameter names, not the string"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        steps_from_module(SmallCNN(), **kwargs)


def test_a_parameter_name_that_cannot_be_a_tensor_name_is_refused() -> None:
    model = nn.Module()
    model.add_module("a\x1b[2J", nn.Linear(2, 2))  # a terminal escape
    with pytest.raises(ValueError, match="contains the control character U\\+001B"):
        steps_from_module(model)


def test_steps_toml_writes_other_keys_and_long_lists() -> None:
    steps = [
        {"name": "a", "tensors": [f"layer{i}.weight" for i in range(20)], "quorum": 1},
        {"name": "b", "tensors": ["x"], "deadline_s": 2.5, "peers": PEERS[:1]},
    ]
    text = steps_toml(steps)
    assert '  "layer19.weight",\n]' in text
    assert tomllib.loads(text)["steps"] == steps
    with pytest.raises(TypeError, match="cannot write dict"):
        steps_toml([{"name": "a", "tensors": ["x"], "bad": {}}])
    with pytest.raises(ValueError, match="'a b' is not a \\[\\[steps\\]\\] key"):
        steps_toml([{"name": "a", "a b": 1}])
    with pytest.raises(ValueError, match="lone surrogate"):
        steps_toml([{"name": "a", "tensors": ["\udc80"]}])
