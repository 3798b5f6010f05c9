"""YugabyteDB (YSQL): hash-sharded primary key, range-sharded slice index split at slice boundaries."""

from __future__ import annotations

from sqlalchemy import Index, Table

from ..slices import NUMBER_OF_SLICES
from .base import Dialect

SPLIT_POINTS = ", ".join(f"({s})" for s in range(127, NUMBER_OF_SLICES - 1, 128))


class YugabyteDialect(Dialect):
    name = "yugabyte"
    supports_notify = False
    supports_visibility_horizon = False

    def create_table(self, table: Table) -> list[str]:
        statements = super().create_table(table)
        if table.name == "event_journal":
            statements[0] = statements[0].replace(
                "PRIMARY KEY (persistence_id, seq_nr, slice)", "PRIMARY KEY (persistence_id HASH, seq_nr ASC)"
            )
        return statements

    def create_index(self, index: Index) -> str:
        if index.name == "event_journal_slice_idx":
            return (
                "CREATE INDEX event_journal_slice_idx ON event_journal "
                "(slice ASC, entity_type ASC, db_timestamp ASC, seq_nr ASC) "
                f"SPLIT AT VALUES ({SPLIT_POINTS})"
            )
        return super().create_index(index)
