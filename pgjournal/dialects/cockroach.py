"""CockroachDB: no LISTEN/NOTIFY, serialization failures (40001) are normal and retried by the client."""

from __future__ import annotations

from sqlalchemy import Table

from .base import Dialect


class CockroachDialect(Dialect):
    name = "cockroach"
    supports_notify = False
    supports_visibility_horizon = False

    def slice_condition(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, object]]:
        # A list of slices becomes one index span per slice instead of a filtered range.
        return "slice = ANY(%(slices)s)", {"slices": list(range(min_slice, max_slice + 1))}

    def create_table(self, table: Table) -> list[str]:
        statements = super().create_table(table)
        if table.name == "event_journal":
            statements[0] = statements[0].replace(
                "PRIMARY KEY (persistence_id, seq_nr, slice)", "PRIMARY KEY (persistence_id, seq_nr)"
            )
        return statements
