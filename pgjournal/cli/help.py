"""How every ``pgjournal`` command's ``--help`` reads: the one place that shapes help text, for the core's
commands and every add-on's alike (the root group polishes the whole tree it is built with).

Typer's own rendering shows a flag's type (``--help <bool>``), a required argument as ``{name}`` in the usage
line, the docstrings' reStructuredText literals (````x````) as they are, and keeps their line breaks. Here a
flag shows no type, an argument is named in capitals (``ENTITY_TYPE``, optional ones in brackets), a literal
is shown in single backticks and the lines of a paragraph are joined for Rich to wrap."""

from __future__ import annotations

import inspect
import re
from typing import TYPE_CHECKING, Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

if TYPE_CHECKING:  # annotations only: recent typer vendors click as typer._click, older ones use click itself
    from typer._click.core import Command, Context, Parameter

_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def help_text(text: str | None) -> str | None:
    """``text`` (a docstring or a ``help=``) as the help shows it: ````x```` written `x`, each paragraph one line
    (Rich wraps it to the terminal)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in _LITERAL.sub(r"`\1`", p).splitlines()) for p in paragraphs)


def argument_name(param: Parameter) -> str:
    """An argument as the usage line and the arguments panel name it: ``ENTITY_TYPE``, ``[N]``, ``EVENTS...``."""
    name = param.metavar or (param.name or "").upper()
    if not param.required:
        name = f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


class PolishedCommand(TyperCommand):
    """A command whose usage names its arguments as :func:`argument_name` does and whose ``--help`` shows no
    type."""

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        return [self.options_metavar or "", *(argument_name(p) for p in self.get_params(ctx)
                                              if isinstance(p, TyperArgument))]

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        return _untyped(super().get_help_option(ctx))


class _PolishedSubgroup(TyperGroup):
    def get_help_option(self, ctx: Context) -> TyperOption | None:
        return _untyped(super().get_help_option(ctx))


class PolishedGroup(_PolishedSubgroup):
    """The root of the command tree: on construction, every command and group below it is polished (their
    help texts, arguments and flags), so add-ons loaded from entry points read like the core's commands."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        polish(self)


def _untyped(option: TyperOption | None) -> TyperOption | None:
    if option is not None:
        option.metavar = ""  # Typer shows a parameter's metavar in place of its type: a flag takes no value
    return option


def polish(command: Command) -> None:
    """Polish ``command`` and everything below it (see the module docstring)."""
    command.help = help_text(command.help)
    command.short_help = help_text(command.short_help)
    if type(command) is TyperCommand:
        command.__class__ = PolishedCommand
    elif type(command) is TyperGroup:
        command.__class__ = _PolishedSubgroup
    for param in command.params:
        if isinstance(param, TyperOption):
            param.help = help_text(param.help)
            if param.is_flag and not param.count:
                param.metavar = ""
        elif isinstance(param, TyperArgument):
            param.help = help_text(param.help)
            param.metavar = argument_name(param).strip("[]").removesuffix("...")
    for sub in getattr(command, "commands", {}).values():
        polish(sub)
