"""Planning a ``format("pgjournal")`` read on Spark's driver: every database of the read opened and checked
before any task runs (the shard layout agreed, the schema there, the entity type known), the table's store for
each (:class:`pgjournal.store.export.ExportSQL`, whose statements the tasks run), the visibility horizon that
bounds a batch read, and the read's schema, which Spark asks for at ``load()``.

The upper bound of a batch read is the visibility horizon (:mod:`pgjournal.core.horizon`) of the table's
writers, settled once while Spark plans the read: every partition reads below the same bound, so the result is
a consistent, final set that a later read only adds to. Of a sharded journal, each database's horizon bounds
its own partitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.errors import ConfigurationError, SchemaNotMigrated
from pgjournal.server.dsn import mask_dsn
from pgjournal.store.export import EVENTS, TABLES, ExportSQL

from .decode import REDACTED
from .options import SourceOptions
from .schema import COLUMN_TYPES, infer_payload_ddl, payload_struct_ddl

if TYPE_CHECKING:
    from pgjournal import Journal
    from pgjournal.core.horizon import HorizonTracker
    from pgjournal.core.replica import ReplicaHorizon


def export_store(journal: Journal, table: str) -> ExportSQL:
    """The store of bulk reads of ``table`` for ``journal``'s database (its dialect and payload column types)."""
    payload = TABLES[table].serialized[2]
    return journal.dialect.export_store(table, frozenset({payload} if journal.stored.jsonb(payload, table) else ()))


def horizon_tracker(journal: Journal, table: str) -> HorizonTracker | ReplicaHorizon:
    """The visibility horizon of ``table``'s writers (journal writers, or durable state writers) for a reader of
    ``journal.read_connection()``: on a standby, the primary's, once the standby has replayed it."""
    if table == EVENTS.name:
        return journal.reader_horizon()
    capabilities = journal.capabilities
    if capabilities.writer_horizon and not capabilities.state_relations:
        raise SchemaNotMigrated(f"the database has no {table} table; run `pgjournal migrate`")
    return journal.reader_horizon(capabilities.state_relations)


def check_entity_type_known(conn: psycopg.Connection, store: ExportSQL, entity_type: str | None, dsn: str) -> None:
    """Raise :class:`ConfigurationError` when ``entity_type`` has no row in the table (a typo, mostly)."""
    if entity_type is None or conn.execute(*store.has_entity_type(entity_type)).fetchone():
        return
    known = [r[0] for r in conn.execute(*store.entity_types(20)).fetchall()]
    what = "events in the journal" if store.table is EVENTS else f"rows in {store.table.name}"
    raise ConfigurationError(
        f"entity type {entity_type!r} has no {what} at {mask_dsn(dsn)}; entity types there: "
        + (", ".join(repr(k) for k in known) if known else f"none ({store.table.name} is empty)"))


@dataclass
class PlannedDatabase:
    """One database of a read, planned: its DSN, the read's slice ranges it holds, its planning journal and the
    table's store there."""

    dsn: str
    ranges: tuple[tuple[int, int], ...]
    journal: Journal
    store: ExportSQL


def plan_databases(options: SourceOptions, serializers: SerializerRegistry | None = None
                   ) -> list[PlannedDatabase]:
    """Every database of the read (one, or those of option shards holding its ranges), after the checks that
    must fail before any task runs: the shard layout agreed, no database unreachable or without schema, the
    entity type known in one of them. The journals' ``serializers`` are what the read decodes with (the stored
    format read once, here). The caller closes the journals (:func:`close_planned`)."""
    options.check_layout()
    planned: list[PlannedDatabase] = []
    try:
        for dsn, ranges in options.databases():
            journal = options.open_journal_at(dsn, serializers)
            try:
                store = export_store(journal, options.table).with_tags(options.tags)
                horizon_tracker(journal, options.table)
            except BaseException:
                journal.close()
                raise
            planned.append(PlannedDatabase(dsn, ranges, journal, store))
        unknown: list[ConfigurationError] = []
        for database in planned:
            with database.journal.connection() as conn:
                try:
                    check_entity_type_known(conn, database.store, options.entity_type, database.dsn)
                except ConfigurationError as exc:
                    unknown.append(exc)
        if len(unknown) == len(planned) == 1:
            raise unknown[0]
        if unknown and len(unknown) == len(planned):
            raise ConfigurationError(f"in none of the {len(planned)} databases of the sharded journal: {unknown[0]}")
    except BaseException:
        close_planned(planned)
        raise
    return planned


def close_planned(planned: Sequence[PlannedDatabase]) -> None:
    for database in planned:
        database.journal.close()


def plan(options: SourceOptions, serializers: SerializerRegistry | None = None) -> tuple[Journal, ExportSQL]:
    """:func:`plan_databases`, keeping the first database's journal and store (the only ones of a read of one
    database). The caller closes the journal."""
    planned = plan_databases(options, serializers)
    close_planned(planned[1:])
    return planned[0].journal, planned[0].store


def source_schema(options: SourceOptions, serializers: SerializerRegistry | None = None) -> str:
    """The schema DDL of a read (:meth:`SourceOptions.output_columns`). Spark asks for it at ``load()``, so
    the database checks happen here too: a bad DSN or entity type fails before any task."""
    columns = options.output_columns()
    decoded_ddl = payload_struct_ddl(options.payload_schema) if options.payload_schema is not None else None
    planned = plan_databases(options, serializers)
    try:
        for database in planned:
            if options.decoded not in columns or decoded_ddl is not None:
                break
            with database.journal.connection() as conn:  # a sharded journal: the first database with payloads
                decoded_ddl = infer_payload_ddl(conn, database.store, options.entity_type,
                                                database.journal.serializers)
    finally:
        close_planned(planned)
    types = {**COLUMN_TYPES[options.table], options.decoded: decoded_ddl, REDACTED: "BOOLEAN"}
    return ", ".join(f"{name} {types[name]}" for name in columns if types[name] is not None)
