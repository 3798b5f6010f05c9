"""Projection leases: projection_lease (slice ownership with expiry) and projection_worker (heartbeats).

Built from :mod:`pgjournal.store.schema` as it stands at this revision (freeze the definitions here before a
later revision changes them).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import PROJECTION_TABLES

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in PROJECTION_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(PROJECTION_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name} CASCADE")
