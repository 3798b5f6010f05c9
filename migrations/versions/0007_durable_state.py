"""Durable state: Akka Persistence R2DBC's ``durable_state`` table and its slice index.

Revision ID: 0007
Revises: 0006 (0005 while 0006 is not in this tree)
"""

from pathlib import Path

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.schema import STATE_TABLES

revision = "0007"
# Issue 20 numbers this revision after a 0006 that another branch adds. Until both are merged it follows
# whichever of the two is here, so that either branch alone migrates; the merge can make this "0006".
down_revision = "0006" if any(Path(__file__).parent.glob("0006_*.py")) else "0005"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in STATE_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(STATE_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name}")
