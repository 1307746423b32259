#!/usr/bin/env python3
"""Train a small PyTorch CNN on the 8x8 digits across peers, each a TorchPeer, on a real Kubo.

Everything a job needs is made here, in a temporary directory: the keys and the job file
(``gradstore keygen``, ``gradstore job init``), a coordinator (``gradstore coordinator``, its
own process) and N peers (threads of this process, each with its own ``TorchPeer``). Each
round every peer trains its shard of scikit-learn's digits for a few local epochs and
exchanges its model delta (``sync_delta``: fedavg, weighted by samples); every peer then
holds the same model, whose held-out accuracy is printed with the round's record CID.
Rounds are numbered as the job numbers them, 0 to N-1, each used once. The last line is
the ``gradstore audit history`` command that re-derives every round.

Kubo: the one ``gradstore.node.connect`` finds (``--api``, else $GRADSTORE_API, else
$IPFS_PATH/api, else 127.0.0.1:5001) when it answers, else one started here from
``scripts/install-kubo.sh``'s build (stopped at the end: the audit then runs here).
Needs the extras ``torch`` and ``demo``: ``pip install -e '.[torch,demo]'`` (a CPU-only
PyTorch first, to skip the CUDA wheels: docs/frameworks.md, "Install").

    python examples/torch/run.py [--peers 3] [--rounds 8] [--local-epochs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:
    import torch
    from sklearn.datasets import load_digits
except ImportError as exc:
    raise SystemExit(
        f"error: this example needs {exc.name}: install the optional extras 'torch' and 'demo' "
        "(pip install 'gradstore[torch,demo]'; a CPU-only PyTorch: docs/frameworks.md)"
    ) from None

from gradstore.cli import main as gradstore
from gradstore.errors import NodeError
from gradstore.node import RunningKubo, running_kubo
from gradstore.torch import TorchPeer, snapshot

HELD_OUT = 0.2  # of the 1,797 digits, scored after every round and never trained on


class DigitsCNN(torch.nn.Module):
    """conv 3x3 (1 -> 8 channels) -> ReLU -> 2x2 max-pool -> linear to 10 classes: 1,370 weights."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv(x.view(-1, 1, 8, 8))), 2)
        return self.fc(h.flatten(1))


Shard = tuple[torch.Tensor, torch.Tensor]


def digits(peers: int, seed: int) -> tuple[list[Shard], torch.Tensor, torch.Tensor]:
    """Each peer's shard (x, y), and the held-out x, y: pixels scaled to [0, 1]."""
    x_all, y_all = load_digits(return_X_y=True)
    x = torch.tensor(x_all / 16.0, dtype=torch.float32)
    y = torch.tensor(y_all, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    n_test = round(len(y) * HELD_OUT)
    shards = [(x[n_test + i :: peers], y[n_test + i :: peers]) for i in range(peers)]
    return shards, x[:n_test], y[:n_test]


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train_locally(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
    epochs: int, batch: int, generator: torch.Generator,
) -> None:  # fmt: skip
    """``epochs`` passes of minibatch SGD over this peer's shard."""
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=generator).split(batch):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()


def peer_loop(
    index: int, job: Path, key: Path, api: str, args: argparse.Namespace, initial: DigitsCNN,
    shard: Shard, on_round: Callable[[int, torch.nn.Module, Any], None],
) -> tuple[str, torch.nn.Module]:  # fmt: skip
    """One peer: its copy of the job's initial model, its own shard, ``args.rounds`` rounds.

    Returns the last round's record CID and the model."""
    model = copy.deepcopy(initial)  # every peer starts from the same model
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    generator = torch.Generator().manual_seed(args.seed * 1000 + index)  # this peer's batches
    x, y = shard
    record = ""
    with TorchPeer(job, key, api=api, timeout=args.timeout) as peer:
        for round_ in range(args.rounds):  # the job's rounds: 0, 1, ..., each used once
            base = snapshot(model)
            train_locally(model, optimizer, x, y, args.local_epochs, args.batch, generator)
            result = peer.sync_delta(model, base, round_, num_samples=len(y))  # base + mean delta
            record = str(result.record)
            if index == 0:
                on_round(round_, model, result)
    return record, model


@contextlib.contextmanager
def kubo(api: str | None) -> Iterator[RunningKubo]:
    """The Kubo ``gradstore.node.running_kubo`` finds or starts, or exit with why not."""
    with contextlib.ExitStack() as stack:
        try:
            found = stack.enter_context(running_kubo(api))
        except ValueError as exc:  # --api names no URL or multiaddr
            raise SystemExit(f"error: --api: {exc}") from None
        except NodeError as exc:  # nothing answers and none installed; no pubsub
            raise SystemExit(f"error: {exc}") from None
        print(f"node: {found.description}", flush=True)
        yield found


def run_gradstore(*argv: str) -> str:
    """``gradstore ARGV`` in this process; its stdout (an error exits with its message)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gradstore(list(argv))
    if code != 0:
        raise SystemExit(f"gradstore {' '.join(argv)} failed:\n{err.getvalue()}")
    return out.getvalue()


def make_job(work: Path, peers: int, rounds: int) -> tuple[Path, Path, list[Path]]:
    """Keys for a coordinator and the peers, and a fedavg job naming them: (job, coord, peers)."""
    coord = work / "coord.key"
    keys = [work / f"peer{i}.key" for i in range(peers)]
    for path in (coord, *keys):
        run_gradstore("keygen", "--out", str(path))
    job = work / "job.toml"
    run_gradstore(
        "job", "init", "--name", f"torch-digits-{secrets.token_hex(4)}", "--out", str(job),
        "--coordinator", str(coord), *(a for k in keys for a in ("--peer", str(k))),
        "--method", "fedavg", "--rounds", str(rounds), "--deadline", "120",
    )  # fmt: skip
    return job, coord, keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=3, choices=range(2, 9), metavar="2..8")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--api",
        help="Kubo RPC URL (default: $GRADSTORE_API, else $IPFS_PATH/api, else 127.0.0.1:5001)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per publish or wait")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the peers share the machine's cores

    shards, x_test, y_test = digits(args.peers, args.seed)
    torch.manual_seed(args.seed)
    initial = DigitsCNN()
    work = Path(tempfile.mkdtemp(prefix="gradstore-torch-"))
    ok = False
    try:
        with kubo(args.api) as found:
            api = found.api
            job, coord, keys = make_job(work, args.peers, args.rounds)
            print(
                f"job: {args.peers} peers x ~{len(shards[0][1])} digits, {len(y_test)} held out, "
                f"{args.rounds} rounds of {args.local_epochs} local epochs, fedavg of the deltas",
                flush=True,
            )
            log = open(work / "coordinator.log", "wb")  # noqa: SIM115  (closed below)
            coordinator = subprocess.Popen(
                [sys.executable, "-m", "gradstore", "coordinator", "--config", str(job),
                 "--key", str(coord), "--api", api, "--state", str(work / "state")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            log.close()
            lock = threading.Lock()

            def on_round(round_: int, model: torch.nn.Module, result: Any) -> None:
                with lock:
                    print(
                        f"round {round_}: held-out accuracy {accuracy(model, x_test, y_test):.2%}, "
                        f"{len(result.peers)} peers, record {result.record}",
                        flush=True,
                    )

            try:
                with ThreadPoolExecutor(args.peers) as pool:
                    runs = [
                        pool.submit(peer_loop, i, job, key, api, args, initial, shards[i], on_round)
                        for i, key in enumerate(keys)
                    ]
                    ends = [run.result() for run in runs]
                if coordinator.wait(timeout=60) != 0:
                    raise SystemExit(
                        f"error: the coordinator failed: see {work / 'coordinator.log'}"
                    )
            finally:
                if coordinator.poll() is None:
                    coordinator.terminate()
                    coordinator.wait()
            (record,) = {r for r, _ in ends}  # every peer ends on the same record
            models = [m.state_dict() for _, m in ends]
            if any(not torch.equal(m[k], models[0][k]) for m in models for k in m):
                raise SystemExit("error: the peers ended with different models")
            print(f"every peer holds the same model; last record {record}", flush=True)
            audit = f"gradstore audit history {record} --api {api}"
            if found.started:  # this Kubo stops with the example: audit while it runs
                print(f"audit (the Kubo started here stops next): {audit}", flush=True)
                print(run_gradstore(*audit.split()[1:]).splitlines()[-1], flush=True)
            else:
                print(f"audit: {audit}", flush=True)
            ok = True
    finally:
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"the job's files and the coordinator's log: {work}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
