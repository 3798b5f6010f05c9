"""Every command's ``--help``, the add-ons' included: flags show no type, arguments no ``{placeholder}``, help
texts no reStructuredText literals, and paragraphs are wrapped by the terminal rather than the docstring."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer.main
from typer.testing import CliRunner

from pgjournal.cli.commands import app

pytestmark = pytest.mark.mode_independent


def command_paths() -> Iterator[tuple[str, ...]]:
    # through list_commands/get_command, as a command line reaches them: the root imports its groups on demand
    def walk(command, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield path
        if not hasattr(command, "list_commands"):
            return
        ctx = command.context_class(command)
        for name in command.list_commands(ctx):
            yield from walk(command.get_command(ctx, name), (*path, name))

    yield from walk(typer.main.get_command(app), ())


PATHS = list(command_paths())


def test_the_walk_reaches_the_add_ons() -> None:
    assert {("projection", "status"), ("spark", "export"), ("tail",), ("server", "status")} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "pgjournal")
def test_help(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=100, env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "<bool>" not in text, text
    assert not re.search(r"\{[A-Za-z_]+\}", text), text
    assert "``" not in text, text
    usage = next(line for line in text.splitlines() if "Usage:" in line)
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", usage), usage  # arguments are named in capitals
    for line in text.splitlines():
        # a flag's row: its name(s) then straight to the help, no value type in between
        if re.match(r"│ --(help|version|current|check|sql|execute|follow)\b", line):
            assert not re.search(r"<\w+>", line), line


def test_a_docstring_paragraph_is_wrapped_by_the_terminal_not_the_source() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=100, env={"COLUMNS": "100"})
    assert "adopting an Akka/Pekko R2DBC schema where it finds one, or print" in " ".join(
        line.strip("│ ") for line in result.output.splitlines()), result.output


def test_a_missing_argument_is_named_as_the_usage_names_it() -> None:
    result = CliRunner().invoke(app, ["tail"], terminal_width=100)
    assert result.exit_code == 2
    assert "ENTITY_TYPE" in result.output, result.output
