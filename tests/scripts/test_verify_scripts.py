"""``gradstore audit cid|round|history`` (and the scripts/verify_*.py wrappers) on real demo
output, and on forged records."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import dag_cbor
import pytest

from gradstore.cli import main as gradstore_main
from gradstore.dag import CID, DAG_CBOR
from gradstore.demo import DemoConfig, digits_split, run_demo
from gradstore.messages import SigningKey, decode_record, encode_record
from gradstore.node import LocalNode

ROOT = Path(__file__).resolve().parents[2]
SEED = 11


@dataclasses.dataclass
class Demo:
    path: Path
    key: SigningKey
    rows: list

    @property
    def args(self):
        return ["--local", str(self.path)]

    def node(self):
        return LocalNode(self.path)

    def record(self, i):
        async def get():
            cid = self.rows[i].record
            return decode_record(await self.node().get_block(cid), cid=cid)

        return asyncio.run(get())

    def put_record(self, record, key=None):
        _cid, data = encode_record(record, key or self.key)
        return self.put_raw(data)

    def put_raw(self, data):
        return asyncio.run(self.node().put_block(data, DAG_CBOR))


def _run_demo(node, key, rounds=3):
    config = DemoConfig(peers=3, rounds=rounds, mode="data-parallel", seed=SEED)
    return asyncio.run(run_demo(config, node, digits_split(3, SEED), coordinator_key=key)).rows


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tmp_path_factory.mktemp("verify") / "node"
    key = SigningKey.generate()
    return Demo(path, key, _run_demo(LocalNode(path), key))


def _audit(kind):
    """``gradstore audit KIND`` as a function of argv, in-process."""
    return lambda argv: gradstore_main(["audit", kind, *map(str, argv)])


verify_cid_main, verify_round_main, verify_history_main = map(_audit, ("cid", "round", "history"))


def _check(main, argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_cid_accepts_every_input_and_aggregate(demo, capsys):
    record = demo.record(0)
    for cid in [record.output, *(i.gradient for i in record.inputs)]:
        code, out, err = _check(verify_cid_main, [str(cid), *demo.args], capsys)
        assert code == 0, err
        assert out.startswith(f"ok {cid}: ") and "canonical gradstore/1" in out


def test_verify_round_and_history_accept_the_demo(demo, capsys):
    code, out, err = _check(verify_round_main, [str(demo.rows[1].record), *demo.args], capsys)
    assert code == 0, err
    assert out.startswith("ok round 1 of job digits-") and "3 inputs" in out
    code, out, err = _check(verify_history_main, [str(demo.rows[-1].record), *demo.args], capsys)
    assert code == 0, err
    assert [line.split()[2] for line in out.splitlines()[:3]] == ["2", "1", "0"]
    assert "3 round(s), 2 down to 0" in out.splitlines()[-1]


def test_a_record_whose_output_was_swapped_fails_output_cid(demo, capsys):
    honest = demo.record(2)
    other = demo.record(1).output  # a real aggregate, just not this round's
    forged = demo.put_record(dataclasses.replace(honest, output=other))  # validly re-signed
    code, out, err = _check(verify_round_main, [str(forged), *demo.args], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: check output-cid failed: round 2 record")
    code, _, err = _check(verify_history_main, [str(forged), *demo.args], capsys)
    assert code == 1 and "check output-cid failed" in err


def test_a_record_with_another_inputs_sample_count_fails_input_signature(demo, capsys):
    honest = demo.record(0)
    first = dataclasses.replace(honest.inputs[0], num_samples=honest.inputs[0].num_samples * 2)
    forged = demo.put_record(dataclasses.replace(honest, inputs=(first, *honest.inputs[1:])))
    code, _, err = _check(verify_round_main, [str(forged), *demo.args], capsys)
    assert code == 1 and "check input-signature failed" in err


def test_a_record_not_signed_by_its_coordinator_fails_record_signature(demo, capsys):
    node = dag_cbor.decode(asyncio.run(demo.node().get_block(demo.rows[0].record)))
    node["sig"] = bytes(64)
    forged = demo.put_raw(dag_cbor.encode(node))
    code, _, err = _check(verify_round_main, [str(forged), *demo.args], capsys)
    assert code == 1 and err.startswith("error: check record-signature failed")


def test_a_record_whose_input_is_missing_fails_input_fetch(demo, capsys):
    honest = demo.record(0)
    missing = CID.hash(0x55, b"never stored, seed %d" % SEED)
    # as a round/2 record (no peers' signatures, which would fail first: input-signature)
    inputs = [dataclasses.replace(i, sent_at=None, peer_sig=None) for i in honest.inputs]
    inputs[0] = dataclasses.replace(inputs[0], gradient=missing)
    forged = demo.put_record(dataclasses.replace(honest, inputs=tuple(inputs)))
    code, _, err = _check(verify_round_main, [str(forged), *demo.args], capsys)
    assert code == 1 and "check input-fetch failed" in err and str(missing) in err


def test_history_refuses_a_skipped_round_unless_gaps_are_allowed(demo, capsys):
    head = demo.record(2)
    skipping = demo.put_record(dataclasses.replace(head, prev=demo.rows[0].record))
    code, _, err = _check(verify_history_main, [str(skipping), *demo.args], capsys)
    assert code == 1 and "check round-sequence failed" in err and "expected round 1" in err
    code, _out, err = _check(
        verify_history_main, [str(skipping), *demo.args, "--allow-gaps"], capsys
    )
    assert code == 0, err


def test_history_refuses_a_chain_that_changes_coordinator(demo, capsys):
    intruder = SigningKey.generate()
    head = demo.record(2)  # its prev is the honest round 1
    foreign = demo.put_record(dataclasses.replace(head, coordinator=intruder.did), intruder)
    code, _, err = _check(verify_round_main, [str(foreign), *demo.args], capsys)
    assert code == 0, err  # on its own, a correct round signed by whoever claims it
    code, _, err = _check(verify_history_main, [str(foreign), *demo.args], capsys)
    assert code == 1 and "check coordinator failed" in err and intruder.did in err


def test_a_pinned_coordinator_refuses_a_record_signed_by_another_key(demo, capsys, tmp_path):
    intruder = SigningKey.generate()
    honest = demo.record(1)
    # a correct round, re-signed by a key that names itself: signature and output both hold
    foreign = demo.put_record(dataclasses.replace(honest, coordinator=intruder.did), intruder)
    pin = ["--coordinator", demo.key.did]
    code, out, err = _check(verify_round_main, [str(foreign), *demo.args], capsys)
    assert code == 0 and "not pinned" in out, err
    code, out, err = _check(verify_round_main, [str(foreign), *demo.args, *pin], capsys)
    assert code == 1 and out == ""
    assert err.startswith("error: check expected-coordinator failed: round record ")
    assert f"is signed by {intruder.did}, not by the expected coordinator {demo.key.did}" in err
    code, _, err = _check(verify_history_main, [str(foreign), *demo.args, *pin], capsys)
    assert code == 1 and "check expected-coordinator failed" in err
    # the honest record passes the same pin
    code, out, err = _check(verify_round_main, [str(demo.rows[1].record), *demo.args, *pin], capsys)
    assert code == 0 and "signed by the expected coordinator" in out, err
    # --config pins the job file's coordinator, and its job name
    job = tmp_path / "job.toml"
    job.write_text(
        f'job = "{honest.job}"\ncoordinator = "{demo.key.did}"\npeers = ["{intruder.did}"]\n'
    )
    code, _, err = _check(verify_round_main, [str(foreign), *demo.args, "--config", job], capsys)
    assert code == 1 and "check expected-coordinator failed" in err
    renamed = demo.put_record(dataclasses.replace(honest, job="another-job"))
    code, _, err = _check(verify_round_main, [str(renamed), *demo.args, "--config", job], capsys)
    assert code == 1 and "check expected-job failed" in err and "'another-job'" in err
    code, _, err = _check(
        verify_history_main, [str(demo.rows[-1].record), *demo.args, "--config", job], capsys
    )
    assert code == 0, err
    code, _, err = _check(
        verify_round_main, [str(foreign), *demo.args, "--coordinator", "x"], capsys
    )
    assert code == 2 and "--coordinator" in err


def test_a_job_name_with_terminal_escapes_is_refused_and_never_printed(demo, capsys):
    """A signer may write any bytes: a record whose job name holds terminal escapes is not a
    valid record (job names are those a job file allows), and nothing echoes it raw."""
    import dag_cbor

    _cid, data = encode_record(demo.record(0), demo.key)
    node = dag_cbor.decode(data)
    del node["sig"]
    node["job"] = "\x1b]0;owned\x07\x1b[2J"
    node["sig"] = demo.key.sign(dag_cbor.encode(node))
    forged = demo.put_raw(dag_cbor.encode(node))
    code, out, err = _check(verify_round_main, [str(forged), *demo.args], capsys)
    assert code == 1 and "check record-format failed" in err
    assert "\x1b" not in out + err and "\x07" not in out + err


def test_history_refuses_a_chain_that_changes_job(demo, capsys):
    round0 = demo.record(0)
    other_job = demo.put_record(dataclasses.replace(round0, job="another-job"))
    round1 = demo.record(1)
    stitched = demo.put_record(dataclasses.replace(round1, prev=other_job))
    code, _, err = _check(verify_history_main, [str(stitched), *demo.args], capsys)
    assert code == 1 and "check job failed" in err


class _TamperingNode(LocalNode):
    """Serves every CAR stream with its last byte flipped (the end of the last block's data)."""

    async def export_car(self, root):
        pieces = [bytes(p) async for p in super().export_car(root)]
        last = bytearray(pieces[-1])
        last[-1] ^= 1
        for piece in [*pieces[:-1], bytes(last)]:
            yield piece

    async def get_block(self, cid):
        data = bytearray(await super().get_block(cid))
        data[-1] ^= 1
        return bytes(data)


def test_a_node_serving_wrong_bytes_fails_the_hash_checks(demo):
    from gradstore.audit import fetch_record, verify_cid
    from gradstore.errors import AuditError
    from gradstore.store import GradientStore

    node = _TamperingNode(demo.path)

    async def go(work):
        with pytest.raises(AuditError) as exc:
            await work
        return exc.value.check

    assert asyncio.run(go(verify_cid(GradientStore(node), demo.rows[0].aggregate))) == "blocks"
    assert asyncio.run(go(fetch_record(node, demo.rows[0].record))) == "record-hash"


def test_bad_arguments(demo, capsys):
    code, _, err = _check(verify_round_main, ["not-a-cid", *demo.args], capsys)
    assert code == 1 and "check record-cid failed" in err
    code, _, err = _check(verify_round_main, [str(demo.rows[0].aggregate), *demo.args], capsys)
    assert code == 1 and "check record-cid failed" in err and "dag-cbor" in err
    code, _, err = _check(verify_cid_main, [str(CID.hash(0x55, b"absent")), *demo.args], capsys)
    assert code == 1 and "check fetch failed" in err


def _script(name, *args, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_scripts_run_as_programs(demo):
    head = str(demo.rows[-1].record)
    done = _script("verify_history", head, *demo.args)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("ok history of job digits-")
    forged = demo.put_record(dataclasses.replace(demo.record(2), output=demo.rows[0].aggregate))
    done = _script("verify_round", str(forged), *demo.args)
    assert done.returncode == 1 and "check output-cid failed" in done.stderr


def test_scripts_verify_a_demo_run_on_kubo(kubo):
    key = SigningKey.generate()

    async def go():
        node = kubo.node()
        try:
            config = DemoConfig(peers=2, rounds=2, mode="federated", seed=SEED)
            result = await run_demo(config, node, digits_split(2, SEED), coordinator_key=key)
            rows = result.rows
            honest = decode_record(await node.get_block(rows[1].record), cid=rows[1].record)
            cid, data = encode_record(dataclasses.replace(honest, output=rows[0].aggregate), key)
            await node.put_block(data, DAG_CBOR)
            return rows, cid
        finally:
            await node.aclose()

    rows, forged = asyncio.run(go())
    env = {**os.environ, "GRADSTORE_API": kubo.api_url}
    for name, target in [
        ("verify_cid", rows[1].aggregate),
        ("verify_round", rows[1].record),
        ("verify_history", rows[1].record),
    ]:
        done = _script(name, str(target), "--api", kubo.api_url)
        assert done.returncode == 0, (name, done.stderr)
    done = _script("verify_history", str(forged), env=env)  # the API from the environment
    assert done.returncode == 1 and "check output-cid failed" in done.stderr


def test_history_refuses_a_chain_stitched_from_two_runs(demo, capsys):
    # the same job and coordinator, restarted on a new state folder: a new run, which
    # starts its own chain; linking it under the old one is refused
    round0 = demo.record(0)
    other_run = demo.put_record(dataclasses.replace(round0, run="another0run000000000000000"))
    round1 = demo.record(1)
    stitched = demo.put_record(dataclasses.replace(round1, prev=other_run))
    code, _, err = _check(verify_history_main, [str(stitched), *demo.args], capsys)
    assert code == 1 and "check run failed" in err
