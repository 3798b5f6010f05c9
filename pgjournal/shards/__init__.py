"""Sharding by slice range over several databases, with Akka R2DBC's data-partition mapping (docs/sharding.md):
``ShardSettings`` name each database's DSN, ``ShardedJournal`` routes by slice, ``migrate_all`` migrates every
database and records the layout."""

from typing import TYPE_CHECKING

from pgjournal.shards.aio import AsyncShardedJournal
from pgjournal.shards.journal import ShardedDurableState, ShardedJournal, ShardedQuery
from pgjournal.shards.layout import (
    SHARDS_ENV,
    Layout,
    Record,
    ShardSettings,
    akka_data_partition,
    akka_database_index,
)
from pgjournal.shards.migrate import migrate_all

if TYPE_CHECKING:  # every face meets its protocol, for the type checker (tests/architecture/test_faces.py: the rest)
    from pgjournal.aio.journal import AsyncJournal
    from pgjournal.faces import AsyncJournalFace, JournalFace
    from pgjournal.journal import Journal

    def _faces(journal: Journal, sharded: ShardedJournal, aio: AsyncJournal, aio_sharded: AsyncShardedJournal
               ) -> tuple[list[JournalFace], list[AsyncJournalFace]]:
        return [journal, sharded], [aio, aio_sharded]

__all__ = [
    "SHARDS_ENV",
    "AsyncShardedJournal",
    "Layout",
    "Record",
    "ShardSettings",
    "ShardedDurableState",
    "ShardedJournal",
    "ShardedQuery",
    "akka_data_partition",
    "akka_database_index",
    "migrate_all",
]
