"""CockroachDB: no LISTEN/NOTIFY, serialization failures (40001) are normal and retried by the client.

Keys and indexes (reviewed, not run here):

* ``event_journal``: primary key ``(persistence_id, seq_nr)`` (Akka's): per-pid reads and appends are a
  seek, and pids spread over ranges by their key.
* ``event_journal_slice_idx`` ``(entity_type, db_timestamp, seq_nr, slice)``, hash-sharded: the by-slice page
  (``entity_type = ? AND slice = ANY(...) AND db_timestamp >= ? ... ORDER BY db_timestamp, seq_nr LIMIT n``)
  seeks to its timestamp and stops after ``n`` matching rows, with the slice filtered inside the index; the
  hash shard keeps appends (always at the newest timestamp) from all landing on the last range of the index,
  Cockroach's advice for sequential keys. ``deleted`` is stored in the index, so the filter needs no lookup.
* ``event_journal_tagged_idx``: the same key over the tagged events only (a partial index, ``WHERE tags IS NOT
  NULL``), storing ``tags`` too, so the tag filter of a filtered by-slice page is checked inside the index.
* ``projection_timestamp_offset_store``: Akka Projection's key, slice first: a slice's rows of a projection
  (``slice = ? AND projection_name = ? AND timestamp_offset >= ?``) are one seek.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgjournal.dialects.base import Dialect

if TYPE_CHECKING:  # the DDL's table model: SQLAlchemy is imported only where DDL is made
    from sqlalchemy import Index, Table

SHARD_BUCKETS = 16
INDEXES = {
    "event_journal_slice_idx": "CREATE INDEX event_journal_slice_idx ON event_journal (entity_type, db_timestamp, "
                               f"seq_nr, slice) USING HASH WITH (bucket_count = {SHARD_BUCKETS}) STORING (deleted)",
    "event_journal_tagged_idx": "CREATE INDEX event_journal_tagged_idx ON event_journal (entity_type, db_timestamp, "
                                f"seq_nr, slice) USING HASH WITH (bucket_count = {SHARD_BUCKETS}) "
                                "STORING (deleted, tags) WHERE tags IS NOT NULL",
}


class CockroachDialect(Dialect):
    name = "cockroach"
    supports_notify = False
    supports_visibility_horizon = False

    def slice_condition(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, object]]:
        # Filtered inside event_journal_slice_idx, whose order the page reads (see above).
        return "slice = ANY(%(slices)s)", {"slices": list(range(min_slice, max_slice + 1))}

    def create_table(self, table: Table, *, without: frozenset[str] = frozenset()) -> list[str]:
        statements = super().create_table(table, without=without)
        if table.name == "event_journal":
            statements[0] = statements[0].replace(
                "PRIMARY KEY (persistence_id, seq_nr, slice)", "PRIMARY KEY (persistence_id, seq_nr)"
            )
        return statements

    def create_index(self, index: Index) -> str:
        return INDEXES.get(index.name or "") or super().create_index(index)
