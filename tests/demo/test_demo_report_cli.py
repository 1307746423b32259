"""What the demo prints and writes: table, progress, plot, summary JSON; the `demo` subcommand."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
from pathlib import Path

import pytest

from gradstore.cli import _demo_cmd
from gradstore.dag import CID, DAG_CBOR, RAW
from gradstore.demo import (
    DemoConfig,
    DemoProgressBar,
    DemoResult,
    RoundRow,
    format_row,
    open_demo_node,
    summary,
    table_header,
    write_plot,
    write_summary,
)
from gradstore.demo._report import format_bytes

AGG = CID.hash(RAW, b"aggregate")
REC = CID.hash(DAG_CBOR, b"record")


def _result(rounds=2):
    rows = [
        RoundRow(r, 1.5 - r / 10, 0.8 + r / 100, AGG, REC, 20_000, 73_344, 0.25)
        for r in range(rounds)
    ]
    return DemoResult(
        DemoConfig(rounds=max(rounds, 1)), "local node in /x", "digits-1", "did:key:z6Mk", rows
    )


def test_table_row_lines_up_with_the_header():
    row = format_row(_result().rows[1])
    assert row.split() == ["1", "1.4000", "81.00%", str(AGG), "20.0", "kB", "73.3", "kB", "0.25"]
    assert table_header().split()[-3:] == ["inputs", "traffic", "seconds"]
    assert len(row) == len(table_header())


def test_the_readmes_demo_output_has_the_table_and_summary_keys_the_demo_prints():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## The demo\n", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in section.splitlines() if line.startswith("round "))
    assert header == table_header()
    keys = summary(_result()).keys()
    named = re.findall(r"`([a-z_]+)`", section.split("--summary-json PATH", 1)[1][:200])
    assert named and set(named) <= keys, named


def test_format_bytes():
    assert [format_bytes(n) for n in (999, 1536, 2_500_000, 3 * 10**12)] == [
        "999 B",
        "1.5 kB",
        "2.5 MB",
        "3000.0 GB",
    ]


def test_summary_json_has_the_promised_keys(tmp_path):
    path = tmp_path / "s.json"
    write_summary(_result(), path)
    data = json.loads(path.read_text())
    assert data == {
        "mode": "federated",
        "method": "fedavg",
        "rounds": 2,
        "accuracy": 0.81,
        "loss": 1.4,
        "input_bytes": 40_000,  # the documents the peers stored over the run
        "traffic_bytes": 146_688,  # and every document put to or fetched from the node
        "compress": None,
        "steps": None,  # without --steps
        "head_record": str(REC),
        "coordinator": "did:key:z6Mk",
        "node": "local node in /x",
    }
    assert summary(_result(0))["head_record"] is None


def test_plot_is_a_png(tmp_path):
    path = tmp_path / "p.png"
    write_plot(_result(3).rows, path, "title")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_draws_only_on_a_terminal():
    quiet = io.StringIO()
    DemoProgressBar(4, quiet).show(1, "training")
    assert quiet.getvalue() == ""
    tty = _Tty()
    progress = DemoProgressBar(4, tty)
    progress.show(2, "training")
    assert "round 2 (3/4): training" in tty.getvalue() and tty.getvalue().startswith("\r")
    progress.clear()
    assert tty.getvalue().endswith("\r")
    muted = _Tty()
    DemoProgressBar(4, muted, enabled=False).show(0, "x")
    assert muted.getvalue() == ""


def _demo(argv):
    parser = argparse.ArgumentParser(prog="gradstore")
    _demo_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["demo", *argv])
    return args.run(args)


def test_demo_command_on_a_local_node(tmp_path, capsys):
    summary_path, plot = tmp_path / "s.json", tmp_path / "p.png"
    code = _demo(
        [
            "--local",
            str(tmp_path / "node"),
            "--peers",
            "2",
            "--rounds",
            "2",
            "--seed",
            "3",
            "--summary-json",
            str(summary_path),
            "--plot",
            str(plot),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"node: local node in {(tmp_path / 'node').resolve()}"
    assert lines[1].startswith("coordinator: did:key:z6Mk")
    assert lines[2].startswith("job: federated mlp, 2 peers x 719 samples")
    assert lines[2].endswith(", aggregated with fedavg")
    assert lines[3] == table_header()
    assert [line.split()[0] for line in lines[4:6]] == ["0", "1"]
    assert lines[6].startswith("done: held-out accuracy")
    data = json.loads(summary_path.read_text())
    assert data["rounds"] == 2 and data["mode"] == "federated"
    assert data["coordinator"] == lines[1].removeprefix("coordinator: ")
    assert (
        lines[7] == f"audit it: gradstore audit history {data['head_record']} "
        f"--coordinator {lines[1].removeprefix('coordinator: ')} "
        f"--local {(tmp_path / 'node').resolve()}"
    )
    assert plot.exists()


def test_quiet_demo_prints_no_table(tmp_path, capsys):
    code = _demo(
        [
            "--local",
            str(tmp_path),
            "--peers",
            "2",
            "--rounds",
            "1",
            "--quiet",
            "--mode",
            "data-parallel",
            "--model",
            "mlp",
        ]
    )
    out, _ = capsys.readouterr()
    assert code == 0
    assert table_header() not in out and "data-parallel mlp" in out


@pytest.mark.parametrize(
    "argv", [["--peers", "0"], ["--rounds", "x"], ["--lr", "-1"], ["--mode", "async"]]
)
def test_demo_refuses_bad_options(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _demo(argv)
    assert exc.value.code == 2


def test_without_kubo_the_demo_falls_back_to_a_temporary_local_node(monkeypatch):
    monkeypatch.setenv("GRADSTORE_KUBO", "/nonexistent/ipfs")  # find_kubo_binary() -> None

    async def go():
        async with open_demo_node(api="http://127.0.0.1:9") as dn:
            assert dn.reach is None and dn.gone == "the demo's temporary local node is deleted"
            return dn.description, dn.node.path

    description, path = asyncio.run(go())
    assert description.startswith(f"local node in {path} (no Kubo answered at http://127.0.0.1:9")
    assert not path.exists()  # removed at the end


def test_a_kubo_that_answers_is_used_as_is(kubo):
    async def go():
        async with open_demo_node(api=kubo.api_url) as dn:
            return dn.description, dn.reach

    description, reach = asyncio.run(go())
    assert description.startswith("kubo 0.") and description.endswith(f"at {kubo.api_url}")
    assert reach == f"--api {kubo.api_url}"


def test_the_demo_starts_its_own_kubo_when_none_answers(kubo_binary, monkeypatch):
    monkeypatch.setenv("GRADSTORE_KUBO", str(kubo_binary))

    async def go():
        async with open_demo_node(api="http://127.0.0.1:9") as dn:
            return dn.description, await dn.node.identity(), dn.reach, dn.gone

    description, identity, reach, gone = asyncio.run(go())
    assert "(started by the demo; nothing answered at http://127.0.0.1:9)" in description
    assert identity.peer_id
    # its repo goes with it: no audit command, and the reason for the demo's last line
    assert reach is None and gone == "the Kubo the demo started is stopped and its repo deleted"
