"""`gradstore demo --steps` (issue 19 part 8): each round is two steps, the head (output
layer) trained and sent by half the peers and the body by all; a line per step as it
closes, then the round's line; round/5 records whose every step the printed command audits."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from pathlib import Path

import dag_cbor
import numpy as np
import pytest

from gradstore.cli import main
from gradstore.dag import CID
from gradstore.demo import (
    DemoConfig,
    DemoResult,
    StepRow,
    digits_split,
    local_sgd,
    make_model,
    plan_steps,
    run_demo,
)
from gradstore.messages import (
    SigningKey,
    SteppedRoundRecord,
    StepRecord,
    decode_step_record,
    decode_stepped_record,
)
from gradstore.node import KuboDaemon, LocalNode, Node
from gradstore.store import GradientStore

SEED = 3
STEP_LINE = re.compile(
    r"^ +(\d+)  step (head|body) closed at (\d+\.\d\d)s: peers ([\d ]+), aggregate (\S+)$"
)
ROUND_LINE = re.compile(r"^ +(\d+) +\d+\.\d{4} +\d+\.\d\d% +(\S+) ")


def _cli(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _events(out: str) -> list[tuple[str, int, str]]:
    """The table's lines in order: ("step", round, name) or ("round", round, "")."""
    events = []
    for line in out.splitlines():
        if m := STEP_LINE.match(line):
            events.append(("step", int(m[1]), m[2]))
        elif m := ROUND_LINE.match(line):
            events.append(("round", int(m[1]), ""))
    return events


Round = tuple[str, SteppedRoundRecord, list[StepRecord]]


def _records(node: Node, head: str) -> list[Round]:
    """Every round of the chain from ``head``: its dag-cbor ``type``, its decoded round/5
    record and its decoded step records, newest first."""

    async def go() -> list[Round]:
        out: list[Round] = []
        cid: CID | None = CID.parse(head)
        try:
            while cid is not None:
                block = await node.get_block(cid)
                record = decode_stepped_record(block, cid=cid)
                steps = []
                for s in record.steps:
                    assert s.record is not None
                    raw = await node.get_block(s.record)
                    steps.append(decode_step_record(raw, cid=s.record))
                doc = dag_cbor.decode(block)
                assert isinstance(doc, dict)
                out.append((str(doc["type"]), record, steps))
                cid = record.prev
        finally:
            await node.aclose()
        return out

    return asyncio.run(go())


def _check_run(out: str, rounds: int, node: Node) -> tuple[str, list[str]]:
    """The steps close one by one, head then body, on lines of their own before their round's
    line; every record is round/5 with a head of peers 1-2 and a body of all four. Returns the
    coordinator's did and the printed audit command's argv after ``gradstore``."""
    lines = out.splitlines()
    assert (
        "steps: head = fc2.* by peers 1 2; body = fc1.* by peers 1 2 3 4 (each closes on its own)"
        in lines
    )
    # each round: a line per step as it closes (steps due together close concurrently, so
    # in either order), then the round's line
    events = _events(out)
    assert len(events) == 3 * rounds, out
    for r in range(rounds):
        mine = events[3 * r : 3 * r + 3]
        assert sorted(mine[:2]) == [("step", r, "body"), ("step", r, "head")], out
        assert mine[2] == ("round", r, ""), out
    steps = [m for line in lines if (m := STEP_LINE.match(line))]
    assert all(m[4] == {"head": "1 2", "body": "1 2 3 4"}[m[2]] for m in steps), out
    did = next(x for x in lines if x.startswith("coordinator: ")).removeprefix("coordinator: ")
    argv = shlex.split(
        next(x for x in lines if x.startswith("audit it: ")).removeprefix("audit it: ")
    )
    assert argv[:3] == ["gradstore", "audit", "history"] and did in argv
    chain = _records(node, argv[3])
    assert len(chain) == rounds
    rows = [m for line in lines if (m := ROUND_LINE.match(line))]
    by_round = {int(m[1]): m[2] for m in rows}
    printed = {(int(m[1]), m[2]): m[5] for m in steps}
    for kind, record, step_records in chain:
        assert kind == "gradstore/round/5"
        assert str(record.output) == by_round[record.round]  # the round line: the model output
        assert [s.step for s in record.steps] == ["head", "body"]
        assert [len(s.inputs) for s in step_records] == [2, 4]
        for s in record.steps:
            assert str(s.output) == printed[(record.round, s.step)]
    return did, argv[1:]


def test_demo_steps_on_a_local_node_closes_each_step_on_its_own_and_audits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    node_dir = tmp_path / "node"
    code, out, err = _cli(
        capsys, "demo", "--local", node_dir, "--steps", "--rounds", "2", "--seed", SEED
    )
    assert code == 0, err
    did, argv = _check_run(out, 2, LocalNode(node_dir))
    code, audit, err = _cli(capsys, *argv)
    assert code == 0, err
    assert audit.count(" (gradstore/round/5) signed by the expected coordinator, 2 step(s)") == 2
    assert (
        len(re.findall(r"^ok step head of round \d of job .* 2 inputs re-fetched", audit, re.M))
        == 2
    )
    assert (
        len(re.findall(r"^ok step body of round \d of job .* 4 inputs re-fetched", audit, re.M))
        == 2
    )
    assert audit.splitlines()[-1].endswith(f"2 round(s), 1 down to 0, all by coordinator {did}")


def test_demo_steps_on_kubo_prints_each_step_as_it_closes(
    capsys: pytest.CaptureFixture[str], kubo: KuboDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_PATH"):
        monkeypatch.delenv(name, raising=False)
    api = kubo.api_url
    code, out, err = _cli(capsys, "demo", "--api", api, "--steps", "--rounds", "2")
    assert code == 0, err
    assert next(x for x in out.splitlines() if x.startswith("node: ")).startswith("node: kubo ")
    did, argv = _check_run(out, 2, kubo.node())
    assert argv[-2:] == ["--api", api]
    code, audit, err = _cli(capsys, *argv)
    assert code == 0, err
    assert audit.splitlines()[-1].endswith(f"2 round(s), 1 down to 0, all by coordinator {did}")


def test_only_the_heads_peers_send_the_head_and_each_step_is_reported_once_as_it_closes(
    tmp_path: Path,
) -> None:
    node = LocalNode(tmp_path / "node")
    config = DemoConfig(peers=4, rounds=2, seed=SEED, steps=True)
    key = SigningKey.generate()
    seen: list[StepRow] = []

    async def go() -> tuple[DemoResult, list[set[str]], list[int]]:
        data = digits_split(4, SEED)
        result = await run_demo(config, node, data, coordinator_key=key, on_step=seen.append)
        store, sent, traffic = GradientStore(node), list[set[str]](), []
        for row in result.rows:
            block = await node.get_block(row.record)
            record = decode_stepped_record(block, cid=row.record)
            inputs, aggregates = 0, 0
            for s in record.steps:
                assert s.record is not None and s.output is not None
                step = decode_step_record(await node.get_block(s.record), cid=s.record)
                aggregates += len(await store.fetch_document(s.output))
                for i in step.inputs:
                    inputs += len(await store.fetch_document(i.gradient))
                    doc = await store.get(i.gradient)
                    assert doc.meta["step"] == s.step and doc.meta["peer"] == i.peer
                    if row is result.rows[-1]:
                        sent.append(set(doc.tensors))
            model = len(await store.fetch_document(record.output))
            assert row.input_bytes == inputs
            # inputs put and fetched once, each step's aggregate put once and fetched by all
            # 4 peers, the model-level output put once and fetched by the first peer
            traffic.append(2 * inputs + 5 * aggregates + 2 * model)
        return result, sent, traffic

    result, sent, traffic = asyncio.run(go())
    assert [row.traffic_bytes for row in result.rows] == traffic
    assert sent == [{"fc2.weight", "fc2.bias"}] * 2 + [{"fc1.weight", "fc1.bias"}] * 4
    assert [s.name for s in result.steps] == ["head", "body"]
    rows = result.rows
    assert sorted((s.round, s.step, s.peers) for s in seen) == [
        (r, step, peers)
        for r in (0, 1)
        for step, peers in (("body", (1, 2, 3, 4)), ("head", (1, 2)))
    ]  # each step once a round, in the order the steps closed
    assert [s for row in rows for s in row.steps] == seen


def test_the_head_learns_from_its_two_peers() -> None:
    """The accuracy the stepped demo reaches in 8 rounds is close to the plain one's."""

    async def go(steps: bool) -> float:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            config = DemoConfig(peers=4, rounds=8, seed=SEED, steps=steps)
            result = await run_demo(config, LocalNode(tmp), digits_split(4, SEED))
            return result.rows[-1].accuracy

    plain, stepped = asyncio.run(go(False)), asyncio.run(go(True))
    assert stepped >= 0.85 and stepped >= plain - 0.03, (plain, stepped)


def test_a_body_peer_does_not_move_the_head_in_local_training() -> None:
    data = digits_split(2, SEED)
    model = make_model("mlp", data.n_features, data.n_classes)
    params = model.init(np.random.default_rng(SEED))
    trained = local_sgd(
        model,
        params,
        data.shards[0],
        epochs=1,
        batch_size=32,
        lr=0.1,
        rng=np.random.default_rng(0),
        train={"fc1.weight", "fc1.bias"},
    )
    for name in ("fc2.weight", "fc2.bias"):
        np.testing.assert_array_equal(trained[name], params[name])
    assert not np.array_equal(trained["fc1.weight"], params["fc1.weight"])


def test_the_steps_follow_the_models_layers_and_the_peers() -> None:
    data = digits_split(5, SEED)
    head, body = plan_steps(DemoConfig(peers=5, steps=True), data)
    assert (head.name, head.selectors, head.peers) == ("head", ["fc2.*"], (0, 1))
    assert (body.name, body.selectors, body.peers) == ("body", ["fc1.*"], (0, 1, 2, 3, 4))
    assert plan_steps(DemoConfig(peers=5), data) == ()
    (head,) = plan_steps(DemoConfig(peers=1, steps=True), digits_split(1, SEED))[:1]
    assert head.peers == (0,)


def test_summary_json_names_the_steps(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    code, _, err = _cli(
        capsys, "demo", "--local", tmp_path / "node", "--steps", "--peers", "2", "--rounds", "1",
        "--quiet", "--summary-json", path,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(path.read_text())["steps"] == [
        {"name": "head", "tensors": ["fc2.*"], "peers": [1]},
        {"name": "body", "tensors": ["fc1.*"], "peers": [1, 2]},
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "softmax"], "softmax has one layer"),
        (
            ["--method", "median"],
            "--method median with --steps: the head step has 2 of the 4 peers",
        ),
    ],
)
def test_steps_the_demo_cannot_run_are_refused_before_it_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    node_dir = tmp_path / "node"
    code, out, err = _cli(capsys, "demo", "--local", node_dir, "--steps", *argv)
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and message in err
    assert not node_dir.exists()


def test_demo_help_documents_steps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _cli(capsys, "demo", "--help")
    assert code == 0
    assert "--steps" in out and "gradstore demo --local demo-node --steps " in out
