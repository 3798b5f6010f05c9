"""Payload keys: pgjournal_payload_keys, the wrapped data key per persistence id of encrypted payloads
(pgjournal.state.keystore.PostgresKeyStore).

Revision ID: 0007
Revises: 0006
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import KEY_TABLES

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    for table in KEY_TABLES:
        for statement in dialect.create_table(table):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(KEY_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name}")
