"""The ``pgjournal`` command line (Typer + Rich). Every error is a one-line message, never a traceback.

The groups of commands (the core's in :mod:`pgjournal.cli.groups`, the add-ons' from entry points) are imported
when a command line reaches them (:mod:`pgjournal.cli.lazy`), and the commands here import what they use inside
their body: a command, a worker process or ``--version`` loads only what it runs."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgjournal.cli.groups import GROUPS
from pgjournal.cli.lazy import LazyGroup
from pgjournal.cli.support import (
    DsnOption,
    ShardOption,
    console,
    fail,
    fresh_consoles,
    open_journal,
    parse_json,
    reported,
    shard_settings_of,
    shown,
)

if TYPE_CHECKING:
    from rich.console import Group

    from pgjournal.core.horizon import Horizon
    from pgjournal.journal import Journal


class _Root(LazyGroup):
    lazy = GROUPS


app = typer.Typer(
    help="pgjournal: an event journal for PostgreSQL, YugabyteDB and CockroachDB.\n\n"
    "With no --dsn and no PGJOURNAL_DSN, a private PostgreSQL (embedded) is started and reused.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    cls=_Root,
)
server_app = typer.Typer(help="The embedded PostgreSQL server.", no_args_is_help=True)


def _show_version(value: bool) -> None:
    if value:
        from pgjournal import __version__

        typer.echo(f"pgjournal {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool | None, typer.Option("--version", callback=_show_version, is_eager=True,
                                                 help="Show pgjournal's version and exit.")] = None,
) -> None:
    """pgjournal: an event journal for PostgreSQL, YugabyteDB and CockroachDB."""
    fresh_consoles()
app.add_typer(server_app, name="server")

@app.command()
def migrate(
    dsn: DsnOption = None,
    sql: Annotated[bool, typer.Option("--sql", help="Print the DDL instead of running it.")] = False,
    dialect: Annotated[str, typer.Option(help="postgres, yugabyte or cockroach.")] = "postgres",
    check: Annotated[bool, typer.Option("--check", help="Show what it would do (adoption of an Akka R2DBC "
                                                        "schema, revisions to run) without doing it.")] = False,
) -> None:
    """Create or upgrade the schema (Alembic `upgrade head`), adopting an Akka/Pekko R2DBC schema where it finds
    one, or print its DDL for review."""
    from rich.table import Table

    from pgjournal.admin import migrate as migrations
    from pgjournal.server.dsn import mask_dsn, resolve_dsn

    with reported():
        if sql:
            sys.stdout.write(migrations.upgrade_sql(dialect))
            return
        resolved = resolve_dsn(dsn)
        if check:
            steps = migrations.plan(resolved, dialect)
            table = Table("action", "object", "detail", title=f"pgjournal migrate on {shown(mask_dsn(resolved))} would")
            for step in steps:
                table.add_row(shown(step.action), shown(step.target), shown(step.detail))
            console.print(table)
            if any(step.action == "refuse" for step in steps):
                raise typer.Exit(1)
            return
        adopted = migrations.upgrade(resolved, dialect)
    if adopted:
        console.print(f"adopted the Akka R2DBC schema: {sum(s.action != 'keep' for s in adopted)} steps, "
                      f"Akka's tables kept as they are")
    console.print(f"schema is at revision [bold]{migrations.head_revision()}[/] on {shown(mask_dsn(resolved))}",
                  soft_wrap=True)


@app.command()
def append(
    persistence_id: Annotated[str, typer.Argument(help="For example Cart|42 (entity type Cart).")],
    events: Annotated[list[str], typer.Argument(help="Events as JSON, one argument each.")],
    expected_seq_nr: Annotated[int | None, typer.Option(help="Highest seq nr you expect (0: new).")] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Tag every event (repeatable).")] = None,
    dsn: DsnOption = None,
) -> None:
    """Append events (JSON) to a persistence id, atomically."""
    from rich.table import Table

    from pgjournal.model.offsets import format_timestamp

    decoded = [parse_json(text, "events") for text in events]
    with open_journal(dsn) as journal:
        written = journal.append(persistence_id, decoded, expected_seq_nr=expected_seq_nr, tags=tag or ())
    table = Table("persistence id", "seq nr", "slice", "db timestamp")
    for env in written:
        table.add_row(shown(env.persistence_id), str(env.seq_nr), str(env.slice), format_timestamp(env.db_timestamp))
    console.print(table)


@app.command()
def events(
    persistence_id: str,
    from_seq_nr: Annotated[int, typer.Option("--from", help="First sequence number.")] = 1,
    to_seq_nr: Annotated[int | None, typer.Option("--to", help="Last sequence number.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new events.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Print the events of one persistence id as JSON lines; exit 1 (a message on stderr) when it has none in
    the range asked for."""
    printed = 0
    with open_journal(dsn) as journal:
        query = journal.query
        stream = (query.events_by_persistence_id if follow else query.current_events_by_persistence_id)(
            persistence_id, from_seq_nr, to_seq_nr
        )
        try:
            for env in stream:
                print_envelope(env)
                printed += 1
        except KeyboardInterrupt:
            return
    if not printed:
        asked = "" if from_seq_nr <= 1 and to_seq_nr is None else \
            f" with seq nr {from_seq_nr} to {to_seq_nr if to_seq_nr is not None else 'the last'}"
        fail(f"persistence id {persistence_id!r} has no events{asked}")


def print_envelope(env: Any, *, with_offset: bool = False) -> None:
    from pgjournal.model.offsets import format_timestamp
    from pgjournal.model.printable import json_printable

    event = env.event if not isinstance(env.event, bytes) else {"$bytes": env.event.hex()}
    record = {"pid": env.persistence_id, "seq_nr": env.seq_nr, "slice": env.slice,
              "timestamp": format_timestamp(env.db_timestamp), "event": event}
    if env.tags:
        record["tags"] = list(env.tags)
    if getattr(env, "source", "query") != "query":
        record["source"] = str(env.source)
    if with_offset:
        record["offset"] = str(env.offset)
    sys.stdout.write(json_printable(json.dumps(record, default=str, ensure_ascii=False)) + "\n")
    sys.stdout.flush()


@app.command("persistence-ids")
def persistence_ids(
    after: Annotated[str | None, typer.Option(help="Start after this persistence id.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many.")] = 100,
    dsn: DsnOption = None,
) -> None:
    """List persistence ids in order (keyset paged)."""
    from pgjournal.model.printable import printable

    with open_journal(dsn) as journal:
        for pid in journal.query.current_persistence_ids(after=after, limit=limit):
            sys.stdout.write(printable(pid) + "\n")


@app.command()
def info(
    dsn: DsnOption = None,
    watch: Annotated[float | None, typer.Option(
        help="Refresh every this many seconds until Ctrl-C.", min=0.1, max=3600)] = None,
    metrics_port: Annotated[int | None, typer.Option(
        help="With --watch: also serve Prometheus metrics on 127.0.0.1:PORT (needs pgjournal[metrics]).")] = None,
    shard: ShardOption = None,
) -> None:
    """Counts per entity type, a histogram of events over 8 slice ranges, and what holds the visibility
    horizon back (journal writers with an open transaction). With --shard: the layout with each database's
    range, size and horizon, then this view of each database."""
    if shard:
        if dsn is not None or watch is not None:
            fail("--shard shows every database of a sharded journal once: give it without --dsn and --watch")
        _sharded_info(shard)
        return
    with open_journal(dsn) as journal:
        if watch is None:
            console.print(info_view(journal))
            return
        if metrics_port is not None:
            from pgjournal.runtime import metrics

            metrics.serve(metrics_port)
        from rich.live import Live

        with Live(info_view(journal), console=console, auto_refresh=False) as live, \
                contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(watch)
                live.update(info_view(journal), refresh=True)


def _sharded_info(shard: list[str]) -> None:
    from pgjournal.cli import shard as shard_cli
    from pgjournal.shards import ShardedJournal

    shard_cli.status(shard)
    with reported(), ShardedJournal.open(shard_settings_of(shard), notify=False) as journal:
        views = [info_view(database) for database in journal.journals]
    for (low, high), view in zip(journal.shards.ranges, views, strict=True):
        console.rule(f"slices {low}-{high}")
        console.print(view)


#: ``pgjournal info``'s histogram: events over this many slice ranges.
INFO_RANGES = 8


def info_view(journal: Journal) -> Group:
    """Everything ``pgjournal info`` shows, read in one go."""
    from rich.console import Group
    from rich.table import Table

    from pgjournal.model.offsets import format_timestamp
    from pgjournal.model.slices import slice_ranges
    from pgjournal.server.dsn import mask_dsn
    from pgjournal.store import stats

    with journal.connection() as conn:
        horizon = journal.horizon_tracker().read(conn)
        per_type = stats.per_entity_type().all(conn)
        per_range = {r.index: r.events for r in stats.per_slice_range(INFO_RANGES).all(conn)}
        snapshots = stats.snapshots().one(conn) or 0
    table = Table("entity type", "events", "persistence ids", "first", "last", title="Events per entity type")
    for row in per_type:
        table.add_row(shown(row.entity_type) if row.entity_type else "(none)", f"{row.events:,}",
                      f"{row.persistence_ids:,}", format_timestamp(row.first), format_timestamp(row.last))
    total = sum(per_range.values()) or 1
    histogram = Table("slices", "events", "share", title="Events per slice range")
    for i, (lo, hi) in enumerate(slice_ranges(INFO_RANGES)):
        count = per_range.get(i, 0)
        histogram.add_row(f"{lo}-{hi}", f"{count:,}", "█" * round(40 * count / total))
    return Group(f"journal on {shown(mask_dsn(journal.dsn))}", table, histogram,
                 f"snapshots: {snapshots:,}", *horizon_view(journal, horizon))


def horizon_view(journal: Journal, horizon: Horizon) -> list[Any]:
    """The visibility horizon and the journal writers holding it back."""
    from rich.table import Table

    from pgjournal.model.offsets import format_timestamp

    line = (f"visibility horizon: {journal.capabilities.describe()}; "
            f"{horizon.held_back:.3f} s behind the database clock")
    if not horizon.writers:
        return [line]
    longest = journal.capabilities.longest_transaction
    table = Table("backend pid", "transaction", "started", "open for", title="Journal writers with an open transaction")
    for writer in sorted(horizon.writers, key=lambda w: (w.started is None, w.started)):
        age = (horizon.now - writer.started).total_seconds() if writer.started else None
        table.add_row(str(writer.pid), writer.vxid, format_timestamp(writer.started) if writer.started else "(hidden)",
                      f"{age:.3f} s" if age is not None else "?",
                      style="bold red" if age is not None and age > longest else None)
    return [line, table]


@app.command()
def slices(n: Annotated[int, typer.Argument(help="Number of ranges (a divisor of 1024).")] = 4) -> None:
    """Show the slice ranges for N consumers."""
    from rich.table import Table

    from pgjournal.model.slices import slice_ranges

    with reported():
        ranges = slice_ranges(n)
    table = Table("range", "min slice", "max slice", "--slices")
    for i, (lo, hi) in enumerate(ranges):
        table.add_row(str(i), str(lo), str(hi), f"{lo}-{hi}")
    console.print(table)


@app.command()
def tail(
    entity_type: Annotated[str, typer.Argument(help="Entity type (the text before | in persistence ids).")],
    slices_range: Annotated[str, typer.Option("--slices", help="Slice range, e.g. 0-255.")] = "0-1023",
    from_offset: Annotated[str | None, typer.Option("--from", help="Offset string or ISO timestamp.")] = None,
    current: Annotated[bool, typer.Option("--current", help="Stop at the tail instead of following.")] = False,
    portable: Annotated[bool, typer.Option(help="Portable mode (no PostgreSQL-only features).")] = False,
    dsn: DsnOption = None,
) -> None:
    """Print the events of a slice range as JSON lines (with their offsets), following live."""
    from pgjournal.model.offsets import parse_offset
    from pgjournal.model.slices import parse_slice_range

    with reported():
        lo, hi = parse_slice_range(slices_range)
        offset = parse_offset(from_offset or "")
    with open_journal(dsn, portable=portable) as journal, reported():
        query = journal.query
        stream = (query.current_events_by_slices if current else query.events_by_slices)(entity_type, lo, hi, offset)
        try:
            for env in stream:
                print_envelope(env, with_offset=True)
        except KeyboardInterrupt:
            pass


@server_app.command("status")
def server_status() -> None:
    """Is the embedded server running, where, and on which port."""
    from rich.table import Table

    from pgjournal.server.embedded import EmbeddedServer

    status = EmbeddedServer.default().status()
    table = Table("running", "pid", "port", "version")
    table.add_row("yes" if status.running else "no", str(status.pid or "-"), str(status.port or "-"),
                  shown(status.version or "-"))
    console.print(table)
    # The values a user copies: each on a line of its own, never cut or wrapped to the terminal's width.
    console.print(f"data directory: {shown(status.data_dir)}", soft_wrap=True, highlight=False)
    console.print(f"dsn: {shown(status.dsn) if status.running else '-'}", soft_wrap=True, highlight=False)


@server_app.command("start")
def server_start() -> None:
    """Start the embedded server (or find it running)."""
    from pgjournal.server.embedded import EmbeddedServer

    with reported():
        server = EmbeddedServer.default().ensure_running()
    console.print(f"running: {shown(server.dsn)}", soft_wrap=True, highlight=False)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the embedded server."""
    from pgjournal.server.embedded import EmbeddedServer

    with reported():
        stopped = EmbeddedServer.default().stop()
    console.print("stopped" if stopped else "was not running")


@app.command("verify")
def verify_command(
    dsn: DsnOption = None,
    examples: Annotated[int, typer.Option(min=0, help="Examples shown per check.")] = 10,
) -> None:
    """Check the journal's integrity (seq nr gaps, time order, tag views, projection offsets); exit 1 when
    something is off."""
    from pgjournal.admin.verify import render, verify

    with open_journal(dsn) as journal:
        report = verify(journal, examples=examples)
    console.print(render(report))
    if not report.ok:
        fail(f"{report.problems:,} problem(s) found")


@app.command("roles")
def roles_command(
    sql: Annotated[bool, typer.Option("--sql", help="Print the script instead of running it.")] = False,
    owner: Annotated[str, typer.Option(help="Role that owns the schema and runs migrations.")] = "pgjournal_owner",
    writer: Annotated[str, typer.Option(help="Role for applications: read and write rows.")] = "pgjournal_writer",
    reader: Annotated[str, typer.Option(help="Role for Spark exports and queries: read only.")] = "pgjournal_reader",
    loader: Annotated[str, typer.Option(
        help="Role for Spark incremental loads: read, and keep load watermarks.")] = "pgjournal_loader",
    visibility_horizon: Annotated[bool, typer.Option(
        help="Also grant pg_read_all_stats: readers see other roles' journal writers' start times and never "
             "wait for them to finish.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Least-privilege roles (owner, writer, reader, loader): print the SQL (--sql) or run it as an administrator."""
    from pgjournal.admin.roles import apply_roles, role_script
    from pgjournal.server.dsn import mask_dsn

    with reported():
        script = role_script(owner=owner, writer=writer, reader=reader, loader=loader,
                             visibility_horizon=visibility_horizon)
        if sql:
            sys.stdout.write(script)
            return
        from pgjournal.server.dsn import resolve_dsn

        resolved = resolve_dsn(dsn)
        apply_roles(resolved, script)
    console.print(f"roles {shown(owner)}, {shown(writer)}, {shown(reader)}, {shown(loader)} set up on "
                  f"{shown(mask_dsn(resolved))}")


def main() -> None:
    app()

