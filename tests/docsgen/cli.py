"""The command-line reference, from the argparse parsers the commands are built with.

``chaingate.cli.build_parser`` is walked through its sub-commands; ``chaingate bench`` hands its
arguments to a parser of its own (it runs in a fresh interpreter), walked the same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from chaingate import cli
from chaingate.benchsuite import command as bench_command
from tests.docsgen.markdown import GENERATED, code, table

WIDTH = 100  # usage lines wrap here, whatever the terminal


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _passes_through(parser: argparse.ArgumentParser) -> bool:
    """A command that hands everything after it to another parser (``nargs=REMAINDER``)."""
    return any(a.nargs == argparse.REMAINDER for a in parser._actions)


def _option(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(action.option_strings)
        if action.nargs == 0:
            return names
        metavar = action.metavar or action.dest.upper()
        return f"{names} {metavar}"
    return action.metavar if isinstance(action.metavar, str) else action.dest.upper()


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return ""
    if action.default == []:
        return ""
    return code(action.default)


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", ")", "!")) else text + "."


def _help(action: argparse.Action) -> str:
    parts = [_sentence(action.help or "")]
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        parts.append("One of " + ", ".join(map(code, action.choices)) + ".")
    if isinstance(action, argparse._AppendAction) and "repeat" not in (action.help or ""):
        parts.append("Repeatable.")
    return " ".join(filter(None, parts))


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _command(parser: argparse.ArgumentParser, summary: str, level: int) -> Iterator[str]:
    yield f"{'#' * level} `{parser.prog}`\n\n"
    if summary:
        yield _sentence(summary) + "\n\n"
    if parser.description:
        yield parser.description + "\n\n"
    yield f"```text\n{_usage(parser)}\n```\n\n"
    rows = [
        [code(_option(a)), _default(a), _help(a)]
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and a.help != argparse.SUPPRESS
        and a.nargs != argparse.REMAINDER
    ]
    if rows:
        yield table(["Argument", "Default", "Description"], rows) + "\n"
    children = list(_subcommands(parser))
    if children:
        yield "Sub-commands: " + ", ".join(code(name) for name, _h, _p in children) + ".\n\n"
    for _name, text, child in children:
        if _passes_through(child) and child.prog == "chaingate bench":
            delegated = bench_command.build_parser()
            yield from _command(delegated, text, level + 1)
        elif _passes_through(child):
            yield f"{'#' * (level + 1)} `{child.prog}`\n\n{_sentence(text)}\n\n"
            yield f"```text\n{_usage(child)}\n```\n\n"
        else:
            yield from _command(child, text, level + 1)


INTRO = """\
# Command line

One command, `chaingate`, with a sub-command per job.  `chaingate dev` needs nothing but Python
and Node.js; every other command reads the same TOML file as `chaingate serve` (`--config`;
without it, the built-in defaults: an SQLite store under `~/.local/share/chaingate`).  Exit
status 0 is success, 2 a configuration or usage error, 1 anything else (the message says what).

"""


def render() -> str:
    return GENERATED + INTRO + "".join(_command(cli.build_parser(), "", 2))


def commands() -> set[str]:
    """Every command path (``chaingate keys create``): the coverage check."""
    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        found.add(parser.prog)
        for _name, _text, child in _subcommands(parser):
            walk(bench_command.build_parser() if child.prog == "chaingate bench" else child)

    walk(cli.build_parser())
    return found
