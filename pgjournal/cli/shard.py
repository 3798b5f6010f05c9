"""``pgjournal shard ...``: a journal sharded by slice range over several databases (docs/sharding.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pgjournal.cli.groups import group_help
from pgjournal.cli.support import ShardOption, console, reported, shard_settings_of, shown
from pgjournal.errors import InvalidArgument
from pgjournal.server.dsn import mask_dsn
from pgjournal.shards import SHARDS_ENV, ShardedJournal, ShardSettings
from pgjournal.shards.layout import Layout, format_range
from pgjournal.shards.migrate import migrate_resolved
from pgjournal.shards.move import Mover, MoveStatus
from pgjournal.shards.move_plan import Action, parse_moved_range
from pgjournal.store import shard_guard, stats
from pgjournal.store.shard_layout import layout_table_exists

shard_app = typer.Typer(help=group_help("shard"), no_args_is_help=True)


def _print(title: str, shards: ShardSettings, layout: Layout) -> None:
    table = Table("slices", "database", "database id", title=f"{title}: layout version {layout.version}")
    for (bounds, member), dsn in zip(layout.members, shards.dsns, strict=True):
        table.add_row(format_range(bounds), shown(mask_dsn(dsn)), str(member))
    console.print(table)


@shard_app.command("migrate")
def migrate(shard: ShardOption = None) -> None:
    """Migrate every database (as `pgjournal migrate`), then record the layout in each."""
    with reported():
        layout, shards = migrate_resolved(shard_settings_of(shard))
    _print("migrated", shards, layout)


@shard_app.command("status")
def status(shard: ShardOption = None) -> None:
    """Open every database, check they record the settings' layout, and show each with its slice range, the
    size of its journal tables and its visibility horizon (how far behind its clock, and the journal writers
    holding it back)."""
    with reported():
        shards = shard_settings_of(shard)
        with ShardedJournal.open(shards, notify=False) as journal:
            layout, shards = journal.layout, journal.shards  # the layout routed: the records', after a move
            rows, moves = [], []
            for database in journal.journals:
                with database.connection() as conn:
                    size = stats.journal_size().one(conn) or 0
                    horizon = database.horizon_tracker().read(conn)
                    if layout_table_exists().one(conn) and shard_guard.has_move_columns().one(conn):
                        moves.append(shard_guard.move_record().one(conn))
                rows.append((size, horizon))
    table = Table("slices", "database", "database id", "size", "horizon behind clock", "open writers",
                  title=f"agreed: layout version {layout.version}")
    for (bounds, member), dsn, (size, horizon) in zip(layout.members, shards.dsns, rows, strict=True):
        table.add_row(format_range(bounds), shown(mask_dsn(dsn)), str(member), _size(size),
                      f"{horizon.held_back:.3f} s", str(len(horizon.writers)))
    console.print(table)
    for move in moves:
        if move is not None and move.move_step is not None:
            console.print(f"moving slices {move.move_range} from database {move.move_source} to {move.move_target}: "
                          f"the source's step {move.move_step}; `pgjournal shard move --resume` shows the target's "
                          "progress (rows copied)")


KeepOption = Annotated[float, typer.Option(
    "--keep", help="Seconds the source keeps the moved rows after the switch before they are deleted.")]


@shard_app.command("move")
def move(slices: Annotated[str, typer.Option("--slices", help="The range to move, aligned: e.g. 512-767.")],
         to: Annotated[str, typer.Option("--to", help="DSN of the target database (migrated, outside the layout).")],
         shard: ShardOption = None,
         dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the move and its next step; change nothing.")]
         = False,
         resume: Annotated[bool, typer.Option("--resume", help="Continue the move the records hold.")] = False,
         rollback: Annotated[bool, typer.Option("--rollback", help="Undo the move the records hold (until its "
                                                                    "switch).")] = False,
         keep: KeepOption = 0.0) -> None:
    """Move a slice range to another database while writers and projections run (docs/sharding.md, section 6):
    the range's writers pause only between its seal and the switch; every step is recorded in the databases, so a
    move that was killed is resumed (--resume) or rolled back (--rollback)."""
    with reported():
        moved = parse_moved_range(slices)
        shards = shard_settings_of(shard)
        if keep < 0:
            raise InvalidArgument(f"--keep must be at least 0 seconds, got {keep}")
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TextColumn("{task.fields[rows]:,} rows"),
                      TimeElapsedColumn(), console=console, transient=True, disable=dry_run) as bar:
            task = bar.add_task("opening", rows=0)
            with Mover(shards, moved, to, keep=keep,
                       progress=lambda what, rows: bar.update(task, description=what, rows=rows)) as mover:
                status = mover.status()
                recorded = status.progress.source is not None or status.progress.target is not None
                if dry_run:
                    _print_move(status, "dry run (nothing changed)")
                    return
                if rollback:
                    mover.roll_back()
                    console.print(f"rolled back: slices {format_range(moved)} stay in layout version "
                                  f"{status.move.before.version}")
                    return
                if recorded and not resume:
                    raise InvalidArgument(f"a move of {format_range(moved)} is recorded (next step: "
                                          f"{status.next.value}): run with --resume or --rollback")
                final = mover.run()
                seals = mover.seal_seconds
                settings = [(bounds, mover.dsn_of(member)) for bounds, member in final.move.after.members]
    _print_move(final, "moved")
    if seals:
        console.print(f"seal: {len(seals)} attempt(s), the last took {seals[-1] * 1000:.0f} ms")
    console.print("the settings from now on (--shard, " + SHARDS_ENV + "): " + "; ".join(
        f"{format_range(bounds)}={shown(mask_dsn(dsn or '?'))}" for bounds, dsn in settings))


def _print_move(status: MoveStatus, title: str) -> None:
    """The databases of the range before and after the move, by layout version (one column when nothing is left
    to move: a finished move run again)."""
    move = status.move
    changes = move.before != move.after
    columns = ([f"database in layout version {move.before.version}"] if changes else []) + [
        f"database in layout version {move.after.version}"]
    table = Table("slices", *columns,
                  title=f"{title}: slices {format_range(move.moved)}, next step: {status.next.value}")
    for bounds, member in move.after.members:
        was = next((m for b, m in move.before.members if b[0] <= bounds[0] and bounds[1] <= b[1]), "")
        table.add_row(format_range(bounds), *([str(was)] if changes else []), str(member))
    console.print(table)
    if status.next is not Action.DONE and status.rows:
        console.print(f"{status.rows:,} rows copied so far")


def _size(size: int) -> str:
    """Bytes in binary units, as PostgreSQL's ``pg_size_pretty`` names them."""
    value, unit = float(size), "bytes"
    for larger in ("kB", "MB", "GB", "TB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{size:,} bytes" if unit == "bytes" else f"{value:,.1f} {unit}"
