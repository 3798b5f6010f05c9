"""``pgjournal migrate`` on every database of a sharded journal, then the layout record (docs/sharding.md,
sections 3 and 5)."""

from __future__ import annotations

import psycopg

from pgjournal.admin import migrate as migrations
from pgjournal.errors import ConfigurationError, DatabaseUnavailable, SchemaNotMigrated, ShardLayoutMismatch
from pgjournal.runtime.steps import run
from pgjournal.server.connections import connect
from pgjournal.server.dsn import mask_dsn
from pgjournal.settings import Settings
from pgjournal.shards.guards import install_guards
from pgjournal.shards.layout import Layout, Record, ShardSettings, agreed_layout, format_range
from pgjournal.shards.move_plan import owned
from pgjournal.shards.record import first_layout, read_record_step, write_first_record_step
from pgjournal.shards.routing import Known, opening_routing
from pgjournal.store import shard_layout as sql


def migrate_all(shards: ShardSettings, settings: Settings | None = None) -> Layout:
    """:func:`migrate_resolved`'s layout."""
    return migrate_resolved(shards, settings)[0]


def migrate_resolved(shards: ShardSettings, settings: Settings | None = None) -> tuple[Layout, ShardSettings]:
    """Migrate every database (in range order, then the spares), record the layout where it is not recorded, and
    give every database the guards of its ranges (section 6); the layout. Databases that Akka R2DBC's data
    partitions spread its journal over are adopted, each with its run of ``event_journal_<p>`` tables
    (:func:`pgjournal.admin.adopt.inspect`). A spare gets the schema only (no record, no guards: a move's target
    records its layout when the move plans it).

    Every database must answer before anything changes (:class:`DatabaseUnavailable` naming it). A database
    holding rows outside its range refuses the first recording (:class:`ConfigurationError`: move them
    first). Running it again after an interruption finishes the job; a recorded layout other than the
    settings' is :class:`ShardLayoutMismatch`, except settings a move left behind whose spares reach every
    database of the recorded layout: those are resolved as ``ShardedJournal.open`` resolves them
    (:func:`~pgjournal.shards.routing.opening_routing`) and the recorded layout is migrated. Returns the layout
    and the settings migrated (``shards``, or those resolved), ``dsns[i]`` holding ``layout.members[i]``.
    """
    loaded = settings or Settings.load()
    for index, dsn in enumerate(shards.dsns):  # all reachable first: a server that is down changes nothing
        try:
            connect(dsn, loaded, doing="migrate").close()
        except DatabaseUnavailable as exc:
            raise type(exc)(f"the database of slices {format_range(shards.ranges[index])}: {exc}; nothing was "
                            "migrated") from None
    for dsn in shards.spares:
        try:
            connect(dsn, loaded, doing="migrate").close()
        except DatabaseUnavailable as exc:
            raise type(exc)(f"the spare database {mask_dsn(dsn)}: {exc}; nothing was migrated") from None
    count = len(shards.dsns)
    for index, dsn in enumerate(shards.dsns):  # every Akka schema adoptable before any database changes
        refused = [step.detail for step in migrations.plan(dsn, loaded.dialect, (index, count))
                   if step.action == "refuse"]
        if refused:
            raise SchemaNotMigrated(f"the database of {shards.where(index)} cannot be migrated: "
                                    f"{'; '.join(refused)}; nothing was migrated")
    for dsn in shards.spares:
        refused = [step.detail for step in migrations.plan(dsn, loaded.dialect) if step.action == "refuse"]
        if refused:
            raise SchemaNotMigrated(f"the spare database {mask_dsn(dsn)} cannot be migrated: "
                                    f"{'; '.join(refused)}; nothing was migrated")
    for index, dsn in enumerate(shards.dsns):
        migrations.upgrade(dsn, loaded.dialect, (index, count))
    for dsn in shards.spares:
        migrations.upgrade(dsn, loaded.dialect)
    records: list[Record | None] = []
    for dsn in shards.dsns:
        with connect(dsn, loaded, doing="migrate") as conn:
            records.append(run(read_record_step(), conn))
    shards, records = _left_behind(shards, records, loaded)
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
    return layout, shards


def _left_behind(shards: ShardSettings, records: list[Record | None], settings: Settings
                 ) -> tuple[ShardSettings, list[Record | None]]:
    """The settings to migrate and their databases' records: ``shards`` as given, or, when every database of them
    records a layout other than theirs and the spares reach every database of the recorded one (settings a move
    left behind), the settings of the recorded layout, resolved by the rule ``ShardedJournal.open`` follows."""
    if not shards.spares or any(record is None for record in records):
        return shards, records
    try:
        agreed_layout(shards, records)
        return shards, records
    except ShardLayoutMismatch:
        pass
    spares: list[Record | None] = []
    for dsn in shards.spares:
        with connect(dsn, settings, doing="migrate") as conn:
            spares.append(run(read_record_step(), conn))
    every = [*records, *spares]
    dsns = [*shards.dsns, *shards.spares]
    # The databases stand for themselves here (no journal is opened): the routing names the DSN of each range.
    routing = opening_routing(shards, [Known(dsn, dsn) for dsn in dsns], every)
    by_dsn = dict(zip(dsns, every, strict=True))
    return routing.shards, [by_dsn[dsn] for dsn in routing.shards.dsns]


def _check_no_stray_rows(shards: ShardSettings, index: int, conn: psycopg.Connection) -> None:
    low, high = shards.ranges[index]
    for table in sql.SLICED_TABLES:
        stray = sql.slice_outside(table, low, high).one(conn)
        if stray is not None:
            raise ConfigurationError(
                f"the database of {shards.where(index)} holds rows of slice {stray} in {table}, outside its "
                f"range {format_range((low, high))}: move them to the database of their range before recording "
                "the layout (no layout was recorded)")
