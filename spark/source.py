"""A native Spark data source for the journal (PySpark's Python Data Source API), no JDBC jar needed: the
source's public names, from the modules that hold them.

``spark.read.format("pgjournal").option("entityType", "Cart").option("sliceRanges", 8).load()`` reads
``event_journal`` with one input partition per slice range; ``.option("table", "durable_state")`` reads the
durable state table the same way (each persistence id's latest state); ``spark.readStream.format("pgjournal")``
streams it. The source is written in layers, each module holding one:

- :mod:`spark.schema`: the tables' columns and Spark types, the decoded payload's struct, a given schema checked;
- :mod:`spark.options`: the options, checked without a database (:class:`SourceOptions`), and the registry a
  read decodes with;
- :mod:`spark.planning`: every database of a read opened and checked on the driver, the horizon that bounds a
  batch read, the read's schema;
- :mod:`spark.filters`: the filters pushed into the SQL, and the partitions slice filters drop;
- :mod:`spark.batch`: the batch reader and its partitions; :mod:`spark.stream`: the stream reader;
- :mod:`spark.arrow` (rows into Arrow batches) and :mod:`spark.decode` (payloads) for both;
- :mod:`spark.datasource`: the data source Spark sees, and its registration.

The statements come from the store layer (:class:`pgjournal.store.export.ExportSQL`).
"""

from __future__ import annotations

from .batch import JournalBatchReader, RangePartition, read_partition
from .filters import PUSHDOWN_CONF, PushedFilters
from .options import OPTIONS, SourceOptions, describe_ranges, parse_slice_ranges_option, reading_registry
from .planning import PlannedDatabase, close_planned, export_store, horizon_tracker, plan, plan_databases, source_schema
from .schema import COLUMN_TYPES, DECODED, FORMAT, read_columns

__all__ = [
    "COLUMN_TYPES",
    "DECODED",
    "FORMAT",
    "OPTIONS",
    "PUSHDOWN_CONF",
    "JournalBatchReader",
    "PlannedDatabase",
    "PushedFilters",
    "RangePartition",
    "SourceOptions",
    "close_planned",
    "describe_ranges",
    "export_store",
    "horizon_tracker",
    "parse_slice_ranges_option",
    "plan",
    "plan_databases",
    "read_columns",
    "read_partition",
    "reading_registry",
    "source_schema",
]
