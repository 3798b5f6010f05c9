"""Batched tag writers: tag_batch_writers, the running batched tag writers' heartbeats and watermarks
(pgjournal.write.tag_batcher).

Revision ID: 0008
Revises: 0007
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import TAG_BATCH_TABLES

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in TAG_BATCH_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(TAG_BATCH_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name}")
