"""The Spark part of ``make demo``: export the journal to Parquet by slice range, aggregate over the Parquet
files, two incremental loads (everything so far, then only what was appended since), then a streaming query
of ``format("pgjournal")`` over live writers into Parquet, stopped and restarted from its checkpoint."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pgjournal.errors import ConfigurationError
from pgjournal.store import stats

from .jobs import LoadResult, export_events, load_events
from .planning import export_store
from .system import SKIP_ENV, spark_skipped

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from pgjournal import Journal

#: Events appended between the two incremental loads (entity type ``SparkDemo``, outside the carts).
INCREMENT = 300
#: Seconds the streaming query runs before it is stopped, and again after its restart, while writers append.
STREAM_SECONDS = 3.0


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
        began = time.perf_counter()
        spark = spark_session("pgjournal-demo")
    try:
        with console.status("warming Spark up: a small export"):
            warm_up(spark, dsn, str(work / "warm-up"))
        console.print(f"Spark started in {time.perf_counter() - began:.1f} s (the JVM, its executors and Python "
                      "workers, warmed up by a small export; not counted in the rates below)")
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
        streamed = stream_with_restart(spark, dsn, work / "stream", console)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return loaded and streamed


def warm_up(spark: SparkSession, dsn: str, out: str) -> None:
    """The export below, run over the journal's first second: the first job of a session starts the executors,
    their JDBC driver and the Python workers that decode, which the export's rate should not count."""
    from pgjournal.server.connections import connect

    with connect(dsn) as conn:
        firsts = [row.first for row in stats.per_entity_type().all(conn) if row.first is not None]
    if firsts:
        export_events(spark, out, dsn=dsn, slice_ranges=8, decode=True, until=min(firsts) + timedelta(seconds=1))


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
        wait_past_horizon(journal)
    with console.status(f"incremental load 2 ({INCREMENT} events appended since load 1)"):
        second = load_events(spark, out, "demo", dsn=dsn)
    show(second)
    ok = second.rows == INCREMENT
    console.print(f"load 2 took exactly the {INCREMENT} events appended since load 1: "
                  + ("[green]yes[/]" if ok else f"[red]NO[/] ({second.rows:,} rows)"))
    return ok


def wait_past_horizon(journal: Journal) -> None:
    """Wait until the next horizon reading is past the journal's last commit (by the database's clock)."""
    with journal.connection() as conn:
        newest = stats.newest().one(conn)
    if newest is not None and newest.db_timestamp is not None:
        ahead = (newest.db_timestamp - newest.now).total_seconds()
        time.sleep(max(0.0, ahead + journal.read_margin + 0.2))


def stream_with_restart(spark: SparkSession, dsn: str, out: Path, console: Console) -> bool:
    """A streaming query of the whole journal into Parquet while writers append: run a few seconds, stop,
    restart from the checkpoint, catch up once the writers stop; True when the Parquet files hold exactly the
    journal's events, each once."""
    from pgjournal import Journal

    def sink(out: Path) -> DataFrame:
        return spark.read.schema("entity_type STRING, persistence_id STRING, seq_nr BIGINT").parquet(str(out / "data"))

    def start() -> StreamingQuery:
        return (spark.readStream.format("pgjournal").option("dsn", dsn).option("sliceRanges", 4)
                .option("columns", "entity_type,persistence_id,seq_nr").load()
                .writeStream.format("parquet").option("path", str(out / "data"))
                .option("checkpointLocation", str(out / "checkpoint")).trigger(processingTime="500 milliseconds")
                .start())

    with Journal.open(dsn) as journal:
        stop = threading.Event()
        written = [0]

        def write() -> None:
            while not stop.is_set():
                journal.append(f"SparkStream|{written[0] % 40}", [{"n": written[0]}])
                written[0] += 1
                time.sleep(0.005)

        writer = threading.Thread(target=write, daemon=True)
        with console.status(f"streaming query over live writers for {STREAM_SECONDS:.0f} s, then a stop"):
            writer.start()
            query = start()
            run_for(query, STREAM_SECONDS)
            idle_stop(spark, query)
        first = sink(out).count()
        with console.status(f"restarted from its checkpoint, {STREAM_SECONDS:.0f} s more of writers, catching up"):
            query = start()
            run_for(query, STREAM_SECONDS)
            stop.set()
            writer.join()
            wait_past_horizon(journal)
            query.processAllAvailable()
            idle_stop(spark, query)
        sql, params = export_store(journal, "event_journal").rows_below(
            ("entity_type", "persistence_id", "seq_nr"), 0, 1023, datetime.now(UTC) + timedelta(days=1))
        with journal.connection() as conn:
            expected = set(conn.execute(sql, params).fetchall())
    rows = [tuple(r) for r in sink(out).collect()]
    ok = len(rows) == len(set(rows)) and set(rows) == expected
    console.print(f"streaming query (format 'pgjournal', 4 slice ranges) into Parquet with {written[0]:,} events "
                  f"appended meanwhile: [bold]{first:,}[/] events before the stop, [bold]{len(rows):,}[/] after the "
                  f"restart from its checkpoint; equals the journal ({len(expected):,} events, each once): "
                  + ("[green]yes[/]" if ok else f"[red]NO[/] ({len(set(rows)):,} distinct, "
                     f"{len(expected - set(rows)):,} missing)"))
    return ok


def run_for(query: StreamingQuery, seconds: float, first_batch_within: float = 120.0) -> None:
    """Let ``query`` run ``seconds`` after its first micro-batch with rows has finished."""
    deadline = time.monotonic() + first_batch_within
    while not any(p.get("numInputRows") for p in query.recentProgress) and time.monotonic() < deadline:
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]
        time.sleep(0.2)
    time.sleep(seconds)


def idle_stop(spark: SparkSession, query: StreamingQuery, within: float = 30.0) -> None:
    """Stop ``query``, between micro-batches where it can. A stop that lands inside one aborts its write, which
    Spark logs as an error with a stack trace although nothing is lost (the micro-batch runs again from the
    checkpoint): the demo keeps Spark's log quiet for the moment of the stop."""
    deadline = time.monotonic() + within
    while query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    spark.sparkContext.setLogLevel("OFF")
    try:
        query.stop()
    finally:
        spark.sparkContext.setLogLevel("ERROR")
