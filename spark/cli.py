"""``pgjournal spark export | load | watermarks | states``: the Spark jobs on the command line, with progress.

PySpark is imported only when a command runs, so ``pgjournal`` starts fast without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from pgjournal.cli.support import DsnOption, console, reported, shown
from pgjournal.server.connections import connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .progress import Progress as SparkProgress

spark_app = typer.Typer(
    help="Spark jobs over the journal (needs Java 17+, PySpark and the PostgreSQL JDBC jar).",
    no_args_is_help=True,
)
EntityOption = Annotated[str | None, typer.Option("--entity-type", "-e", help="Only this entity type.")]
TableOption = Annotated[str, typer.Option(help="Journal table (an Akka R2DBC event_journal works too).")]
DecodeOption = Annotated[bool, typer.Option("--decode/--raw", help="Decode payloads (JSON, CBOR, compressed) to an "
                                            "`event` struct and a `redacted` flag.")]
SchemaOption = Annotated[str | None, typer.Option("--schema", help="Payload schema as Spark DDL, e.g. "
                                                  "'item STRING, qty INT' (default: inferred).")]
MasterOption = Annotated[str, typer.Option(help="Spark master.")]
MemoryOption = Annotated[str, typer.Option(help="Driver memory.")]


@contextmanager
def _spark(master: str, memory: str) -> Iterator[SparkSession]:
    from pyspark.sql import SparkSession

    from .session import spark_session

    with reported():
        existing = SparkSession.getActiveSession()
        with console.status("starting Spark"):
            session = spark_session("pgjournal-cli", master=master, driver_memory=memory)
        try:
            yield session
        finally:
            if existing is None:  # stop only what this command started
                session.stop()


@contextmanager
def _progress() -> Iterator[object]:
    bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("tasks"), TimeElapsedColumn(), console=console, transient=False)
    tasks: dict[str, TaskID] = {}

    def update(p: SparkProgress) -> None:
        if p.step not in tasks:
            tasks[p.step] = bars.add_task(shown(p.step), total=None)
        bars.update(tasks[p.step], completed=p.done, total=p.total or None)

    with bars:
        yield update


@spark_app.command()
def export(
    out: Annotated[str, typer.Argument(help="Output directory or URI (replaced).")],
    dsn: DsnOption = None,
    entity_type: EntityOption = None,
    slice_ranges: Annotated[int, typer.Option("--slice-ranges", "-n", help="JDBC partitions (divisor of 1024).")] = 8,
    since: Annotated[str | None, typer.Option(help="Only events at or after this ISO 8601 time.")] = None,
    until: Annotated[str | None, typer.Option(help="Only events before this ISO 8601 time.")] = None,
    decode: DecodeOption = False,
    schema: SchemaOption = None,
    table: TableOption = "event_journal",
    master: MasterOption = "local[2]",
    memory: MemoryOption = "1g",
) -> None:
    """Export events to Parquet, partitioned by entity_type and slice_range."""
    from .jobs import export_events

    with _spark(master, memory) as session, reported(), _progress() as update:
        result = export_events(session, out, dsn=dsn, entity_type=entity_type, slice_ranges=slice_ranges,
                               since=since, until=until, decode=decode, payload_schema=schema, table=table,
                               progress=update)  # type: ignore[arg-type]
    console.print(f"exported [bold]{result.rows:,}[/] events to {shown(result.path)} in {result.seconds:.1f} s "
                  f"({result.rows_per_second:,.0f} rows/s, {len(result.slice_ranges)} slice ranges)")


@spark_app.command()
def states(
    out: Annotated[str, typer.Argument(help="Output directory or URI (replaced).")],
    dsn: DsnOption = None,
    entity_type: EntityOption = None,
    slice_ranges: Annotated[int, typer.Option("--slice-ranges", "-n", help="Input partitions (divisor of 1024).")] = 4,
    decode: Annotated[bool, typer.Option("--decode/--raw",
                                         help="Decode states to a `state` struct and a `redacted` flag.")] = False,
    schema: Annotated[str | None, typer.Option("--schema", help="State schema as Spark DDL, e.g. "
                                               "'owner STRING, balance INT' (default: inferred).")] = None,
    master: MasterOption = "local[2]",
    memory: MemoryOption = "1g",
) -> None:
    """Export durable state to Parquet, partitioned by entity_type: each persistence id's latest state and
    revision (deleted states flagged), read by slice range through the native format("pgjournal") source."""
    import time

    from .options import SourceOptions
    from .planning import plan

    options = {"table": "durable_state", "sliceRanges": str(slice_ranges), "decode": str(decode).lower(),
               **({"dsn": dsn} if dsn else {}), **({"entityType": entity_type} if entity_type else {}),
               **({"payloadSchema": schema} if schema else {})}
    with reported():  # bad options, an unreachable server or an unknown entity type: a message, before Spark
        journal, _ = plan(SourceOptions.parse(options))
        journal.close()
    with _spark(master, memory) as session, console.status("exporting durable state by slice range"):
        reader = session.read.format("pgjournal")
        for key, value in options.items():
            reader = reader.option(key, value)
        started = time.perf_counter()
        reader.load().write.mode("overwrite").partitionBy("entity_type").parquet(out)
        seconds = time.perf_counter() - started
        rows = session.read.parquet(out).count()
    console.print(f"exported [bold]{rows:,}[/] durable states to {shown(out)} (entity_type=*/part-*.parquet) in "
                  f"{seconds:.1f} s ({slice_ranges} slice ranges)")


@spark_app.command()
def load(
    out: Annotated[str, typer.Argument(help="Output directory or URI; each run adds load=<n>.")],
    job: Annotated[str, typer.Option("--job", "-j", help="Job name: its watermarks are kept in the database.")],
    dsn: DsnOption = None,
    entity_type: EntityOption = None,
    slice_ranges: Annotated[int, typer.Option("--slice-ranges", "-n", help="JDBC partitions (divisor of 1024).")] = 4,
    behind: Annotated[float | None, typer.Option(help="Seconds to stay behind the database clock.")] = None,
    portable: Annotated[bool | None, typer.Option("--portable/--no-portable", help="Clock minus a delay "
                                                  "instead of PostgreSQL's open transactions.")] = None,
    decode: DecodeOption = False,
    schema: SchemaOption = None,
    table: TableOption = "event_journal",
    master: MasterOption = "local[2]",
    memory: MemoryOption = "1g",
) -> None:
    """Load the events committed since the last run of JOB (exactly once, late commits included)."""
    from pgjournal.model.offsets import format_timestamp

    from .jobs import load_events

    with _spark(master, memory) as session, reported(), _progress() as update:
        result = load_events(session, out, job, dsn=dsn, entity_type=entity_type, slice_ranges=slice_ranges,
                             behind=behind, portable=portable, decode=decode, payload_schema=schema, table=table,
                             progress=update)  # type: ignore[arg-type]
    for line in result.recovered:
        console.print(f"[yellow]recovered:[/] {shown(line)}")
    console.print(f"load {result.load_number} of job {shown(repr(result.job))}: [bold]{result.rows:,}[/] new "
                  f"events to {shown(result.path)} in {result.seconds:.1f} s; "
                  f"complete up to {format_timestamp(result.horizon)}")


@spark_app.command()
def watermarks(
    job: Annotated[str, typer.Argument(help="Job name.")],
    dsn: DsnOption = None,
    slice_ranges: Annotated[int, typer.Option("--slice-ranges", "-n", help="Group slices into this many.")] = 8,
) -> None:
    """Show a load job's watermarks per slice range and its last loads (no Spark needed)."""

    from pgjournal.model.offsets import format_timestamp
    from pgjournal.model.slices import slice_ranges as split
    from pgjournal.server.dsn import resolve_dsn
    from pgjournal.store.timestamp_offsets import offsets

    from .watermarks import check_job_name, ledger_name, read_state

    with reported():
        check_job_name(job)
        with connect(resolve_dsn(dsn), statement_timeout=True) as conn:
            keys = sorted(offsets().keys([ledger_name(job)]).all(conn))
            state = read_state(conn, job, None if not keys or keys[0] == "*" else keys[0])
            ledger = offsets().ledger(ledger_name(job), limit=5).all(conn)
        ranges = split(slice_ranges)
    if not ledger:
        console.print(f"load job {shown(repr(job))} has not committed a load yet")
        return
    table = Table("slices", "oldest watermark", "newest watermark", "pids seen",
                  title=f"job {shown(repr(job))} ({shown(state.key)})")
    for lo, hi in ranges:
        marks = [state.watermarks[s] for s in range(lo, hi + 1) if s in state.watermarks]
        if not marks:
            table.add_row(f"{lo}-{hi}", "-", "-", "0")
            continue
        table.add_row(f"{lo}-{hi}", format_timestamp(min(m.timestamp for m in marks)),
                      format_timestamp(max(m.timestamp for m in marks)), str(sum(len(m.seen) for m in marks)))
    console.print(table)
    loads = Table("load", "id", "complete up to", "committed", title="last loads")
    for row in ledger:
        loads.add_row(str(row.load_number), shown(row.load_id), format_timestamp(row.horizon),
                      format_timestamp(row.committed))
    console.print(loads)
