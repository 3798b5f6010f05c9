"""Projection dead letters: projection_dead_letter (envelopes a projection could not handle or decode).

Built from :mod:`pgjournal.store.schema` as it stands at this revision (freeze the definitions here before a
later revision changes them).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import DEAD_LETTER_TABLES

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in DEAD_LETTER_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(DEAD_LETTER_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name} CASCADE")
