"""The tagged events' index: event_journal_tagged_idx, the by-slice order over the events that carry tags
(a partial index), which a by-slice query filtered by tag walks (pgjournal.store.events.TAGGED).

On PostgreSQL the index is created on the partitioned table (and so on each partition) in one statement,
which blocks appends while it is built: on a large journal, build it beforehand per partition with
``CREATE INDEX CONCURRENTLY`` and attach those to an index created ``ON ONLY event_journal``. An adopted Akka
journal is left as it is (pgjournal adds no index to Akka's tables): its filtered queries run without it.

Revision ID: 0009
Revises: 0008
"""

from alembic import context, op

from pgjournal.admin.stored_format import AKKA_LAYOUT, EVENT_LAYOUT, FORMAT_TABLE
from pgjournal.dialects import Dialect
from pgjournal.store.schema import TAGGED_INDEX

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade(dialect: Dialect) -> None:
    # (Printing the DDL with --sql has no database to ask: a new database's.)
    if not context.is_offline_mode() and op.get_bind().exec_driver_sql(
            f"SELECT 1 FROM {FORMAT_TABLE} WHERE name = '{EVENT_LAYOUT}' AND value = '{AKKA_LAYOUT}'").scalar():
        return
    op.execute(dialect.create_index(TAGGED_INDEX).replace("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1))


def downgrade(dialect: Dialect) -> None:
    op.execute(f"DROP INDEX IF EXISTS {TAGGED_INDEX.name}")
