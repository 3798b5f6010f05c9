"""``format("pgjournal")``: the data source Spark sees, joining the batch reader (:mod:`spark.source`) and
the stream reader (:mod:`spark.stream`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .source import FORMAT, PUSHDOWN_CONF, JournalBatchReader, SourceOptions, source_schema
from .stream import JournalStreamReader

try:
    from pyspark.sql.datasource import DataSource
except ImportError:  # pragma: no cover - pgjournal without the spark extra
    DataSource = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


class JournalDataSource(DataSource):
    """``format("pgjournal")``: batch reads (:class:`JournalBatchReader`) and streams
    (:class:`spark.stream.JournalStreamReader`)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return source_schema(self.parsed)

    def reader(self, schema: StructType) -> JournalBatchReader:
        return JournalBatchReader(self.parsed, schema)

    def streamReader(self, schema: StructType) -> JournalStreamReader:
        return JournalStreamReader(self.parsed, schema)


def register(spark: SparkSession) -> None:
    """Make ``format("pgjournal")`` available in ``spark`` (and turn on Python filter pushdown, which
    Spark requires of a source that pushes filters)."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(JournalDataSource)
