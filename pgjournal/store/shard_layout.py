"""SQL of the shard layout record (:mod:`pgjournal.shards`, docs/sharding.md): one row per database, the same
layout and version in every database of a sharded journal, and this database's own id.

The table is created by ``migrate_all`` (not by an Alembic revision): a journal on one database never has it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from pgjournal.store import Query, Read, rows, scalars
from pgjournal.store.catalog import table_exists

LAYOUT_TABLE = "pgjournal_shard_layout"
#: The tables whose rows belong to a slice: a database of a layout holds rows of its own ranges only.
SLICED_TABLES = ("event_journal", "snapshot", "durable_state")

# ``one``: a single row per database (the primary key admits only true).
CREATE_SQL = f"""
CREATE TABLE IF NOT EXISTS {LAYOUT_TABLE} (
    one BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    version BIGINT NOT NULL,
    layout TEXT NOT NULL,
    database_id UUID NOT NULL,
    state TEXT NOT NULL DEFAULT 'stable',
    changed_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP)"""


@dataclass(frozen=True, slots=True)
class LayoutRow:
    """The record of one database (columns in SELECT order)."""

    version: int
    layout: str
    database_id: uuid.UUID
    state: str
    changed_at: datetime


def layout_table_exists() -> Read[bool]:
    return table_exists(LAYOUT_TABLE)


def create_layout_table() -> Query:
    return CREATE_SQL, ()


def layout_record() -> Read[LayoutRow]:
    """The database's record (no row: none written yet)."""
    return rows(LayoutRow, f"SELECT version, layout, database_id, state, changed_at FROM {LAYOUT_TABLE}")


def record_first_layout(version: int, layout: str, database_id: uuid.UUID) -> Query:
    """Write the record unless the database has one (the caller re-reads it to see which won)."""
    return (f"INSERT INTO {LAYOUT_TABLE} (version, layout, database_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (one) DO NOTHING", (version, layout, database_id))


def slice_outside(table: str, min_slice: int, max_slice: int) -> Read[int]:
    """One row or none: a slice of ``table`` (one of :data:`SLICED_TABLES`) outside ``min_slice..max_slice``."""
    if table not in SLICED_TABLES:
        raise ValueError(f"not a sliced table: {table!r}")
    return scalars(f"SELECT slice FROM {table} WHERE slice < %s OR slice > %s LIMIT 1", (min_slice, max_slice))
