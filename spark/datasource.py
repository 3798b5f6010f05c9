"""``format("pgjournal")``: the data source Spark sees, joining the batch reader (:mod:`spark.batch`) and
the stream reader (:mod:`spark.stream`).

Spark pickles the registered class (PySpark's Python Data Source API) and makes an instance of it in a Python
worker for each ``load()``; the readers it returns are pickled again into every task. So the serializer
registry a read decodes with travels as a class attribute of the registered class: :func:`register` with
``serializers=`` registers a subclass that holds it (:func:`source_class`), pickled by Spark then and there.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

from .batch import JournalBatchReader
from .filters import PUSHDOWN_CONF
from .options import SourceOptions
from .planning import source_schema
from .schema import FORMAT
from .shipping import shipped
from .stream import JournalStreamReader

try:
    from pyspark.sql.datasource import DataSource
except ImportError:  # pragma: no cover - pgjournal without the spark extra
    DataSource = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from pgjournal.codec.serialization import SerializerRegistry


class JournalDataSource(DataSource):
    """``format("pgjournal")``: batch reads (:class:`JournalBatchReader`) and streams
    (:class:`spark.stream.JournalStreamReader`), decoding with :attr:`serializers`."""

    #: The registry reads decode with (``None``: a plain one); set by :func:`source_class`.
    serializers: ClassVar[SerializerRegistry | None] = None

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return source_schema(self.parsed, self.serializers)

    def reader(self, schema: StructType) -> JournalBatchReader:
        return JournalBatchReader(self.parsed, schema, self.serializers)

    def streamReader(self, schema: StructType) -> JournalStreamReader:
        return JournalStreamReader(self.parsed, schema, self.serializers)


def source_class(serializers: SerializerRegistry | None) -> type[JournalDataSource]:
    """``JournalDataSource`` decoding with ``serializers``: a subclass made for it (Spark pickles it by value,
    with the registry, because no module holds it by name)."""
    if serializers is None:
        return JournalDataSource
    return type("JournalDataSource", (JournalDataSource,), {"serializers": serializers, "__module__": __name__,
                                                            "__doc__": JournalDataSource.__doc__})


def register(spark: SparkSession, *, serializers: SerializerRegistry | None = None) -> None:
    """Make ``format("pgjournal")`` available in ``spark`` (and turn on Python filter pushdown, which
    Spark requires of a source that pushes filters).

    ``serializers``: the journal's registry, so reads decode as the journal does (upcasters, registered types
    and serializers, a transcoder's key store). It is copied to Spark now: registrations made later, and keys an
    ``InMemoryKeyStore`` makes later, are not seen until ``register`` is called again.
    """
    spark.conf.set(PUSHDOWN_CONF, "true")
    # The source reads its defaults (PGJOURNAL_DSN and the other settings) in Spark's Python workers, whose
    # environment is the one the JVM started with, not the driver's now: the registration carries the driver's
    # PGJOURNAL_* variables to them, as of this call (their options still win).
    spark.sparkContext.environment.update({k: v for k, v in os.environ.items() if k.startswith("PGJOURNAL_")})
    with shipped(serializers, "spark.dataSource.register"):
        spark.dataSource.register(source_class(serializers))
