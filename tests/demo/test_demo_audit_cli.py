"""`gradstore demo` names its coordinator and prints an audit command that works after it
exits; `--method` runs robust rounds, and methods that cannot work are refused (exit 2)."""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass

import pytest

from gradstore.aggregate import METHODS
from gradstore.cli import main
from gradstore.cli._main import build_parser
from gradstore.dag import CID
from gradstore.messages import decode_record, public_key_from_did
from gradstore.node import LocalNode, Node


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def line(self, prefix: str) -> str:
        """The one stdout line that starts with ``prefix``, without it."""
        found = [line for line in self.out.splitlines() if line.startswith(prefix)]
        assert len(found) == 1, (prefix, self.out, self.err)
        return found[0].removeprefix(prefix)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """``cli("demo", ...)`` -> Run, in-process; no GRADSTORE_API*/IPFS_PATH leaks in."""
    for name in ("GRADSTORE_API", "GRADSTORE_API_AUTH", "IPFS_PATH"):
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()

    def run(*argv: object) -> Run:
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def _audit_argv(run: Run) -> tuple[str, list[str]]:
    """The coordinator the demo printed, and its audit command's argv after ``gradstore``."""
    did = run.line("coordinator: ")
    public_key_from_did(did)  # a well-formed did:key
    argv = shlex.split(run.line("audit it: "))
    assert argv[:3] == ["gradstore", "audit", "history"], argv
    assert argv[argv.index("--coordinator") + 1] == did
    return did, argv[1:]


def _head_record(node: Node, head: str):
    async def go():
        try:
            return decode_record(await node.get_block(CID.parse(head)), cid=CID.parse(head))
        finally:
            await node.aclose()

    return asyncio.run(go())


def test_the_printed_command_audits_the_run_on_a_local_node(cli, tmp_path):
    node_dir = tmp_path / "a node dir"  # a space: the command is shell-quoted
    run = cli("demo", "--local", node_dir, "--peers", "2", "--rounds", "2", "--quiet")
    assert run.code == 0, run.err
    did, argv = _audit_argv(run)
    assert argv[-2:] == ["--local", str(node_dir.resolve())]
    audit = cli(*argv)  # the demo, and its node, are gone: only the directory remains
    assert audit.code == 0, audit.err
    lines = audit.out.splitlines()
    assert len(lines) == 3 and all("signed by the expected coordinator" in x for x in lines[:2])
    assert lines[2].endswith(f"2 round(s), 1 down to 0, all by coordinator {did}")


def test_the_printed_command_audits_the_run_on_kubo(cli, kubo):
    run = cli("demo", "--api", kubo.api_url, "--peers", "2", "--rounds", "2", "--quiet")
    assert run.code == 0, run.err
    assert run.line("node: ").startswith("kubo ")
    did, argv = _audit_argv(run)
    assert argv[-2:] == ["--api", kubo.api_url]
    audit = cli(*argv)
    assert audit.code == 0, audit.err
    assert audit.out.splitlines()[-1].endswith(f"2 round(s), 1 down to 0, all by coordinator {did}")


def test_a_node_gone_with_the_demo_gives_no_command_but_says_why(cli, monkeypatch):
    monkeypatch.setenv("GRADSTORE_KUBO", "/nonexistent/ipfs")  # no Kubo: a temporary local node
    run = cli("demo", "--api", "http://127.0.0.1:9", "--peers", "2", "--rounds", "1", "--quiet")
    assert run.code == 0, run.err
    public_key_from_did(run.line("coordinator: "))
    said = run.line("audit it: ")
    assert said.startswith("not after the demo exits (the demo's temporary local node is deleted)")
    assert "--local DIR" in said and "gradstore audit" not in said


@pytest.mark.parametrize(
    ("method", "options", "params"),
    [
        ("median", [], {}),
        ("trimmed_mean", ["--trim-ratio", "0.2"], {"trim_ratio": 0.2}),
        ("krum", ["--byzantine", "1"], {"byzantine": 1}),
        ("multikrum", ["--byzantine", "1", "--select", "2"], {"byzantine": 1, "select": 2}),
    ],
)
def test_a_robust_method_runs_rounds_whose_records_name_it(cli, tmp_path, method, options, params):
    node_dir = tmp_path / "node"
    run = cli(
        "demo", "--local", node_dir, "--peers", "5", "--rounds", "1", "--method", method, *options
    )
    assert run.code == 0, run.err
    assert f"aggregated with {method}" in run.line("job: ")
    _, argv = _audit_argv(run)
    record = _head_record(LocalNode(node_dir), argv[2])
    assert record.method == method and record.params == params and len(record.inputs) == 5
    audit = cli(*argv)
    assert audit.code == 0, audit.err
    assert f"{method} recomputed" in audit.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--method", "krum", "--byzantine", "1", "--peers", "4"],
            "--method krum with --peers 4: krum: ",
        ),
        (["--method", "krum"], "byzantine"),
        (["--method", "multikrum", "--byzantine", "1", "--select", "5", "--peers", "5"], "select"),
        (["--method", "median", "--peers", "2"], "--method median with --peers 2: median: "),
        (["--method", "median", "--trim-ratio", "0.1"], "trim_ratio does not apply to method"),
        (["--method", "trimmed_mean"], "trim_ratio is required"),
        (["--method", "trimmed_mean", "--trim-ratio", "0.5"], "trim_ratio must be in [0, 0.5)"),
        (["--method", "sum"], "sum of the peers' model states is no model"),
    ],
)
def test_a_method_the_demo_cannot_run_is_refused_before_it_starts(cli, tmp_path, argv, message):
    node_dir = tmp_path / "node"
    run = cli("demo", "--local", node_dir, *argv)
    assert (run.code, run.out) == (2, ""), run
    assert run.err.startswith("error: ") and message in run.err and run.err.count("\n") == 1
    assert not node_dir.exists()  # refused before any node was opened


def test_an_unknown_method_is_a_usage_error_listing_the_methods(cli):
    run = cli("demo", "--method", "average")
    assert run.code == 2 and "invalid choice: 'average'" in run.err
    assert all(name in run.err for name in METHODS)


def test_demo_and_job_init_offer_the_aggregators_own_method_list():
    from gradstore.cli._method_args import METHOD_CHOICES

    def method_choices(*words: str) -> object:
        parser = build_parser(words[0])
        for word in words:
            parser = next(a.choices[word] for a in parser._actions if isinstance(a.choices, dict))
        return next(a.choices for a in parser._actions if a.dest == "method")

    assert method_choices("demo") is METHOD_CHOICES
    assert method_choices("job", "init") is METHOD_CHOICES
    assert list(METHOD_CHOICES) == list(METHODS)


def test_sum_is_taken_where_it_makes_sense_and_methods_read_with_their_parameters():
    from gradstore.demo import DemoConfig

    assert DemoConfig(method="sum", mode="data-parallel").method_text == "sum"
    assert DemoConfig(method="sum", compress="int8").method == "sum"
    assert (
        DemoConfig(peers=5, method="multikrum", byzantine=1, select=2).method_text
        == "multikrum (byzantine 1, select 2)"
    )
