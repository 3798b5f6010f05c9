"""Cassandra-compatible tag path: tag_views, tag_write_progress, tag_scanning, tag_settings.

Built from :mod:`pgjournal.store.schema` as it stands at this revision (freeze the definitions here before a
later revision changes them).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import TAG_TABLES

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in TAG_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(TAG_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name} CASCADE")
