"""Replication: replication_seen, per replica persistence id and origin replica the highest origin sequence
number held (pgjournal.replication, docs/replication.md).

Revision ID: 0010
Revises: 0009
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import REPLICATION_TABLES

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in REPLICATION_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(REPLICATION_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name}")
