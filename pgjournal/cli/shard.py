"""``pgjournal shard ...``: a journal sharded by slice range over several databases (docs/sharding.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pgjournal.cli.support import console, reported, shown
from pgjournal.server.dsn import mask_dsn
from pgjournal.shards import SHARDS_ENV, ShardedJournal, ShardSettings, migrate_all
from pgjournal.shards.layout import Layout, format_range
from pgjournal.store import stats

shard_app = typer.Typer(
    help="A journal sharded by slice range over several databases, with Akka R2DBC's data-partition layout: "
         f"the databases come from --shard RANGE=DSN (once per database) or {SHARDS_ENV} (one RANGE=DSN a line).",
    no_args_is_help=True)

ShardOption = Annotated[list[str] | None, typer.Option(
    "--shard", help="RANGE=DSN, e.g. 0-511=postgresql://a/journal; once per database (default: "
                    f"{SHARDS_ENV}).")]


def _settings(shards: list[str] | None) -> ShardSettings:
    return ShardSettings.parse("\n".join(shards)) if shards else ShardSettings.from_env()


def _print(title: str, shards: ShardSettings, layout: Layout) -> None:
    table = Table("slices", "database", "database id", title=f"{title}: layout version {layout.version}")
    for (bounds, member), dsn in zip(layout.members, shards.dsns, strict=True):
        table.add_row(format_range(bounds), shown(mask_dsn(dsn)), str(member))
    console.print(table)


@shard_app.command("migrate")
def migrate(shard: ShardOption = None) -> None:
    """Migrate every database (as `pgjournal migrate`), then record the layout in each."""
    with reported():
        shards = _settings(shard)
        layout = migrate_all(shards)
    _print("migrated", shards, layout)


@shard_app.command("status")
def status(shard: ShardOption = None) -> None:
    """Open every database, check they record the settings' layout, and show each with its slice range, the
    size of its journal tables and its visibility horizon (how far behind its clock, and the journal writers
    holding it back)."""
    with reported():
        shards = _settings(shard)
        with ShardedJournal.open(shards, notify=False) as journal:
            layout = journal.layout
            rows = []
            for database in journal.journals:
                with database.connection() as conn:
                    size = stats.journal_size().one(conn) or 0
                    horizon = database.horizon_tracker().read(conn)
                rows.append((size, horizon))
    table = Table("slices", "database", "database id", "size", "horizon behind clock", "open writers",
                  title=f"agreed: layout version {layout.version}")
    for (bounds, member), dsn, (size, horizon) in zip(layout.members, shards.dsns, rows, strict=True):
        table.add_row(format_range(bounds), shown(mask_dsn(dsn)), str(member), _size(size),
                      f"{horizon.held_back:.3f} s", str(len(horizon.writers)))
    console.print(table)


def _size(size: int) -> str:
    """Bytes in binary units, as PostgreSQL's ``pg_size_pretty`` names them."""
    value, unit = float(size), "bytes"
    for larger in ("kB", "MB", "GB", "TB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{size:,} bytes" if unit == "bytes" else f"{value:,.1f} {unit}"
