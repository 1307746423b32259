"""Entry point: parse argv, run one subcommand, turn failures into one line and an exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .._version import __version__
from ..errors import GradstoreError
from . import _audit_args, _demo_cmd, _exit, _job_args, _store_args
from ._help import HelpFormatter, examples, group_commands, parsers
from ._text import printable

Command = Callable[[argparse.Namespace], int]
_REGISTRARS = (
    _store_args.register,
    _job_args.register,
    _audit_args.register,
    _demo_cmd.register,
)


class _Parser(argparse.ArgumentParser):
    """argparse with a 'did you mean' hint for unknown subcommands."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if "invalid choice:" in message and self._subparsers is not None:
            import difflib  # only for this hint: every command's start comes through here

            bad = message.split("invalid choice: ")[1].split("'")[1]
            choices = [a.dest for a in self._subparsers._group_actions for a in a._choices_actions]  # type: ignore[attr-defined]
            close = difflib.get_close_matches(bad, choices, n=1)
            if close:
                message += f" (did you mean '{close[0]}'?)"
        super().error(message)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, only that subcommand's parser is built
    (when some registrar has it: else the whole)."""
    parser = _Parser(
        prog="gradstore",
        description="Content-addressed gradient store on IPFS.",
        epilog=examples(
            "gradstore put alice.npz                      # store a gradient; prints its CID",
            'gradstore get "$cid" -o copy.npz             # fetch, verify every block, decode',
            "gradstore demo                               # train across 4 peers, end to end",
            then="Run 'gradstore COMMAND --help' for a command's options and examples.",
        ),
    )
    parser.add_argument("--version", action="version", version=f"gradstore {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser
    )
    sub.required = True
    if command is not None:
        only = _OnlyOne(sub, command)
        for register in _REGISTRARS:
            register(only)
        if not only.found:
            return build_parser()
    else:
        for register in _REGISTRARS:
            register(sub)
        group_commands(parser, sub)
    _add_debug_everywhere(parser)
    for each in parsers(parser):
        each.formatter_class = HelpFormatter  # keeps the examples' lines as written
    return parser


class _OnlyOne:
    """The subcommands action as the registrars see it when the command line names its
    command: the other commands' parsers are not built (all of them cost about 10 ms of
    every start; ``--help`` and a mistyped command still get the whole parser)."""

    def __init__(self, sub: Any, command: str) -> None:
        self._sub = sub
        self._command = command
        self.found = False

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name != self._command:
            return _Unbuilt()
        self.found = True
        return self._sub.add_parser(name, **kwargs)


class _Unbuilt:
    """A parser that is not built: every call on it (and on what it returns) does nothing."""

    def __getattr__(self, name: str) -> Callable[..., _Unbuilt]:
        return lambda *args, **kwargs: self


def _command_in(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (``gradstore``'s
    own options take no values)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def _add_debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``--debug`` after the subcommand too (``gradstore put x.npz --debug``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                child.add_argument(
                    "--debug",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help=argparse.SUPPRESS,
                )
                _add_debug_everywhere(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gradstore`` with ``argv``; return the exit code (see ``_exit``)."""
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_in(words))
    try:
        args = parser.parse_args(words)
    except SystemExit as exc:  # usage error (2), --help or --version (0): a code, not an exit
        return exc.code if isinstance(exc.code, int) else _exit.USAGE
    except _exit.UsageError as exc:  # a value type's own refusal (an empty CID): one line
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return _exit.USAGE
    run: Command = args.run
    try:
        return run(args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return _exit.INTERRUPTED
    except (GradstoreError, OSError) as exc:
        if args.debug:
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        if isinstance(exc, _exit.UsageError):
            return _exit.USAGE
        if isinstance(exc, _exit.RoundsFailedError):
            return _exit.ROUND_FAILED
        return _exit.ERROR
    except Exception as exc:  # a bug: still one line, the traceback is one flag away
        if args.debug:
            raise
        print(
            f"error: unexpected {type(exc).__name__}: {_one_line(exc)} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return _exit.ERROR


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"no such file: {exc.filename}"
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    text = str(exc) or type(exc).__name__
    return printable(" ".join(text.split()))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
