"""Akka's serializer ids: pgjournal writes JSON as 31 from now on; a database that holds rows with id 33
(pgjournal's JSON before this revision) is marked so that they keep reading as JSON.

Creates ``pgjournal_format`` and records ``legacy_json_ser_id = 33`` when any payload column (events,
their metadata, snapshots, tag views) has id 33. Rows are not rewritten: why a marker and not an UPDATE is
in :mod:`pgjournal.admin.stored_format`.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

from pgjournal.admin.stored_format import FORMAT_TABLE, LEGACY_JSON_SER_ID
from pgjournal.dialects import Dialect
from pgjournal.store.schema import FORMAT_TABLES

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# (table, ser_id column) pairs of the payloads written before this revision (0001-0003 created them).
_PAYLOAD_COLUMNS = (
    ("event_journal", "event_ser_id"), ("event_journal", "meta_ser_id"), ("snapshot", "ser_id"),
    ("snapshot", "meta_ser_id"), ("tag_views", "ser_id"), ("tag_views", "meta_ser_id"),
)


def upgrade(dialect: Dialect) -> None:
    for table in FORMAT_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)
    holds_33 = " OR ".join(f"EXISTS (SELECT 1 FROM {table} WHERE {column} = 33)" for table, column in _PAYLOAD_COLUMNS)
    op.execute(f"INSERT INTO {FORMAT_TABLE} (name, value) SELECT '{LEGACY_JSON_SER_ID}', '33' WHERE {holds_33}")


def downgrade(dialect: Dialect) -> None:
    op.execute(f"DROP TABLE IF EXISTS {FORMAT_TABLE}")
