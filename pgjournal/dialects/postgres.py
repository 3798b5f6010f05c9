"""PostgreSQL: ``event_journal`` is partitioned by slice range.

Rows are written in time order, so without partitioning every slice range touches nearly every heap
page: k parallel readers (Spark partitions, projection workers) would read the table k times. With one
partition per 128 slices, a reader of ``slice_ranges(n)`` for n <= 8 touches only its own partitions,
and a page of a range is an ordered index scan (merge-appended across partitions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgjournal.dialects.base import Dialect
from pgjournal.model.slices import NUMBER_OF_SLICES

if TYPE_CHECKING:  # the DDL's table model: SQLAlchemy is imported only where DDL is made
    from sqlalchemy import Table

PARTITIONS = 8
SLICES_PER_PARTITION = NUMBER_OF_SLICES // PARTITIONS


def partition_name(index: int) -> str:
    lo = index * SLICES_PER_PARTITION
    return f"event_journal_s{lo:04d}_{lo + SLICES_PER_PARTITION - 1:04d}"


class PostgresDialect(Dialect):
    name = "postgres"

    def event_table(self, slice_: int) -> str:
        if self.akka_partitions:  # an adopted Akka journal is not partitioned by pgjournal
            return super().event_table(slice_)
        # Naming the partition spares the planner the partition pruning, which costs more than the
        # single-row statement itself (EXPLAIN ANALYZE: planning time above execution time).
        return partition_name(slice_ // SLICES_PER_PARTITION)

    def batch_table(self, slice_: int) -> str:
        # The partitioned table routes each row (and prunes a per-row lookup at run time): one statement where
        # naming the partitions takes one per partition (the replicator's batches: python -m bench
        # replication-throughput).
        return super().event_table(slice_)

    def create_table(self, table: Table, *, without: frozenset[str] = frozenset()) -> list[str]:
        statements = super().create_table(table, without=without)
        if table.name != "event_journal":
            return statements
        create, *indexes = statements
        partitions = [
            f"CREATE TABLE {partition_name(i)} PARTITION OF event_journal "
            f"FOR VALUES FROM ({i * SLICES_PER_PARTITION}) TO ({(i + 1) * SLICES_PER_PARTITION})"
            for i in range(PARTITIONS)
        ]
        return [f"{create} PARTITION BY RANGE (slice)", *partitions, *indexes]
