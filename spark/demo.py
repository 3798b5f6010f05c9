"""The Spark part of ``make demo``: export the journal to Parquet by slice range, aggregate over the Parquet
files, then two incremental loads (everything so far, then only what was appended since)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgjournal.errors import ConfigurationError
from pgjournal.store import stats

from .jobs import LoadResult, export_events, load_events
from .system import SKIP_ENV, spark_skipped

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Events appended between the two incremental loads (entity type ``SparkDemo``, outside the carts).
INCREMENT = 300


def run_demo(dsn: str, console: Console) -> bool:
    """Export the journal at ``dsn`` with Spark (8 slice-range partitions), show an aggregate per entity type
    read back from Parquet (timestamps in UTC, the session's zone) and run two incremental loads.

    Returns False when Spark cannot run (setup installs what it needs); with ``PGJOURNAL_SKIP_SPARK`` set it
    says so and returns True.
    """
    from .session import check_spark_available

    if spark_skipped():
        console.print(f"[yellow]Spark step skipped:[/] {SKIP_ENV} is set")
        return True
    try:
        check_spark_available()
    except ConfigurationError as exc:
        console.print(f"[red]Spark step cannot run:[/] {escape(str(exc))}\n`make setup` installs what Spark "
                      f"needs; {SKIP_ENV}=1 skips this step")
        return False
    from pyspark.sql import functions as F

    from .session import spark_session

    work = Path(tempfile.mkdtemp(prefix="pgjournal-spark-demo-"))
    out = str(work / "export")
    with console.status("starting Spark"):
        spark = spark_session("pgjournal-demo")
    try:
        with console.status("exporting the journal to Parquet with Spark (8 JDBC partitions, one per slice range)"):
            result = export_events(spark, out, dsn=dsn, slice_ranges=8, decode=True)
        console.print(f"Spark exported [bold]{result.rows:,}[/] events by slice range ({len(result.slice_ranges)} "
                      f"ranges, one JDBC partition each) to {out} (entity_type=*/slice_range=*/part-*.parquet) "
                      f"in {result.seconds:.1f} s ({result.rows_per_second:,.0f} rows/s)")
        loaded = False
        if result.rows == 0:
            return True
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
        loaded = incremental_loads(spark, dsn, str(work / "loads"), console)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return loaded


def incremental_loads(spark: SparkSession, dsn: str, out: str, console: Console) -> bool:
    """Load 1 takes everything committed so far; after :data:`INCREMENT` more appends, load 2 takes exactly
    those. True when it did."""
    from pgjournal import Journal

    def show(r: LoadResult) -> None:
        rate = r.rows / r.seconds if r.seconds > 0 else 0.0
        console.print(f"incremental load [bold]{r.load_number}[/] of job 'demo': [bold]{r.rows:,}[/] rows in "
                      f"{r.seconds:.1f} s ({rate:,.0f} rows/s), every event below {r.horizon:%H:%M:%S.%f} UTC, "
                      f"in {r.path}")

    with console.status("incremental load 1 (every event committed so far)"):
        show(load_events(spark, out, "demo", dsn=dsn))
    with Journal.open(dsn) as journal:
        for i in range(INCREMENT):
            journal.append(f"SparkDemo|{i % 30}", [{"n": i}])
        with journal.connection() as conn:  # wait until the next horizon is past the last commit
            newest = stats.newest().one(conn)
        if newest is not None and newest.db_timestamp is not None:
            ahead = (newest.db_timestamp - newest.now).total_seconds()  # by the database's clock
            time.sleep(max(0.0, ahead + journal.read_margin + 0.2))
    with console.status(f"incremental load 2 ({INCREMENT} events appended since load 1)"):
        second = load_events(spark, out, "demo", dsn=dsn)
    show(second)
    ok = second.rows == INCREMENT
    console.print(f"load 2 took exactly the {INCREMENT} events appended since load 1: "
                  + ("[green]yes[/]" if ok else f"[red]NO[/] ({second.rows:,} rows)"))
    return ok
