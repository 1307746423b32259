"""StepStream: each step of a job handed out during loss.backward(), output side first, as
soon as autograd has accumulated its gradients; the tensors are .grad bit for bit; unused
parameters never hang a step; accumulation hands out only the last pass; hooks come off."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
import torch
from torch import nn

from gradstore.errors import UncoveredTensorError
from gradstore.job import parse_job
from gradstore.messages import SigningKey
from gradstore.torch import ReadyStep, StepStream, StepStreamError, steps_from_module

COORD = SigningKey.from_seed(bytes([200]) * 32).did
PEERS = [SigningKey.from_seed(bytes([i + 1]) * 32).did for i in range(2)]


def plan_of(steps: list[dict[str, Any]]) -> Any:
    return parse_job({"job": "j", "coordinator": COORD, "peers": PEERS, "steps": steps}).plan


def seeded(model: nn.Module, seed: int = 3) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return model


def mlp() -> nn.Module:
    return seeded(
        nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))
    )


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.conv1 = nn.Conv2d(1, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.conv2(x)).mean(dim=(2, 3))
        return self.fc(x) * self.scale


class TwoHeads(nn.Module):
    """A trunk and two heads; a batch uses one head (the other gets no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(4, 8)
        self.a = nn.Linear(8, 2)
        self.b = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, head: str = "a") -> torch.Tensor:
        return self.a(self.trunk(x)) if head == "a" else self.b(self.trunk(x))


def loss_of(model: nn.Module, seed: int = 0, **kwargs: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    first = next(model.parameters())
    if isinstance(model, SmallCNN):
        x = torch.randn(4, 1, 7, 7, generator=g)
    elif isinstance(model, nn.TransformerEncoderLayer):
        x = torch.randn(2, 5, 32, generator=g)
    else:
        x = torch.randn(5, first.shape[1], generator=g)
    return model(x, **kwargs).square().mean()


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def test_the_head_step_is_handed_out_before_the_first_layer_has_a_gradient() -> None:
    model = mlp()
    seen: list[tuple[str, list[str]]] = []

    def on_ready(step: ReadyStep) -> None:  # in autograd's thread, backward still running
        have = [n for n, p in model.named_parameters() if p.grad is not None]
        seen.append((step.name, have))

    with StepStream(model, plan_of(steps_from_module(model)), on_ready=on_ready) as stream:
        loss_of(model).backward()
        assert stream.finish() == []  # every step was complete: nothing left
    assert [name for name, _ in seen] == ["4", "2", "0"]  # output side first
    head, middle, first = (have for _, have in seen)
    assert set(head) == {"4.weight", "4.bias"}  # not one gradient of layers 0 and 2 yet
    assert model[0].weight.grad is not None  # (it comes later in the same backward)
    assert set(middle) == {"4.weight", "4.bias", "2.weight", "2.bias"}
    assert len(first) == 6


@pytest.mark.parametrize("make", [mlp, SmallCNN, lambda: seeded(nn.TransformerEncoderLayer(
    32, 4, dim_feedforward=64, dropout=0.0, batch_first=True))], ids=["mlp", "cnn", "block"])  # fmt: skip
@pytest.mark.parametrize("by", ["children", "size"])
def test_the_steps_are_p_grad_bit_for_bit_and_the_same_as_a_plain_backward(
    make: Any, by: str
) -> None:
    model = make()
    reference = copy.deepcopy(model)
    loss_of(reference).backward()  # no hooks: the whole gradient as a plain sync sends it
    steps = steps_from_module(model, by=by, bucket_bytes=2_000)
    with StepStream(model, plan_of(steps)) as stream:
        loss_of(model).backward()
        got = stream.ready()
        assert stream.finish() == []
    assert sorted(s.name for s in got) == sorted(s["name"] for s in steps)
    grads = {n: g for s in got for n, g in s.grads.items()}
    params = dict(model.named_parameters())
    assert grads.keys() == params.keys()
    for name, grad in grads.items():
        assert grad is params[name].grad  # shared, not copied
        ref = dict(reference.named_parameters())[name].grad
        assert ref is not None and same_bits(grad, ref), name
    assert all(s.unused == () for s in got)


def test_the_mlp_steps_come_in_backward_order_by_size_too() -> None:
    model = mlp()
    steps = steps_from_module(model, by="size", bucket_bytes=300)
    assert len(steps) >= 4
    with StepStream(model, plan_of(steps)) as stream:
        loss_of(model).backward()
        assert [s.name for s in stream.ready()] == [s["name"] for s in steps]


def test_steps_come_in_autograds_order_even_where_registration_order_differs() -> None:
    model = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    steps = steps_from_module(model)
    assert [s["name"] for s in steps] == ["norm2", "norm1", "linear2", "linear1", "self_attn"]
    with StepStream(model, plan_of(steps)) as stream:
        loss_of(model).backward()
        # post-norm: norm1 comes before the feed-forward in forward, so after it in backward
        assert [s.name for s in stream.ready()] == [
            "norm2", "linear2", "linear1", "norm1", "self_attn"
        ]  # fmt: skip


def test_a_backward_in_another_thread_hands_steps_to_the_reader_in_order() -> None:
    model = mlp()
    with StepStream(model, plan_of(steps_from_module(model))) as stream:
        worker = threading.Thread(target=lambda: loss_of(model).backward())
        worker.start()
        names = [stream.get(timeout=30).name for _ in range(3)]
        worker.join()
        assert names == ["4", "2", "0"]
        with pytest.raises(TimeoutError, match=r"no step became ready in 0\.01 s"):
            stream.get(timeout=0.01)


def test_a_job_without_steps_is_one_step_ready_at_the_end_of_backward() -> None:
    model = SmallCNN()
    plan = parse_job({"job": "j", "coordinator": COORD, "peers": PEERS}).plan
    with StepStream(model, plan) as stream:
        loss_of(model).backward()
        (step,) = stream.ready()
    assert step.name == "all" and list(step.grads) == sorted(n for n, _ in model.named_parameters())


def test_unused_parameters_do_not_hang_a_step_finish_hands_it_out_with_zeros() -> None:
    model = TwoHeads()
    steps = [
        {"name": "b", "tensors": ["b.*"]},  # never used in this pass
        {"name": "a", "tensors": ["a.*"]},
        {"name": "trunk", "tensors": ["trunk.*"]},
    ]
    with StepStream(model, plan_of(steps)) as stream:
        loss_of(model, head="a").backward()
        assert [s.name for s in stream.ready()] == ["a", "trunk"]  # "b" waits...
        flushed = stream.finish()  # ...until finish(), not for ever
        assert [s.name for s in flushed] == ["b"]
        assert [s.name for s in stream.ready()] == ["b"]  # also on the queue
    (b,) = flushed
    assert b.unused == ("b.bias", "b.weight")
    assert all(torch.equal(g, torch.zeros_like(g)) for g in b.grads.values())
    assert b.grads["b.weight"].shape == model.b.weight.shape
    assert model.b.weight.grad is None  # the model's .grad is left alone


def test_a_step_partly_used_waits_for_finish_and_names_what_got_no_gradient() -> None:
    model = TwoHeads()
    steps = [
        {"name": "heads", "tensors": ["a.*", "b.*"]},
        {"name": "trunk", "tensors": ["trunk.*"]},
    ]
    with StepStream(model, plan_of(steps)) as stream:
        loss_of(model, head="b").backward()
        assert [s.name for s in stream.ready()] == ["trunk"]
        (heads,) = stream.finish()
        assert heads.unused == ("a.bias", "a.weight")
        assert heads.grads["b.weight"] is model.b.weight.grad
        assert torch.equal(heads.grads["a.weight"], torch.zeros(2, 8))
        assert stream.ready() == [heads]  # handed out as every step, and returned
        # the next pass starts afresh: this time head a, and "heads" again waits for finish()
        model.zero_grad()
        loss_of(model, seed=1, head="a").backward()
        assert [s.name for s in stream.ready()] == ["trunk"]
        assert stream.finish()[0].unused == ("b.bias", "b.weight")


def test_gradient_accumulation_hands_out_only_the_last_pass_with_the_sum() -> None:
    model, reference = TwoHeads(), TwoHeads()
    reference.load_state_dict(model.state_dict())
    loss_of(reference, seed=1, head="b").backward()
    loss_of(reference, seed=2, head="a").backward()  # .grad: the sum of both micro-batches
    steps = [{"name": "b", "tensors": ["b.*"]}, {"name": "a", "tensors": ["a.*", "trunk.*"]}]
    with StepStream(model, plan_of(steps)) as stream:
        stream.new_pass(final=False)
        loss_of(model, seed=1, head="b").backward()
        assert stream.ready() == []  # an accumulating pass hands out nothing
        stream.new_pass()
        loss_of(model, seed=2, head="a").backward()
        (a,) = stream.ready()
        (b,) = stream.finish()  # used in the first micro-batch only: its accumulated .grad
    assert b.unused == ("b.bias", "b.weight") and a.unused == ()
    ref = dict(reference.named_parameters())
    for step in (a, b):
        for name, grad in step.grads.items():
            assert same_bits(grad, ref[name].grad), name
    assert b.grads["b.weight"] is model.b.weight.grad


def test_shared_gradients_change_with_the_next_accumulate_copies_do_not() -> None:
    shared_model, copied_model = mlp(), mlp()
    out: dict[bool, ReadyStep] = {}
    for model, copy_ in ((shared_model, False), (copied_model, True)):
        with StepStream(model, plan_of(steps_from_module(model)), copy=copy_) as stream:
            loss_of(model).backward()
            head = stream.ready()[0]
            before = head.grads["4.weight"].clone()
            stream.finish()
            stream.new_pass(final=False)
            loss_of(model, seed=1).backward()  # accumulates into .grad in place
            out[copy_] = head
            grad = model[4].weight.grad
            assert grad is not None
            if copy_:
                assert same_bits(head.grads["4.weight"], before)  # the value when handed out
                assert head.grads["4.weight"].data_ptr() != grad.data_ptr()
            else:
                assert head.grads["4.weight"] is grad  # .grad itself: now the sum of two
                assert not torch.equal(head.grads["4.weight"], before)


def test_a_second_backward_in_one_pass_is_refused() -> None:
    model = mlp()
    with StepStream(model, plan_of(steps_from_module(model))) as stream:
        loss_of(model).backward()
        with pytest.raises(StepStreamError, match=r"parameter '4\.(weight|bias)' got a second"):
            loss_of(model).backward()  # the hook's error comes out of backward()
        with pytest.raises(StepStreamError, match="a pass is under way"):
            stream.new_pass()
        stream.finish()
        stream.new_pass(final=False)
        with pytest.raises(StepStreamError, match="finish\\(\\) after an accumulating pass"):
            stream.finish()
    with pytest.raises(StepStreamError, match="not open"):
        stream.finish()


def test_leaving_removes_every_hook_even_on_an_error() -> None:
    model = mlp()
    calls: list[str] = []
    stream = StepStream(
        model, plan_of(steps_from_module(model)), on_ready=lambda s: calls.append(s.name)
    )
    with pytest.raises(KeyError), stream:
        assert stream.is_open
        assert all(len(p._post_accumulate_grad_hooks or {}) == 1 for p in model.parameters())
        raise KeyError("the loop failed")
    assert not stream.is_open
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())
    loss_of(model).backward()
    assert calls == [] and stream.ready() == []
    with stream:  # it can open again
        model.zero_grad()
        loss_of(model).backward()
    assert calls == ["4", "2", "0"]


def test_a_failed_open_leaves_no_hook() -> None:
    leaf = torch.zeros(3, requires_grad=True)
    derived = leaf * 2  # requires grad, but not a leaf: no post-accumulate-grad hook
    plan = plan_of([{"name": "s", "tensors": ["a", "b"]}])
    stream = StepStream([("a", leaf), ("b", derived)], plan)
    with pytest.raises(RuntimeError, match="leaf"):
        stream.open()
    assert not stream.is_open and not leaf._post_accumulate_grad_hooks


def test_a_model_and_steps_that_do_not_match_are_refused() -> None:
    model = TwoHeads()
    with pytest.raises(UncoveredTensorError, match=r"trunk\.bias"):
        StepStream(model, plan_of([{"name": "s", "tensors": ["a.*", "b.*"]}]))
    with pytest.raises(ValueError, match="step 'extra' covers none of the model's trainable"):
        StepStream(model, plan_of([{"name": "s", "tensors": ["a.*", "b.*", "trunk.*"]},
                                   {"name": "extra", "tensors": ["c.*"]}]))  # fmt: skip
