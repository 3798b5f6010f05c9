"""The dialect interface and the DDL every dialect starts from (PostgreSQL's)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pgjournal.errors import ConfigurationError
from pgjournal.model.slices import NUMBER_OF_SLICES
from pgjournal.store.durable_state import DurableStateSQL
from pgjournal.store.events import EventStore
from pgjournal.store.export import ExportSQL

if TYPE_CHECKING:  # SQLAlchemy is imported where DDL is made, never by a journal that only reads and writes
    from sqlalchemy import Index, Table

@functools.cache
def _pg() -> Any:
    from sqlalchemy.dialects import postgresql

    return postgresql.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's dialect class is not annotated


class Dialect:
    """PostgreSQL-compatible SQL with hooks for what a distributed database does differently."""

    name = "postgres"
    #: LISTEN/NOTIFY wake-ups for live queries.
    supports_notify = True
    #: ``pg_locks`` shows the transactions that hold a write lock on the journal (the visibility horizon).
    supports_visibility_horizon = True
    #: SQLSTATEs after which a whole transaction may simply be run again: a serialization failure, a deadlock,
    #: and a full shared lock table (53200: under SERIALIZABLE, the predicate locks of finished transactions are
    #: kept while an older serializable transaction is open, and freed when it ends).
    retryable_sqlstates: frozenset[str] = frozenset({"40001", "40P01", "53200"})
    #: An adopted Akka R2DBC journal (:mod:`pgjournal.admin.adopt`): 0 = pgjournal's own layout; n >= 1 = Akka's
    #: plain ``event_journal`` (1) or its data partitions ``event_journal_0..n-1``. Set when a journal opens.
    akka_partitions: int = 0

    def use_akka_layout(self, partitions: int) -> None:
        """Read and write Akka's tables as they are (recorded in ``pgjournal_format`` by the adoption)."""
        if partitions < 1 or NUMBER_OF_SLICES % partitions:
            raise ConfigurationError(f"Akka's data partitions must divide {NUMBER_OF_SLICES}, got {partitions!r} "
                                     "(pgjournal_format.akka_data_partitions)")
        self.akka_partitions = partitions

    # -- queries -------------------------------------------------------------------------------------

    def slice_condition(self, min_slice: int, max_slice: int) -> tuple[str, dict[str, object]]:
        """SQL (named placeholders) that keeps ``slice`` in ``min_slice..max_slice``, and its parameters.

        ``BETWEEN`` lets PostgreSQL prune the slice-range partitions at plan time.
        """
        return "slice BETWEEN %(min_slice)s AND %(max_slice)s", {"min_slice": min_slice, "max_slice": max_slice}

    def event_table(self, slice_: int) -> str:
        """The table to read or write one persistence id's events in (its slice is known)."""
        if self.akka_partitions > 1:  # Akka's data partitions: slices split evenly over the tables
            return f"event_journal_{slice_ // (NUMBER_OF_SLICES // self.akka_partitions)}"
        return "event_journal"

    def batch_table(self, slice_: int) -> str:
        """The table a statement over several persistence ids' events goes to (one statement for them all,
        where :meth:`event_table` would take one per table): the table the database routes to the slice's
        partition, or :meth:`event_table`'s where nothing routes."""
        return self.event_table(slice_)

    def event_store(self, jsonb: frozenset[str] = frozenset()) -> EventStore:
        """The SQL over the journal table in this dialect (see :mod:`pgjournal.store`); ``jsonb``: the
        payload columns (``event_payload``, ``meta_payload``) that are JSONB."""
        return EventStore(self, jsonb=jsonb)

    def durable_state_store(self) -> DurableStateSQL:
        """The SQL over the durable state table in this dialect."""
        return DurableStateSQL(self)

    def export_store(self, table: str = "event_journal", jsonb: frozenset[str] = frozenset()) -> ExportSQL:
        """The bulk reads by slice range of ``event_journal`` or ``durable_state`` (Spark's native source);
        ``jsonb``: the table's payload columns that are JSONB."""
        return ExportSQL(self, table, jsonb)

    # -- DDL -----------------------------------------------------------------------------------------

    def create_table(self, table: Table, *, without: frozenset[str] = frozenset()) -> list[str]:
        """The table and its indexes, but for the indexes named in ``without`` (a later revision's)."""
        from sqlalchemy.schema import CreateTable

        return [str(CreateTable(table).compile(dialect=_pg())).strip()] + [
            self.create_index(index) for index in sorted(table.indexes, key=lambda i: i.name or "")
            if index.name not in without
        ]

    def create_index(self, index: Index) -> str:
        from sqlalchemy.schema import CreateIndex

        return str(CreateIndex(index).compile(dialect=_pg())).strip()
