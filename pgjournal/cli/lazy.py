"""Command groups loaded when they are called: the root of ``pgjournal`` names its groups (the core's by module
path, the add-ons' through the ``pgjournal.commands`` entry-point group) and imports one only when a command
line reaches it. ``pgjournal --version`` imports no group, ``pgjournal projection run`` only the projections'
commands, and Typer builds the signatures of the commands called, not of every command installed.

``pgjournal --help`` lists every group with its help line: a group registered with its line shows it without
being imported; any other (a third party's entry point) is imported to read it."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperCommand

from pgjournal.cli.help import PolishedGroup, help_text, polish

if TYPE_CHECKING:
    from typer._click.core import Command, Context
    from typer._click.formatting import HelpFormatter

#: Add-ons (``projections``, ``spark``, a third party's) contribute subcommands under this entry-point group:
#: ``name = "package.module:typer_app"`` in their ``pyproject.toml``. The core never imports them by name.
COMMANDS_GROUP = "pgjournal.commands"


@dataclass(frozen=True, slots=True)
class Lazy:
    """A group of commands not imported yet: ``target`` (``module:attribute``, a :class:`typer.Typer` or a click
    command) and, optionally, the line ``--help`` lists for it (the group's own help is read when it is None)."""

    target: str
    help: str | None = None

    def load(self) -> Any:
        module, _, attribute = self.target.partition(":")
        return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True, slots=True)
class _EntryPoint:
    """A group an installed add-on registered under :data:`COMMANDS_GROUP`."""

    load: Callable[[], Any]
    help: str | None = None


class LazyGroup(PolishedGroup):
    """The root group: its own commands as Typer built them, and the groups of :attr:`lazy` and of the
    installed add-ons imported (built and polished) on first use. One that fails to import is a command that
    says so when it is called, so a broken add-on never breaks the other commands."""

    #: The core's groups, by name.
    lazy: ClassVar[dict[str, Lazy]] = {}
    _listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return sorted(set(self.commands) | set(self._registered()))

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        found = self._registered().get(cmd_name)
        if found is None:
            return None
        if self._listing and found.help is not None:
            return TyperCommand(name=cmd_name, help=help_text(found.help))  # a line of the list, nothing imported
        command = _built(cmd_name, found.load)
        self.commands[cmd_name] = command
        return command

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def _registered(self) -> dict[str, Lazy | _EntryPoint]:
        found: dict[str, Lazy | _EntryPoint] = {name: _EntryPoint(entry.load) for name, entry in _add_ons().items()}
        found.update(self.lazy)  # an add-on never hides a core group of the same name
        return found


_ADD_ONS: dict[str, Any] | None = None


def _add_ons() -> dict[str, Any]:
    """The installed add-ons' entry points by name, read once (reading them scans every installed package)."""
    global _ADD_ONS
    if _ADD_ONS is None:
        from importlib.metadata import entry_points

        _ADD_ONS = {entry.name: entry for entry in entry_points(group=COMMANDS_GROUP)}
    return _ADD_ONS


def _built(name: str, load: Callable[[], Any]) -> Command:
    try:
        loaded = load()
        command = typer.main.get_group(loaded) if isinstance(loaded, typer.Typer) else loaded
        if not callable(getattr(command, "main", None)):
            raise TypeError(f"{type(loaded).__name__} is neither a typer.Typer nor a click command")
    except Exception as exc:  # a broken add-on must not break the other commands
        command = typer.main.get_group(_broken(name, f"{type(exc).__name__}: {exc}"))
    command.name = name
    polish(command)
    built: Command = command
    return built


def _broken(name: str, reason: str) -> typer.Typer:
    from pgjournal.cli.support import fail

    sub = typer.Typer(help=f"(unavailable: {reason})")

    @sub.callback(invoke_without_command=True)
    def unavailable() -> None:
        fail(f"the {name!r} commands could not be loaded: {reason}")

    return sub
