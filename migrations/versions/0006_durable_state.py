"""Durable state: Akka Persistence R2DBC's ``durable_state`` table and its slice index.

Revision ID: 0006
Revises: 0005
"""

from alembic import context, op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import STATE_TABLES

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in STATE_TABLES:
        # An adopted Akka database may have its own durable_state already (same columns): keep it. (Printing
        # the DDL with --sql has no database to ask.)
        if not context.is_offline_mode() and op.get_bind().exec_driver_sql(
                f"SELECT to_regclass('{table.name}')").scalar() is not None:
            continue
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(STATE_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name}")
