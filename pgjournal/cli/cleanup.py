"""``pgjournal cleanup ...``: delete events, tag view rows and snapshots, per persistence id or in bulk (before
the snapshot, before a time, a whole entity type, tombstoned persistence ids). Every command is a dry run that
only counts unless ``--execute``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pgjournal.admin.cleanup import CleanupCounts, CleanupReport, JournalCleanup
from pgjournal.cli.groups import group_help
from pgjournal.cli.support import DsnOption, console, errors, fail, open_journal, reported, shown
from pgjournal.model.offsets import parse_timestamp
from pgjournal.tags.reconciliation import Cleanup, CleanupResult

cleanup_app = typer.Typer(help=group_help("cleanup"), no_args_is_help=True)

ExecuteOption = Annotated[bool, typer.Option("--execute", help="Really delete (default: dry run, counts only).")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Only count (the default; for scripts that say so).")]
EntityTypeOption = Annotated[str | None, typer.Option("--entity-type", help="Only this entity type (default: all).")]
PidsOption = Annotated[list[str] | None, typer.Option("--pid", help="Only this persistence id (repeatable).")]
BatchOption = Annotated[int, typer.Option("--batch-size", min=1, max=100_000,
                                          help="Persistence ids and events per transaction.")]
KeepSnapshotsOption = Annotated[bool, typer.Option("--keep-snapshots", help="Leave their snapshots.")]


ResetOption = Annotated[bool, typer.Option(help="Also drop the last event: the pid restarts at 1.")]


def _report(results: list[CleanupResult]) -> None:
    for result in results:
        console.print(shown(result))
    if results and results[0].dry_run:
        console.print("[dim]dry run: nothing deleted; add --execute to delete[/]")


@cleanup_app.command("events")
def cleanup_events(
    persistence_id: str,
    reset_sequence_number: ResetOption = False,
    execute: ExecuteOption = False,
    dsn: DsnOption = None,
) -> None:
    """Delete a persistence id's events."""
    with open_journal(dsn) as journal:
        _report([Cleanup(journal, dry_run=not execute).delete_all_events(
            persistence_id, reset_sequence_number=reset_sequence_number)])


@cleanup_app.command("tagged")
def cleanup_tagged(persistence_id: str, execute: ExecuteOption = False, dsn: DsnOption = None) -> None:
    """Delete a persistence id's rows from every tag view."""
    with open_journal(dsn) as journal:
        _report([Cleanup(journal, dry_run=not execute).delete_all_tagged_events(persistence_id)])


@cleanup_app.command("snapshots")
def cleanup_snapshots(persistence_id: str, execute: ExecuteOption = False, dsn: DsnOption = None) -> None:
    """Delete a persistence id's snapshots."""
    with open_journal(dsn) as journal:
        _report([Cleanup(journal, dry_run=not execute).delete_all_snapshots(persistence_id)])


@cleanup_app.command("all")
def cleanup_all(
    persistence_id: str,
    reset_sequence_number: ResetOption = False,
    execute: ExecuteOption = False,
    dsn: DsnOption = None,
) -> None:
    """Delete a persistence id's tagged events, events and snapshots."""
    with open_journal(dsn) as journal:
        _report(Cleanup(journal, dry_run=not execute).delete_all(persistence_id,
                                                                 reset_sequence_number=reset_sequence_number))


# -- bulk ----------------------------------------------------------------------------------------------


def _bulk(dsn: str | None, execute: bool, dry_run: bool, batch_size: int, run: object) -> None:
    """Run one bulk operation with a progress line, then print its counts and any projection left behind."""
    if execute and dry_run:
        fail("--execute and --dry-run contradict each other; pass one")
    with open_journal(dsn) as journal, reported(), Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=errors,
            transient=True) as progress:
        task = progress.add_task("starting", total=None)

        def show(counts: CleanupCounts) -> None:
            verb = "deleted" if execute else "to delete"
            progress.update(task, description=f"{counts.persistence_ids:,} persistence ids, {counts.events_deleted:,} "
                                              f"events {verb}, batch {counts.batches:,}")

        cleanup = JournalCleanup(journal, dry_run=not execute, batch_size=batch_size, progress=show)
        report: CleanupReport = run(cleanup)  # type: ignore[operator]
    _print(report)


def _print(report: CleanupReport) -> None:
    counts = report.counts
    title = f"cleanup: {shown(report.operation)}" + (" (dry run: nothing deleted)" if report.dry_run else "")
    table = Table("what", "would be" if report.dry_run else "done", title=title)
    for label, value in (("persistence ids visited", counts.persistence_ids), ("events deleted", counts.events_deleted),
                         ("highest events kept as deleted markers", counts.events_marked),
                         ("tag view rows deleted", counts.tag_view_rows),
                         ("tag progress rows deleted", counts.tag_progress_rows),
                         ("snapshots deleted", counts.snapshots), ("batches (transactions)", counts.batches)):
        table.add_row(label, f"{value:,}")
    console.print(table)
    for warning in report.warnings:
        console.print(f"[bold red]warning:[/] {shown(warning)}", highlight=False)
    if report.dry_run:
        console.print("[dim]dry run: nothing deleted; add --execute to delete[/]")


@cleanup_app.command("before-snapshot")
def cleanup_before_snapshot(
    entity_type: EntityTypeOption = None,
    pid: PidsOption = None,
    batch_size: BatchOption = 1000,
    execute: ExecuteOption = False,
    dry_run: DryRunOption = False,
    dsn: DsnOption = None,
) -> None:
    """Delete each persistence id's events up to its snapshot (the event at the snapshot's sequence number
    too); snapshots stay. The highest event stays as a deleted marker."""
    _bulk(dsn, execute, dry_run, batch_size, lambda c: c.events_before_snapshot(entity_type, pid))


@cleanup_app.command("before-time")
def cleanup_before_time(
    timestamp: Annotated[str, typer.Argument(help="ISO 8601 with a time zone, e.g. 2026-01-01T00:00:00Z.")],
    entity_type: EntityTypeOption = None,
    pid: PidsOption = None,
    batch_size: BatchOption = 1000,
    execute: ExecuteOption = False,
    dry_run: DryRunOption = False,
    dsn: DsnOption = None,
) -> None:
    """Delete the events written before TIMESTAMP (retention); snapshots stay. The highest event of a
    persistence id stays as a deleted marker."""
    with reported():
        before: datetime = parse_timestamp(timestamp, "timestamp")
    _bulk(dsn, execute, dry_run, batch_size, lambda c: c.events_before(before, entity_type, pid))


@cleanup_app.command("entity-type")
def cleanup_entity_type(
    entity_type: Annotated[str, typer.Argument(help="Every persistence id of this entity type.")],
    reset_sequence_number: ResetOption = False,
    keep_snapshots: KeepSnapshotsOption = False,
    batch_size: BatchOption = 1000,
    execute: ExecuteOption = False,
    dry_run: DryRunOption = False,
    dsn: DsnOption = None,
) -> None:
    """Delete every event (and snapshot) of an entity type."""
    _bulk(dsn, execute, dry_run, batch_size, lambda c: c.all_events(
        entity_type, reset_sequence_number=reset_sequence_number, snapshots=not keep_snapshots))


@cleanup_app.command("tombstoned")
def cleanup_tombstoned(
    entity_type: EntityTypeOption = None,
    reset_sequence_number: ResetOption = False,
    keep_snapshots: KeepSnapshotsOption = False,
    batch_size: BatchOption = 1000,
    execute: ExecuteOption = False,
    dry_run: DryRunOption = False,
    dsn: DsnOption = None,
) -> None:
    """Remove persistence ids whose events are all logically deleted (what `delete_events` up to the highest
    leaves): their rows but the marker, tag view rows and snapshots."""
    _bulk(dsn, execute, dry_run, batch_size, lambda c: c.tombstoned(
        entity_type, reset_sequence_number=reset_sequence_number, snapshots=not keep_snapshots))
