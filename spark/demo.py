"""The Spark part of ``make demo``: export the journal to Parquet, then aggregate over the Parquet files."""

from __future__ import annotations

import shutil
import tempfile

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgjournal.errors import ConfigurationError

ENABLE = ("to enable it: apt-get install -y openjdk-17-jre-headless libpostgresql-jdbc-java && "
          "pip install 'pgjournal[spark]'")


def run_demo(dsn: str, console: Console) -> None:
    """Export the journal at ``dsn`` with Spark (8 slice-range partitions) and show an aggregate per entity
    type read back from Parquet (timestamps in UTC, the session's zone); or say how to enable Spark when
    Java, the jar or PySpark is missing."""
    from .session import check_spark_available

    try:
        check_spark_available()
    except ConfigurationError as exc:
        console.print(f"[yellow]Spark demo skipped:[/] {escape(str(exc))}\n{escape(ENABLE)}")
        return
    from pyspark.sql import functions as F

    from .jobs import export_events
    from .session import spark_session

    out = tempfile.mkdtemp(prefix="pgjournal-spark-demo-")
    with console.status("starting Spark"):
        spark = spark_session("pgjournal-demo")
    try:
        with console.status("exporting the journal to Parquet with Spark (8 JDBC partitions, one per slice range)"):
            result = export_events(spark, out, dsn=dsn, slice_ranges=8, decode=True)
        console.print(f"Spark exported [bold]{result.rows:,}[/] events to {out} "
                      f"(entity_type=*/slice_range=*/part-*.parquet) in {result.seconds:.1f} s")
        if result.rows == 0:
            return
        events = spark.read.parquet(out)
        summary = (events.groupBy("entity_type")
                   .agg(F.count(F.lit(1)).alias("events"), F.countDistinct("persistence_id").alias("pids"),
                        F.countDistinct("slice_range").alias("ranges"),
                        F.date_format(F.min("db_timestamp"), "yyyy-MM-dd HH:mm:ss").alias("first"),
                        F.date_format(F.max("db_timestamp"), "yyyy-MM-dd HH:mm:ss").alias("last"))
                   .orderBy("entity_type").collect())
        table = Table("entity type", "events", "persistence ids", "slice ranges", "first (UTC)", "last (UTC)",
                      title="Aggregated by Spark from the Parquet export")
        for r in summary:
            table.add_row(r["entity_type"] or "(none)", f"{r['events']:,}", f"{r['pids']:,}", str(r["ranges"]),
                          r["first"], r["last"])
        console.print(table)
        if "event" in events.columns:
            fields = ", ".join(f.name for f in events.schema["event"].dataType.fields[:12])  # type: ignore[attr-defined]
            console.print(f"JSON payloads decoded to a struct column `event` with fields: {fields}")
    finally:
        spark.stop()
        shutil.rmtree(out, ignore_errors=True)
