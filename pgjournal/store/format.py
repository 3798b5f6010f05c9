"""SQL of the facts a database records about how its data is stored: ``pgjournal_format`` (markers written by
migrations, see :mod:`pgjournal.admin.stored_format`), the payload columns Akka's JSONB option made JSONB, and
``tag_settings`` (the tag view's bucket size, fixed once tagged events exist, see :mod:`pgjournal.buckets`; the
tag writer, see :mod:`pgjournal.tags.writer_mode`)."""

from __future__ import annotations

from dataclasses import dataclass

from pgjournal.store import Query, Read, rows, scalars, tables
from pgjournal.store.catalog import table_exists

FORMAT_TABLE = tables.PGJOURNAL_FORMAT
TAG_SETTINGS_TABLE = tables.TAG_SETTINGS

# Payload columns Akka's ``payload-column-type = JSONB`` turns into JSONB (any table of the journal layout).
JSONB_COLUMNS_SQL = """
SELECT DISTINCT c.relname || '.' || a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = to_regnamespace(current_schema()) AND a.attnum > 0 AND NOT a.attisdropped
  AND a.atttypid = 'jsonb'::regtype
  AND ((c.relname ~ '^event_journal(_[0-9]+)?$' AND a.attname IN ('event_payload', 'meta_payload'))
    OR (c.relname = 'snapshot' AND a.attname IN ('snapshot', 'meta_payload')))"""


@dataclass(frozen=True, slots=True)
class Marker:
    """A row of ``pgjournal_format``."""

    name: str
    value: str


def jsonb_columns() -> Read[str]:
    """``table.column`` of each payload column that is JSONB."""
    return scalars(JSONB_COLUMNS_SQL)


def format_table_exists() -> Read[bool]:
    """Whether ``pgjournal_format`` exists (a journal Akka created has none)."""
    return table_exists(FORMAT_TABLE)


def markers() -> Read[Marker]:
    return rows(Marker, f"SELECT name, value FROM {FORMAT_TABLE}")


def tag_setting(name: str) -> Read[str]:
    """One row (or none): the recorded value of a tag view setting."""
    return scalars(f"SELECT value FROM {TAG_SETTINGS_TABLE} WHERE name = %s", (name,))


def record_tag_setting(name: str, value: str) -> Query:
    """Record ``value`` unless the setting is recorded already."""
    return (f"INSERT INTO {TAG_SETTINGS_TABLE} (name, value) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
            (name, value))


def set_tag_setting(name: str, value: str) -> Query:
    """Record ``value`` whatever was recorded (an operator's change, every writer stopped)."""
    return (f"INSERT INTO {TAG_SETTINGS_TABLE} (name, value) VALUES (%s, %s) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))
