"""YugabyteDB (YSQL): keys laid out as Akka's Yugabyte DDL lays them out.

In YSQL the first key column of a table or index is hash-sharded unless it says ``ASC``/``DESC``. Reads by
persistence id want a hash (spread writers over tablets), reads by slice range want range sharding on
``slice`` (a slice range is then a few tablets, split at the 128-slice boundaries):

* ``event_journal``: ``(persistence_id HASH, seq_nr ASC)``; the slice index ``(slice ASC, entity_type ASC,
  db_timestamp ASC, seq_nr ASC, persistence_id ASC, deleted ASC)`` split at slice boundaries, carrying the
  page's order and its ``deleted`` filter, as Akka's; ``event_journal_tagged_idx``, the same over the tagged
  events only (partial, ``WHERE tags IS NOT NULL``), including ``tags`` for the filter of a filtered page;
* ``projection_timestamp_offset_store``: its key range-sharded, slice first, split at slice boundaries, as
  Akka Projection's (a range's offsets are one scan of neighbouring tablets);
* ``snapshot``: ``(persistence_id HASH)``, its slice index range-sharded on slice;
* ``projection_lease``: ``(projection_name HASH, slice ASC)``: a projection's slices are one range scan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgjournal.dialects.base import Dialect
from pgjournal.model.slices import NUMBER_OF_SLICES

if TYPE_CHECKING:  # the DDL's table model: SQLAlchemy is imported only where DDL is made
    from sqlalchemy import Index, Table

SPLIT_POINTS = ", ".join(f"({s})" for s in range(127, NUMBER_OF_SLICES - 1, 128))

#: Primary keys with their sharding (tables not named keep PostgreSQL's text: first column hashed).
PRIMARY_KEYS = {
    "event_journal": "persistence_id HASH, seq_nr ASC",
    "snapshot": "persistence_id HASH",
    "projection_timestamp_offset_store": "slice ASC, projection_name ASC, timestamp_offset ASC, persistence_id ASC, "
                                         "seq_nr ASC",
    "projection_lease": "projection_name HASH, slice ASC",
}
#: Tables whose key starts with ``slice ASC``: pre-split at the slice-range boundaries.
SPLIT_TABLES = {"projection_timestamp_offset_store"}
INDEXES = {
    "event_journal_slice_idx": "CREATE INDEX event_journal_slice_idx ON event_journal (slice ASC, entity_type ASC, "
                               "db_timestamp ASC, seq_nr ASC, persistence_id ASC, deleted ASC) "
                               f"SPLIT AT VALUES ({SPLIT_POINTS})",
    "event_journal_tagged_idx": "CREATE INDEX event_journal_tagged_idx ON event_journal (slice ASC, entity_type ASC, "
                                "db_timestamp ASC, seq_nr ASC, persistence_id ASC, deleted ASC) INCLUDE (tags) "
                                f"SPLIT AT VALUES ({SPLIT_POINTS}) WHERE tags IS NOT NULL",
    "snapshot_slice_idx": "CREATE INDEX snapshot_slice_idx ON snapshot (slice ASC, entity_type ASC, db_timestamp ASC, "
                          f"persistence_id ASC) SPLIT AT VALUES ({SPLIT_POINTS})",
}


class YugabyteDialect(Dialect):
    name = "yugabyte"
    supports_notify = False
    supports_visibility_horizon = False

    def create_table(self, table: Table, *, without: frozenset[str] = frozenset()) -> list[str]:
        statements = super().create_table(table, without=without)
        key = PRIMARY_KEYS.get(table.name)
        if key is not None:
            columns = ", ".join(c.name for c in table.primary_key.columns)
            plain = f"PRIMARY KEY ({columns})"
            if plain not in statements[0]:
                raise AssertionError(f"{table.name}: expected {plain} in the generated DDL")
            statements[0] = statements[0].replace(plain, f"PRIMARY KEY ({key})")
        if table.name in SPLIT_TABLES:
            statements[0] = f"{statements[0]} SPLIT AT VALUES ({SPLIT_POINTS})"
        return statements

    def create_index(self, index: Index) -> str:
        return INDEXES.get(index.name or "") or super().create_index(index)
