"""A limit refusal says which option raises the limit, from the error's ``limit`` field; a
command builds its limits once."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gradstore.cli import _documents
from gradstore.cli._documents import DocumentOptions
from gradstore.errors import LimitExceededError
from gradstore.format import Limits

from .conftest import Cli

_documents_command_limits = _documents.command_limits


def test_the_max_bytes_hint_follows_the_limit_field_not_the_words() -> None:
    options = DocumentOptions.parse(argparse.Namespace(max_bytes=1000))
    with pytest.raises(LimitExceededError) as raised, options.named_limits("put x"):
        raise LimitExceededError("a block of 2000 bytes is too big", "max_bytes")
    assert str(raised.value) == (
        "put x: a block of 2000 bytes is too big (the limit is --max-bytes 1000; "
        "pass a larger --max-bytes N to allow it)"
    )
    assert raised.value.limit == "max_bytes"
    with pytest.raises(LimitExceededError) as raised, options.named_limits("put x"):
        raise LimitExceededError("rank 40 (max_bytes is not what refused it)", "max_rank")
    assert str(raised.value).endswith(
        "(a limit every reader applies by default, which no option raises)"
    )
    assert raised.value.limit == "max_rank"


@pytest.mark.parametrize("refused", [False, True], ids=["stored", "refused"])
def test_put_and_get_build_their_limits_once(
    cli: Cli, grad_npz: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """A command parses its options once and hands them on: the limits it checks a document
    against, stores with and names in a refusal are one ``Limits``."""
    built: list[Limits] = []

    def counted(args: argparse.Namespace) -> Limits:
        built.append(_documents_command_limits(args))
        return built[-1]

    monkeypatch.setattr(_documents, "command_limits", counted)
    node = tmp_path / "node"
    max_bytes = ["--max-bytes", "100"] if refused else []
    r = cli("put", grad_npz, "--local", node, *max_bytes)
    assert (r.code == 1 and "--max-bytes 100" in r.err) if refused else r.code == 0, r.err
    assert len(built) == 1
    if not refused:
        built.clear()
        assert cli("get", r.line, "-o", tmp_path / "back.npz", "--local", node).code == 0
        assert len(built) == 1
