"""Sharding by slice range over several databases, with Akka R2DBC's data-partition mapping (docs/sharding.md):
``ShardSettings`` name each database's DSN, ``ShardedJournal`` routes by slice, ``migrate_all`` migrates every
database and records the layout."""

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
