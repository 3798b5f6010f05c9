"""``pgjournal migrate`` on every database of a sharded journal, then the layout record (docs/sharding.md,
sections 3 and 5)."""

from __future__ import annotations

import psycopg

from pgjournal.admin import migrate as migrations
from pgjournal.errors import ConfigurationError, DatabaseUnavailable, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.runtime.steps import run
from pgjournal.server.connections import connect
from pgjournal.settings import Settings
from pgjournal.shards.guards import install_guards
from pgjournal.shards.layout import Layout, Record, ShardSettings, agreed_layout, format_range
from pgjournal.shards.move_plan import owned
from pgjournal.shards.record import first_layout, read_record_step, write_first_record_step
from pgjournal.store import shard_layout as sql


def migrate_all(shards: ShardSettings, settings: Settings | None = None) -> Layout:
    """Migrate every database (in range order), record the layout where it is not recorded, and give every
    database the guards of its ranges (section 6); the layout. Databases that Akka R2DBC's data partitions spread
    its journal over are adopted, each with its run of ``event_journal_<p>`` tables
    (:func:`pgjournal.admin.adopt.inspect`).

    Every database must answer before anything changes (:class:`DatabaseUnavailable` naming it). A database
    holding rows outside its range refuses the first recording (:class:`ConfigurationError`: move them
    first). Running it again after an interruption finishes the job; a recorded layout other than the
    settings' is :class:`ShardLayoutMismatch`.
    """
    loaded = settings or Settings.load()
    for index, dsn in enumerate(shards.dsns):  # all reachable first: a server that is down changes nothing
        try:
            connect(dsn, loaded, doing="migrate").close()
        except DatabaseUnavailable as exc:
            raise type(exc)(f"the database of slices {format_range(shards.ranges[index])}: {exc}; nothing was "
                            "migrated") from None
    count = len(shards.dsns)
    for index, dsn in enumerate(shards.dsns):  # every Akka schema adoptable before any database changes
        refused = [step.detail for step in migrations.plan(dsn, loaded.dialect, (index, count))
                   if step.action == "refuse"]
        if refused:
            raise SchemaNotMigrated(f"the database of {shards.where(index)} cannot be migrated: "
                                    f"{'; '.join(refused)}; nothing was migrated")
    for index, dsn in enumerate(shards.dsns):
        migrations.upgrade(dsn, loaded.dialect, (index, count))
    records: list[Record | None] = []
    for dsn in shards.dsns:
        with connect(dsn, loaded, doing="migrate") as conn:
            records.append(run(read_record_step(), conn))
    layout = first_layout(shards, records)
    missing = [index for index, record in enumerate(records) if record is None]
    for index in missing:  # every database checked before any is recorded
        with connect(shards.dsns[index], loaded, doing="migrate") as conn:
            _check_no_stray_rows(shards, index, conn)
    for index in missing:
        with connect(shards.dsns[index], loaded, doing="migrate") as conn:
            written = run(write_first_record_step(layout, index), conn)
        if written is None or written.layout != layout:
            raise ShardLayoutMismatch(f"another process recorded a different layout in {shards.where(index)} "
                                      "meanwhile; run the migration again")
        records[index] = written
    layout = agreed_layout(shards, records)
    for index, dsn in enumerate(shards.dsns):  # after the records: a guard follows the recorded layout
        with connect(dsn, loaded, doing="migrate") as conn, conn.transaction():
            install_guards(conn, owned(layout, layout.members[index][1]))
    return layout


def _check_no_stray_rows(shards: ShardSettings, index: int, conn: psycopg.Connection) -> None:
    low, high = shards.ranges[index]
    for table in sql.SLICED_TABLES:
        stray = sql.slice_outside(table, low, high).one(conn)
        if stray is not None:
            raise ConfigurationError(
                f"the database of {shards.where(index)} holds rows of slice {stray} in {table}, outside its "
                f"range {format_range((low, high))}: move them to the database of their range before recording "
                "the layout (no layout was recorded)")
