"""``--help`` that helps: the commands in groups, every option explained, every command with
examples that are real command lines (issue 24, item 5)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator

import pytest

from gradstore.cli._help import EXAMPLES_TITLE, GROUPS
from gradstore.cli._main import build_parser


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("gradstore",)
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """``("gradstore audit round", its parser)`` for the whole tree, top first."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def test_the_walk_sees_every_command() -> None:
    assert len(COMMANDS) >= 21  # 15 commands, their 6 actions (audit x3, peer x2, ...), the top
    assert {"gradstore audit round", "gradstore peer publish", "gradstore job init"} <= set(
        COMMANDS
    )


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_and_subcommand_says_what_it_is(name: str) -> None:
    missing = []
    for action in COMMANDS[name]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        what = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._SubParsersAction):
            missing += [c.dest for c in action._choices_actions if not c.help]
            if name == "gradstore":  # listed by group instead (test below)
                assert action.help == argparse.SUPPRESS
                continue
            if action.help is None:  # argparse titles it by its metavar, the list follows
                continue
        if action.help == argparse.SUPPRESS:
            # --debug after the command: hidden, documented once by `gradstore --help`
            assert action.option_strings == ["--debug"] and name != "gradstore", what
            continue
        if not (isinstance(action.help, str) and action.help.strip()):
            missing.append(what)
    assert not missing, f"{name}: no help for {missing}"


def _examples(help_text: str) -> list[str]:
    """The example command lines ending a help text (continued lines joined)."""
    section = help_text.split(f"\n{EXAMPLES_TITLE}\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in section.replace("\\\n", " ").splitlines() if line.strip()]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_ends_with_examples_that_parse(name: str) -> None:
    """Like ``ipfs add --help``: every command's help ends with how it is typed, and every
    example is a command line gradstore accepts, for that very command."""
    text = COMMANDS[name].format_help()
    assert f"\n{EXAMPLES_TITLE}\n  gradstore " in text, f"{name} --help has no examples"
    lines = _examples(text)
    assert 1 <= len(lines) <= 3, lines
    for line in lines:
        words = shlex.split(line, comments=True)
        if ">" in words:  # a shell redirection, not an argument
            words = words[: words.index(">")]
        assert words[0] == "gradstore"
        if name != "gradstore":
            assert " ".join(words).startswith(name), f"{name}'s example runs another: {line}"
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exc:
            pytest.fail(f"{name}: the example {line!r} does not parse (exit {exc.code})")


def test_gradstore_help_lists_the_commands_in_their_groups_before_the_options() -> None:
    text = build_parser().format_help()
    assert text.startswith("usage: gradstore [-h] [--version] [--debug] COMMAND ...\n")
    assert "positional arguments" not in text  # no flat list of the commands
    headings = [f"\n{title}:\n" for title, _ in GROUPS]
    where = [text.index(h) for h in headings]
    assert where == sorted(where) and where[-1] < text.index("\noptions:\n")
    listed = {name for name in re.findall(r"^  ([a-z]+) ", text, re.M) if not name.startswith("-")}
    commands = {n.split()[1] for n in COMMANDS if n.count(" ") == 1}
    grouped = [name for _, names in GROUPS for name in names]
    assert sorted(grouped) == sorted(commands)  # each command in exactly one group
    assert commands <= listed
    for (title, names), start, end in zip(GROUPS, where, [*where[1:], len(text)], strict=True):
        for command in names:
            assert f"\n  {command} " in text[start:end], (title, command)
    assert text.rstrip().endswith(
        "Run 'gradstore COMMAND --help' for a command's options and examples."
    )
