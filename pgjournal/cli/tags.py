"""``pgjournal tags ...``: the tag view, read it and reconcile it."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from pgjournal.cli.groups import group_help
from pgjournal.cli.support import DsnOption, console, fail, open_journal, reported, shown
from pgjournal.errors import InvalidArgument
from pgjournal.model.offsets import NoOffset, TimeBasedUUID, parse_offset
from pgjournal.model.printable import json_printable, printable
from pgjournal.runtime.steps import run
from pgjournal.server.connections import connect
from pgjournal.server.dsn import resolve_dsn
from pgjournal.tags.reconciliation import Reconciliation
from pgjournal.tags.writer_mode import recorded_mode, set_mode_step

tags_app = typer.Typer(help=group_help("tags"), no_args_is_help=True)


@tags_app.command("events")
def tag_events(
    tag: str,
    offset: Annotated[str, typer.Option(help="Resume after this TimeUUID offset (default: from the start).")] = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new events.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Print the events with TAG as JSON lines (each with the offset to resume from)."""
    with reported():
        start = parse_offset(offset) if offset else NoOffset
        if start is not NoOffset and not isinstance(start, TimeBasedUUID):
            raise InvalidArgument(f"--offset must be a time-based UUID, got {offset!r}")
    with open_journal(dsn) as journal:
        query = journal.query
        stream = (query.events_by_tag if follow else query.current_events_by_tag)(tag, start)
        try:
            for env in stream:
                event = env.event if not isinstance(env.event, bytes) else {"$bytes": env.event.hex()}
                record = {"pid": env.persistence_id, "seq_nr": env.seq_nr,
                          "tag_pid_sequence_nr": env.tag_pid_sequence_nr, "timestamp": str(env.timestamp),
                          "time": env.db_timestamp.isoformat(), "offset": str(env.offset), "event": event}
                sys.stdout.write(json_printable(json.dumps(record, default=str, ensure_ascii=False)) + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass


@tags_app.command("of")
def tags_of(persistence_id: str, dsn: DsnOption = None) -> None:
    """The tags a persistence id's events carry."""
    with open_journal(dsn) as journal:
        for tag in Reconciliation(journal).tags_of(persistence_id):
            sys.stdout.write(printable(tag) + "\n")


@tags_app.command("all")
def all_tags(dsn: DsnOption = None) -> None:
    """Every tag with the number of events written and persistence ids."""
    with open_journal(dsn) as journal:
        counts = Reconciliation(journal).all_tags()
    table = Table("tag", "events written", "persistence ids")
    for count in counts:
        table.add_row(shown(count.tag), f"{count.events:,}", f"{count.persistence_ids:,}")
    console.print(table)


@tags_app.command("delete")
def delete_tag_view(persistence_id: str, tag: str, dsn: DsnOption = None) -> None:
    """Delete a persistence id's rows from the tag view of TAG (rebuild them with `tags rebuild`)."""
    with open_journal(dsn) as journal:
        rows = Reconciliation(journal).delete_tag_view(persistence_id, tag)
    console.print(f"deleted {rows} row(s) of {shown(persistence_id)} from tag {shown(tag)}")


@tags_app.command("rebuild")
def rebuild(
    persistence_id: str,
    tag: Annotated[list[str] | None, typer.Option(help="Only this tag (repeatable; default: all its tags).")] = None,
    dsn: DsnOption = None,
) -> None:
    """Rebuild a persistence id's tag view from the journal (stop writing to it meanwhile)."""
    with open_journal(dsn) as journal:
        rows = Reconciliation(journal).rebuild(persistence_id, tag or None)
    console.print(f"rebuilt {rows} tag view row(s) of {shown(persistence_id)}")


@tags_app.command("truncate")
def truncate(
    yes: Annotated[bool, typer.Option("--yes", help="Confirm: empty the whole tag view.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Empty the whole tag view and its progress."""
    if not yes:
        fail("truncate empties the tag view of every tag; pass --yes to confirm")
    with open_journal(dsn) as journal:
        Reconciliation(journal).truncate()
    console.print("tag view truncated")


@tags_app.command("recover")
def recover(
    silent_for: Annotated[float | None, typer.Option(
        "--silent-for", min=0.0,
        help="Recover batched tag writers silent this many seconds (default: the tag_writer_timeout setting). "
             "Only writers that are really gone: a live one's in-flight tag rows could be passed by readers.")
    ] = None,
    dsn: DsnOption = None,
) -> None:
    """Write the tag view rows of batched tag writers that died (tag_batch_writer=True; events_by_tag waits
    for them) from the journal, and drop their rows so readers move on."""
    with open_journal(dsn, tag_batch_writer=True) as journal:
        assert journal.tag_writer is not None
        recovered = journal.tag_writer.recover(silent_for)
    if not recovered:
        console.print("no silent batched tag writer")
        return
    table = Table("writer row", "journal writer", "persistence ids", "tag rows written", title="recovered")
    for done in recovered:
        table.add_row(shown(done.id), shown(done.writer), f"{done.persistence_ids:,}", f"{done.rows:,}")
    console.print(table)


@tags_app.command("writer")
def writer(
    set_to: Annotated[str | None, typer.Option(
        "--set", help="Record this tag writer: batched or in-statement. Stop every writer first: a process still "
                      "running with the other setting would be refused only at its next start.")] = None,
    dsn: DsnOption = None,
) -> None:
    """Show (or, with --set, change) the tag writer this database records: `batched` (tag_batch_writer=True)
    or `in-statement`. Every process of the database must use it; switching to in-statement is refused while
    a batched writer still owes tag rows."""
    with reported():
        if set_to is None:
            mode = recorded_mode(dsn)
            console.print(shown(mode) if mode else
                          "none recorded yet (the first tagged write records its journal's setting)")
            return
        with connect(resolve_dsn(dsn)) as conn:
            previous = run(set_mode_step(set_to), conn)
    console.print(f"tag writer: {shown(previous or 'none')} -> {shown(set_to)}")
