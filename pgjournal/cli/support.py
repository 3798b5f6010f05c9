"""What every ``pgjournal`` subcommand shares, the add-ons' included: consoles, the ``--dsn`` option, and
errors as one-line messages. Add-ons import this module, never :mod:`pgjournal.cli.commands` (which loads them).

Importing it is cheap (no Rich, no psycopg, no journal): every command, ``--version`` included, and every worker
process started as ``pgjournal projection run`` passes through it, so what a command needs is imported where it
is used."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from pgjournal.errors import JournalError
from pgjournal.model.printable import printable
from pgjournal.server.dsn import SHARDS_ENV
from pgjournal.validation import load_json

if TYPE_CHECKING:
    from rich.console import Console

    from pgjournal.journal import Journal
    from pgjournal.shards import ShardSettings


class _OnFirstUse:
    """A Rich console made when a command first prints through it (Rich takes a while to import)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def _made(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def forget(self) -> None:
        """Make the console again at its next use: it reads the terminal's width (``COLUMNS``) when made."""
        self._console = None

    # Rich's progress bars and live displays enter their console (``with console:``), and a special method is
    # looked up on the type, never through ``__getattr__``.
    def __enter__(self) -> Console:
        return self._made().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._made().__exit__(*exc)


# No emoji codes: a name holding ``:smile:`` prints as it is (markup is escaped by ``shown``).
console = cast("Console", _OnFirstUse(emoji=False))
errors = cast("Console", _OnFirstUse(stderr=True, emoji=False))


def fresh_consoles() -> None:
    """Every command starts with consoles made for the terminal it runs in, not for one an earlier command of the
    same process ran in (a process that runs the app more than once: an embedding application, the tests)."""
    for made in (console, errors):
        cast(_OnFirstUse, made).forget()

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", envvar="PGJOURNAL_DSN", help="PostgreSQL connection string (default: embedded server).",
                 show_envvar=True),
]
ShardOption = Annotated[list[str] | None, typer.Option(
    "--shard", help="RANGE=DSN, e.g. 0-511=postgresql://a/journal; once per database; spare=DSN: a database "
    f"holding no range yet, a move's future target (default: {SHARDS_ENV}).")]


def shard_settings_of(shards: list[str] | None) -> ShardSettings:
    """The settings of ``--shard`` (one ``RANGE=DSN``, ``spare=DSN`` or ``replica:RANGE=DSN`` each), else of
    :data:`SHARDS_ENV`: the text form ``ShardedJournal.open`` reads (:meth:`ShardSettings.parse`). Every command
    taking ``--shard`` reads them here, then lets the journal (or ``migrate_all``) resolve them as ``open`` does:
    settings a move left behind, with its target as a spare, are routed by the records; what is printed is the
    layout routed, never the settings as given."""
    from pgjournal.shards import ShardSettings

    return ShardSettings.parse("\n".join(shards)) if shards else ShardSettings.from_env()


def shown(text: object) -> str:
    """``text`` (a name from the database or the user, or a message quoting one) as Rich prints it verbatim: its
    control characters written as visible escapes (:func:`~pgjournal.model.printable.printable`: one line, no terminal
    escape sequences) and its ``[...]`` kept from being read as markup. Every table cell and line the commands
    print through Rich passes through here; plain lines on stdout use ``printable`` itself."""
    from rich.markup import escape

    return escape(printable(text))


def fail(message: str, code: int = 1) -> None:
    from pgjournal.server.dsn import mask_dsn

    errors.print(f"[bold red]error:[/] {shown(_shortened(mask_dsn(message)))}", highlight=False)
    raise typer.Exit(code)


def _shortened(message: str, longest: int = 120) -> str:
    """``message`` with each word longer than ``longest`` characters (a huge argument quoted back) cut to its
    start and its length: an error stays a line or two whatever the user passed."""
    return " ".join(word if len(word) <= longest else f"{word[:60]}...({len(word):,} characters)"
                    for word in message.split(" "))


def parse_json(text: str, what: str) -> Any:
    """``text`` as JSON, or a one-line error naming ``what`` (malformed, nested too deeply, too long a number)."""
    try:
        return load_json(text)
    except ValueError as exc:
        shown = text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"
        fail(f"{what} must be JSON: {exc}; got {shown!r}")


@contextmanager
def reported() -> Iterator[None]:
    """Turn pgjournal errors into a clear message and exit code 1 (passwords masked)."""
    try:
        yield
    except JournalError as exc:
        fail(str(exc))


@contextmanager
def open_journal(dsn: str | None, **settings: Any) -> Iterator[Journal]:
    """The journal of a command, with the tag writer the database records (``tag_batch_writer`` unset follows it)
    unless the command or ``PGJOURNAL_TAG_BATCH_WRITER`` sets one."""
    from pgjournal.journal import Journal

    with reported(), Journal.open(dsn, **settings) as journal:
        yield journal
