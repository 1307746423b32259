"""TorchPeer.streaming on real Kubo with a real coordinator (issue 19 part 7): two peers
stream a stepped round out of backward. Each step is announced while backward still runs
(the output layer's before backward reaches the first layer), each step's aggregate lands in
``.grad`` bit for bit as a whole-gradient ``sync_grads`` of the same model and batches puts it
there, and a failed step leaves its parameters' ``.grad`` None while the others are applied."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from gradstore.coordinator import Coordinator
from gradstore.errors import InvalidDocumentError, MessageError, StepError
from gradstore.job import JobConfig, load_job, parse_job
from gradstore.messages import Announce, SigningKey, decode_message
from gradstore.node import KuboDaemon, LocalNode
from gradstore.peer import Peer
from gradstore.torch import (
    StepsFailedError,
    StreamedRound,
    TorchPeer,
    steps_from_module,
    steps_toml,
)

pytestmark = [pytest.mark.kubo, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SEED = 11
LR = 0.5
SPLIT = (28, 20, 16)  #: each peer's share of the batch
COORD = SigningKey.from_seed(bytes([90]) * 32)
KEYS = sorted((SigningKey.from_seed(bytes([91 + i]) * 32) for i in range(3)), key=lambda k: k.did)


def mlp() -> nn.Sequential:
    """Three Linear layers (steps "4", "2", "0" by children), the same weights every call."""
    model = nn.Sequential(
        nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)
    )
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=g) - 0.5)
    return model


def batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Peer ``index``'s share of one fixed batch (``SPLIT``)."""
    g = torch.Generator().manual_seed(SEED + 1)
    x, y = torch.randn(sum(SPLIT), 8, generator=g), torch.randint(0, 3, (sum(SPLIT),), generator=g)
    lo = sum(SPLIT[:index])
    return x[lo : lo + SPLIT[index]], y[lo : lo + SPLIT[index]]


def job(name: str, method: str, *, steps: list[dict[str, Any]] | None, rounds: int = 1,
        peers: int = 2) -> JobConfig:  # fmt: skip
    raw: dict[str, Any] = {
        "job": f"{name}-{os.getpid()}-{time.monotonic_ns()}",
        "coordinator": COORD.did,
        "peers": [k.did for k in KEYS[:peers]],
        "aggregation": {"method": method},
        "rounds": {"count": rounds, "quorum": min(peers, 3), "deadline_s": 60},
    }
    if steps is not None:
        raw["steps"] = steps
    return parse_job(raw)


@contextlib.contextmanager
def coordinator(daemon: KuboDaemon, config: JobConfig, state: Path) -> Iterator[None]:
    """The real Coordinator on its own event loop and thread, until its rounds are done."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    async def main() -> None:
        async with daemon.node() as node:
            c = Coordinator(config, COORD, node, state, rebroadcast_s=0.5, linger_s=0)
            await c.run(stop)

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # raised in the test's thread below
            failed.append(exc)

    thread = threading.Thread(target=target, name="test-coordinator")
    thread.start()
    try:
        yield
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(60)
        loop.close()
    if failed:
        raise failed[0]


def peers(fn: Callable[[int], Any], n: int = 2) -> list[Any]:
    """``fn(i)`` for each peer, all at once (each in a thread, as separate processes would)."""
    with ThreadPoolExecutor(n) as pool:
        runs = [pool.submit(fn, i) for i in range(n)]
        return [run.result(timeout=300) for run in runs]


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def train(daemon: KuboDaemon, config: JobConfig, index: int, *, streamed: bool,
          rounds: int) -> list[dict[str, torch.Tensor]]:  # fmt: skip
    """One peer's loop: each round's ``.grad`` after the sync, then the final parameters."""
    model, (x, y) = mlp(), batch(index)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    after: list[dict[str, torch.Tensor]] = []
    with TorchPeer(config, KEYS[index], api=daemon.api_url, timeout=120,
                   first_backoff_s=0.5) as peer:  # fmt: skip
        for round_ in range(rounds):
            optimizer.zero_grad()
            if streamed:
                with peer.streaming(model, round_, num_samples=len(x)) as s:
                    nn.functional.cross_entropy(model(x), y).backward()
                assert sorted(s.results) == sorted(st.name for st in config.steps)
            else:
                nn.functional.cross_entropy(model(x), y).backward()
                peer.sync_grads(model, round_, num_samples=len(x))
            after.append(grads(model))
            optimizer.step()
    after.append({name: p.detach().clone() for name, p in model.named_parameters()})
    return after


@pytest.mark.parametrize("method", ["fedavg", "median"])
def test_a_streamed_round_is_bit_identical_to_a_whole_gradient_sync(
    kubo: KuboDaemon, tmp_path: Path, method: str
) -> None:
    rounds = 2
    steps = steps_from_module(mlp())
    assert [s["name"] for s in steps] == ["4", "2", "0"]  # three steps, output side first
    runs = {}
    for streamed, config in (
        (False, job("whole", method, steps=None, rounds=rounds, peers=3)),
        (True, job("steps", method, steps=steps, rounds=rounds, peers=3)),
    ):
        with coordinator(kubo, config, tmp_path / f"state-{streamed}"):
            run = partial(train, kubo, config, streamed=streamed, rounds=rounds)
            runs[streamed] = peers(run, 3)
    local = grads(_backward(mlp(), *batch(0)))
    for i in range(3):
        whole, streamed = runs[False][i], runs[True][i]
        assert len(whole) == len(streamed) == rounds + 1
        for k, (want, got) in enumerate(zip(whole, streamed, strict=True)):
            assert want.keys() == got.keys() and len(want) == 6
            for name in want:
                assert torch.equal(want[name], got[name]), f"peer {i}, {k}: {name} differs"
    # not vacuous: the aggregate replaced the local gradient, and every peer holds it
    assert all(not torch.equal(local[n], runs[True][0][0][n]) for n in local)
    assert all(torch.equal(runs[True][0][0][n], runs[True][i][0][n]) for n in local for i in (1, 2))


def _backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> nn.Module:
    nn.functional.cross_entropy(model(x), y).backward()
    return model


class Announcements:
    """Every announcement on a job's gradients topic, heard on the node in its own thread."""

    def __init__(self, daemon: KuboDaemon, topic: str) -> None:
        self.daemon, self.topic = daemon, topic
        self.heard: list[tuple[float, Announce]] = []
        self.news = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._watch(),))

    def __enter__(self) -> Announcements:
        self._thread.start()
        assert self._subscribed.wait(30), "the watcher never subscribed"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._loop.close()

    async def _watch(self) -> None:
        async with self.daemon.node() as node, node.subscribe(self.topic) as sub:
            self._subscribed.set()
            while not self._stop.is_set():
                try:
                    msg = await sub.get(timeout=0.2)
                except TimeoutError:
                    continue
                with contextlib.suppress(MessageError):
                    announce = decode_message(msg.data)
                    if isinstance(announce, Announce):
                        with self.news:
                            self.heard.append((time.monotonic(), announce))
                            self.news.notify_all()

    def wait_for(self, peer: str, step: str, timeout: float) -> bool:
        """Whether ``peer``'s announcement of ``step`` is heard within ``timeout`` seconds."""

        def seen() -> bool:
            return any(a.peer == peer and a.step == step for _, a in self.heard)

        with self.news:
            return self.news.wait_for(seen, timeout)


def test_the_output_step_is_announced_before_backward_reaches_the_first_layer(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    config = job("early", "fedavg", steps=steps_from_module(mlp()))
    head = config.steps[0].name
    assert head == "4"

    def one(index: int, heard: Announcements) -> tuple[bool, bool, dict[str, float]]:
        model, (x, y) = mlp(), batch(index)
        first = model[0]
        found: dict[str, bool] = {}

        def at_first_layer(grad: torch.Tensor) -> None:
            # autograd's thread, about to compute the first layer's gradients: wait here,
            # holding backward up, until this peer's output step is on the wire
            found["announced"] = heard.wait_for(KEYS[index].did, head, timeout=30)
            found["first layer untouched"] = first.weight.grad is None

        with (
            TorchPeer(config, KEYS[index], api=kubo.api_url, timeout=120, first_backoff_s=0.5) as peer,
            peer.streaming(model, 0, num_samples=len(x)) as s,
        ):  # fmt: skip
            hidden = first(x)
            hidden.register_hook(at_first_layer)
            nn.functional.cross_entropy(model[1:](hidden), y).backward()
        return found["announced"], found["first layer untouched"], s.ready_at

    with Announcements(kubo, config.gradients_topic) as heard, coordinator(kubo, config, tmp_path):
        outcomes = peers(lambda i: one(i, heard))
    for announced, untouched, ready_at in outcomes:
        assert untouched
        assert announced, "the output step was not announced while backward ran"
        assert list(ready_at) == ["4", "2", "0"]  # handed out of backward in its order


def test_a_failed_step_leaves_its_grad_none_and_the_others_applied(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """Step "4" needs all three peers and the third never comes: it fails at its deadline;
    steps "2" and "0" (the two peers) close and are applied on both."""
    steps = steps_from_module(mlp())
    two = [k.did for k in KEYS[:2]]
    steps[0].update(quorum=3, deadline_s=3.0)
    for s in steps[1:]:
        s["peers"] = two
    config = job("failed", "fedavg", steps=steps, peers=3)

    def one(index: int) -> tuple[StepsFailedError, nn.Module, dict[str, torch.Tensor]]:
        model, (x, y) = mlp(), batch(index)
        with (
            TorchPeer(config, KEYS[index], api=kubo.api_url, timeout=120, first_backoff_s=0.5) as peer,
            pytest.raises(StepsFailedError) as caught,
            peer.streaming(model, 0, num_samples=len(x)),
        ):  # fmt: skip
            nn.functional.cross_entropy(model(x), y).backward()
        return caught.value, model, grads(_backward(mlp(), x, y))

    with coordinator(kubo, config, tmp_path):
        outcomes = peers(one)
    for error, model, local in outcomes:
        assert list(error.failed) == ["4"] and error.step == "4"
        assert sorted(error.results) == ["0", "2"]
        assert re.search(r"1 step\(s\) failed \(step '4': ", str(error)), str(error)
        assert model[4].weight.grad is None and model[4].bias.grad is None
        applied = grads(model)
        assert sorted(applied) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        n = sum(SPLIT[:2])
        for name, value in applied.items():
            mean = (SPLIT[0] * outcomes[0][2][name] + SPLIT[1] * outcomes[1][2][name]) / n
            assert torch.allclose(value, mean, atol=1e-6), name
            assert not torch.equal(value, local[name])  # the aggregate, not the local gradient
    assert all(torch.equal(outcomes[0][1].get_parameter(n).grad, outcomes[1][1].get_parameter(n).grad)
               for n in ("0.weight", "2.weight"))  # fmt: skip


def test_streaming_needs_a_stepped_job(tmp_path: Path) -> None:
    config = job("flat", "fedavg", steps=None)
    peer = Peer(config, LocalNode(tmp_path), KEYS[0])
    with pytest.raises(StepError, match="has no \\[\\[steps\\]\\]: there is nothing to stream"):
        StreamedRound(peer, mlp(), 0, 10)


def test_the_frameworks_page_streaming_example_runs_as_written(
    kubo: KuboDaemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """docs/frameworks.md's example, read from the page and run in a folder holding the
    job file it names (one peer, its model's steps) and alice.key, the node in $GRADSTORE_API."""
    page = (ROOT / "docs" / "frameworks.md").read_text()
    section = page.split("\n### Streaming a round out of backward\n", 1)[1]
    example = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert example is not None, "the section has no python example"
    code = example.group(1)
    namespace: dict[str, Any] = {"__name__": "example"}
    model = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)
    )
    alice = KEYS[0]
    (tmp_path / "job.toml").write_text(
        f'job = "example-{os.getpid()}-{time.monotonic_ns()}"\ncoordinator = "{COORD.did}"\n'
        f'peers = ["{alice.did}"]\n[rounds]\ncount = 3\nquorum = 1\n\n'
        + steps_toml(steps_from_module(model))
    )
    alice.save(tmp_path / "alice.key")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GRADSTORE_API", kubo.api_url)
    with coordinator(kubo, load_job(tmp_path / "job.toml"), tmp_path / "state"):
        exec(compile(code, "docs/frameworks.md", "exec"), namespace)
    lines = capsys.readouterr().out.splitlines()
    prefix = "round {}: steps applied in the order "
    assert [line[: len(prefix) - 1] for line in lines] == [prefix.format(r) for r in range(3)]
    assert all(
        sorted(ast.literal_eval(line[len(prefix) - 1 :])) == ["0", "2", "4"] for line in lines
    )
    assert all(p.grad is not None for p in namespace["model"].parameters())


def test_a_step_that_cannot_be_sent_is_raised_at_once(kubo: KuboDaemon) -> None:
    """A gradient gradstore/1 cannot hold (complex64) is raised out of the block as soon as
    its step comes out of backward, not once the step's deadline has passed."""
    model = nn.Sequential(nn.Linear(4, 2, dtype=torch.complex64))
    config = job("complex", "fedavg", steps=steps_from_module(model), peers=1)
    x = torch.randn(3, 4, dtype=torch.complex64)
    with TorchPeer(config, KEYS[0], api=kubo.api_url, timeout=120) as peer:
        started = time.monotonic()
        with (
            pytest.raises(InvalidDocumentError, match="complex64"),
            peer.streaming(model, 0, num_samples=len(x)),
        ):
            model(x).abs().square().mean().backward()
        assert time.monotonic() - started < 10


def test_the_asyncio_face_streams_a_round_over_an_entered_peer(
    kubo: KuboDaemon, tmp_path: Path
) -> None:
    """``async with StreamedRound(peer, ...)`` with backward in a thread: every step applied
    (one peer's fedavg is its own gradient, bit for bit)."""
    model, (x, y) = mlp(), batch(0)
    config = job("async", "fedavg", steps=steps_from_module(model), peers=1)

    async def go() -> StreamedRound:
        async with kubo.node() as node, Peer(config, node, KEYS[0], first_backoff_s=0.5) as peer:
            async with StreamedRound(peer, model, 0, len(x), timeout=60) as s:
                loss = nn.functional.cross_entropy(model(x), y)
                await asyncio.to_thread(loss.backward)
            return s

    with coordinator(kubo, config, tmp_path):
        s = asyncio.run(go())
    assert sorted(s.results) == ["0", "2", "4"] and not s.failed and not s.refused
    assert list(s.ready_at) == ["4", "2", "0"] and s.stored_at.keys() == s.applied_at.keys()
    local = grads(_backward(mlp(), x, y))
    assert all(torch.equal(p.grad, local[n]) for n, p in model.named_parameters())
