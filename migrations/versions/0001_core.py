"""Core tables: event_journal, snapshot, projection offset store and management.

The tables are built from :mod:`pgjournal.store.schema` as it stands at this revision. A later revision that
changes one of them must first freeze this file (copy the definitions here) before editing the model;
``tests/admin/test_migrations.py`` fails if head and the model disagree.

Revision ID: 0001
Revises:
"""

from alembic import op

from pgjournal.dialects import Dialect
from pgjournal.store.schema import CORE_TABLES

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

#: Indexes of the model that later revisions create (0009: the tagged events' index).
LATER_INDEXES = frozenset({"event_journal_tagged_idx"})


def upgrade(dialect: Dialect) -> None:
    for table in CORE_TABLES:
        for statement in dialect.create_table(table, without=LATER_INDEXES):
            op.execute(statement)


def downgrade(dialect: Dialect) -> None:
    for table in reversed(CORE_TABLES):
        op.execute(f"DROP TABLE IF EXISTS {table.name} CASCADE")
