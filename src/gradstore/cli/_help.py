"""What ``--help`` shows beyond argparse's own: the commands in groups, and every command's
examples (light: imported for ``--help``)."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Iterator
from typing import Final

#: The commands by what they are for, in the order ``gradstore --help`` lists them:
#: (heading, its commands).
GROUPS: Final = (
    (
        "store commands (cid, encode and decode need no node)",
        ("put", "get", "verify", "inspect", "cid", "encode", "decode"),
    ),
    ("round commands (a job, its coordinator, its peers)", ("job", "coordinator", "peer", "round")),
    ("audit commands", ("audit",)),
    ("tools", ("keygen", "aggregate", "demo")),
)

EXAMPLES_TITLE: Final = "examples:"


class Verbatim(str):
    """Help text argparse prints as it is written (it re-wraps every other text)."""

    __slots__ = ()


def examples(*lines: str, then: str = "") -> Verbatim:
    """A command's epilog: ``examples:`` and its example command lines, printed as written
    (``gradstore put alice.npz  # note``), as Kubo's ``ipfs add --help`` ends; a long line
    goes on after `` \\`` and a newline; ``then`` follows after a blank line."""
    text = "\n".join([EXAMPLES_TITLE, *(f"  {line}" for line in "\n".join(lines).split("\n"))])
    return Verbatim(f"{text}\n\n{then}" if then else text)


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a ``Verbatim`` text keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if isinstance(text, Verbatim):
            return textwrap.indent(text, indent)
        return super()._fill_text(text, width, indent)


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every parser below it, each once (aliases share a parser)."""
    yield parser
    seen: set[int] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                if id(child) not in seen:
                    seen.add(id(child))
                    yield from parsers(child)


def group_commands(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """List ``sub``'s commands in ``parser``'s help under ``GROUPS``, before its options,
    not as one flat list (a command in no group is listed with the last)."""
    helps = {action.dest: action.help for action in sub._choices_actions}
    parser.usage = (
        parser.format_usage().removeprefix("usage: ").strip().replace(parser.prog, "%(prog)s", 1)
    )  # still naming COMMAND, which the flat list below would have shown
    sub.help = argparse.SUPPRESS
    options = parser._action_groups.index(parser._optionals)
    for i, (title, names) in enumerate(GROUPS):
        group = argparse._ArgumentGroup(parser, title)
        parser._action_groups.insert(options + i, group)
        listed = [name for name in names if name in helps]
        if i == len(GROUPS) - 1:
            listed += [name for name in helps if not any(name in n for _, n in GROUPS)]
        for name in listed:
            # listed only: the parser's own actions (what parsing uses) are unchanged
            group._group_actions.append(
                argparse.Action(option_strings=[], dest=name, nargs=0, help=helps[name])
            )
