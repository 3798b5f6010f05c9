"""The batch reader of ``spark.read.format("pgjournal")``: one input partition per slice range (of a sharded
journal, each database's ranges, carrying that database's DSN, so the databases are read in parallel), each
task streaming its range from PostgreSQL into Arrow record batches (:func:`spark.arrow.stream_rows`: a binary
COPY read by the ADBC driver) below the horizon settled at planning (:mod:`spark.planning`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgjournal.codec.serialization import SerializerRegistry

from .arrow import ArrowRows, stream_rows
from .filters import PushedFilters
from .options import SourceOptions
from .planning import close_planned, horizon_tracker, plan_databases
from .schema import read_columns

try:  # the base classes exist only where PySpark is installed; the option parsing works without it
    from pyspark.sql.datasource import DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - pgjournal without the spark extra
    DataSourceReader = object  # type: ignore[assignment,misc]

    @dataclass
    class InputPartition:  # type: ignore[no-redef]
        value: Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.datasource import Filter
    from pyspark.sql.types import StructType


class RangePartition(InputPartition):
    """One slice range of a read, ``lo..hi``, with the statement its task runs (``(sql, params)`` from the
    store, built on the driver); ``None`` when every range was filtered out. ``dsn``: where its rows are read
    (the range's database, or its standby)."""

    def __init__(self, index: int, lo: int, hi: int, query: tuple[str, dict[str, Any]] | None, dsn: str) -> None:
        super().__init__(index)
        self.lo, self.hi, self.query, self.dsn = lo, hi, query, dsn

    def __repr__(self) -> str:
        return f"RangePartition({self.lo}-{self.hi})"


def read_partition(options: SourceOptions, converter: ArrowRows, partition: InputPartition
                   ) -> Iterator[pa.RecordBatch]:
    """A task's rows: its partition's statement through :func:`spark.arrow.stream_rows`."""
    if not isinstance(partition, RangePartition) or partition.query is None:
        return iter(())  # every range was filtered out: Spark still runs one (empty) partition
    sql, params = partition.query
    return stream_rows(partition.dsn, sql, params, converter, options.batch_rows)


class JournalBatchReader(DataSourceReader):
    """Reads each slice range below one horizon settled at planning time; decodes with ``serializers``
    (see :func:`reading_registry`)."""

    def __init__(self, options: SourceOptions, schema: StructType, serializers: SerializerRegistry | None = None
                 ) -> None:
        self.options = options
        self.columns = read_columns(schema, options.table)
        planned = plan_databases(options, serializers)  # fail at planning, before any task runs
        close_planned(planned)
        self.converter = ArrowRows(schema, self.columns, planned[0].journal.serializers)
        #: Each database's DSN, its slice ranges of the read and its store (one unless sharded).
        self.databases = [(database.dsn, database.ranges, database.store) for database in planned]
        self.pushed = PushedFilters(planned[0].store)

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for flt in filters:
            if not self.pushed.push(flt):
                yield flt

    def partitions(self) -> list[InputPartition]:
        """One partition per slice range left by the pushed filters; each database's below its own horizon."""
        partitions: list[InputPartition] = []
        for dsn, ranges, store in self.databases:
            kept = [(lo, hi) for lo, hi in ranges if self.pushed.slices & set(range(lo, hi + 1))]
            if not kept:
                continue
            with self.options.open_journal_at(dsn) as journal, journal.read_connection() as conn:
                bound = horizon_tracker(journal, self.options.table).final_bound(conn)
            if self.options.until is not None:
                bound = min(bound, self.options.until)
            partitions += [RangePartition(len(partitions) + i, lo, hi, store.rows_below(
                self.columns.read, lo, hi, bound, entity_type=self.options.entity_type, since=self.options.since,
                pushed=self.pushed.conditions), self.options.read_dsn(dsn))
                for i, (lo, hi) in enumerate(kept)]
        return partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, self.converter, partition)
