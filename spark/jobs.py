"""Batch jobs: a full export to Parquet, and an incremental load that never misses or repeats an event.

**Export** writes ``<out>/entity_type=<type>/slice_range=<lo>-<hi>/part-*.parquet``, one JDBC partition per
slice range.

**Incremental load** reads, per slice, from that slice's watermark (a TimestampOffset: the timestamp of the
last event loaded plus the persistence ids seen at it) up to the *visibility horizon* of the journal's
capabilities: on PostgreSQL the writer-lock horizon (no row below it can still commit, whatever the loader's
role may see; :mod:`pgjournal.core.horizon`), in portable mode the clock minus a delay. Each load is numbered;
its output goes to ``<out>/_incoming/<n>-<random>`` and only after the new watermarks and a ledger row are
committed (one transaction) is it renamed to ``<out>/load=<n>``. A load that fails before that commit
deletes its output; a process killed before it leaves an ``_incoming`` directory that the next run deletes
(its rows are read again); a crash between the commit and the rename is finished by the next run (the ledger
knows the load). So ``<out>/load=*`` always holds every event below the last horizon exactly once, and Spark
ignores ``_incoming`` when it reads ``<out>``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import psycopg

from pgjournal.admin.stored_format import read_stored_format
from pgjournal.errors import InsufficientPrivilege, InvalidArgument
from pgjournal.journal import Journal
from pgjournal.model.timeuuid import EPOCH
from pgjournal.store import catalog
from pgjournal.store.timestamp_offsets import OFFSET_TABLE

from . import files, scram
from .jdbc import jdbc_target
from .progress import ProgressCallback, tracked
from .read import (
    DEFAULT_FETCH_SIZE,
    SliceRanges,
    check_entity_type,
    decode_payloads,
    jdbc_frame,
    predicates,
    read_events,
    resolve_slice_ranges,
)
from .watermarks import LoadState, check_job_name, commit_load, next_watermarks, read_state

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from pgjournal.codec.serialization import SerializerRegistry

INCOMING = "_incoming"
#: What an incremental load needs: read the journal, keep watermarks (``spark.watermarks``).
LOAD_RIGHTS = (("event_journal", "SELECT"), (OFFSET_TABLE, "SELECT"), (OFFSET_TABLE, "INSERT"),
               (OFFSET_TABLE, "DELETE"))
#: Columns with (nearly) one value per event: dictionary encoding only fills a dictionary page and falls
#: back to plain. Turning it off for them spares the JVM that work on every exported row (``python -m bench
#: spark``); low-cardinality columns keep their dictionaries.
PARQUET_OPTIONS = {f"parquet.enable.dictionary#{column}": "false"
                   for column in ("persistence_id", "db_timestamp", "event_payload")}


@dataclass(frozen=True)
class ExportResult:
    path: str
    rows: int
    seconds: float
    slice_ranges: list[tuple[int, int]]

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class LoadResult:
    job: str
    load_number: int
    load_id: str
    #: Where this load's rows are (``<out>/load=<n>``).
    path: str
    rows: int
    #: Every event with ``db_timestamp`` below this is now loaded (for the slices and entity type of the job).
    horizon: datetime
    seconds: float
    #: Incomplete loads removed and committed ones completed before this run.
    recovered: tuple[str, ...] = ()


def check_output(out: str) -> str:
    if not isinstance(out, str) or not out.strip():
        raise InvalidArgument(f"output path must be a non-empty path or URI, got {out!r}")
    return out.rstrip("/") or "/"


def range_label(ranges: list[tuple[int, int]]) -> Column:
    """``slice_range`` for each row: ``"0000-0255"`` (zero-padded, so names sort in slice order)."""
    from pyspark.sql import functions as F

    label = None
    for lo, hi in ranges:
        cond = F.col("slice").between(lo, hi)
        text = F.lit(f"{lo:04d}-{hi:04d}")
        label = F.when(cond, text) if label is None else label.when(cond, text)
    assert label is not None
    return label


def at_most_one_task_per_core(frame: DataFrame) -> DataFrame:
    """Run more slice ranges than cores as that many tasks, each reading its ranges one after another.

    Every range is still its own JDBC query over its own table partitions; only Spark's per-task cost is
    saved, so 8 ranges on 2 cores read about as fast as 2 (``python -m bench spark``).
    """
    cores = frame.sparkSession.sparkContext.defaultParallelism
    return frame.coalesce(cores) if frame.rdd.getNumPartitions() > cores > 0 else frame


def export_events(
    spark: SparkSession,
    out: str,
    *,
    dsn: str | None = None,
    entity_type: str | None = None,
    slice_ranges: SliceRanges = 8,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    decode: bool = False,
    payload_schema: StructType | str | None = None,
    table: str = "event_journal",
    fetch_size: int = DEFAULT_FETCH_SIZE,
    progress: ProgressCallback | None = None,
    serializers: SerializerRegistry | None = None,
) -> ExportResult:
    """Export the journal (or one entity type) to Parquet partitioned by entity type and slice range.

    Replaces ``out`` entirely, or with ``entity_type`` only that entity type's directory. ``decode`` decodes
    with ``serializers`` (the journal's registry), see :func:`spark.read.decode_payloads`.
    """
    out = check_output(out)
    ranges = resolve_slice_ranges(slice_ranges)
    started = time.perf_counter()
    frame = read_events(spark, dsn, entity_type, ranges, since, until, payload_schema, decode=decode, table=table,
                        fetch_size=fetch_size, serializers=serializers)
    frame, rows = counted(at_most_one_task_per_core(frame.withColumn("slice_range", range_label(ranges))))
    writer = frame.write.mode("overwrite").options(**PARQUET_OPTIONS).partitionBy("entity_type", "slice_range")
    if entity_type is not None:
        writer = writer.option("partitionOverwriteMode", "dynamic")
    tracked(spark, "export", lambda: writer.parquet(out), progress)
    return ExportResult(out, rows(), time.perf_counter() - started, ranges)


def counted(frame: DataFrame) -> tuple[DataFrame, Callable[[], int]]:
    """``frame`` observed: after an action ran on it, the returned function gives its row count (no extra pass)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation(f"rows-{uuid.uuid4().hex[:8]}")
    observed = frame.observe(observation, F.count(F.lit(1)).alias("rows"))
    return observed, lambda: int(observation.get["rows"])


def recover(spark: SparkSession, out: str, state: LoadState) -> tuple[str, ...]:
    """Finish committed loads whose rename did not happen; delete the output of loads never committed."""
    done = []
    incoming = files.join(out, INCOMING)
    for name in files.list_names(spark, incoming):
        source = files.join(incoming, name)
        number = state.loads.get(name)
        target = files.join(out, f"load={number:06d}") if number is not None else None
        if target is not None and not files.exists(spark, target):
            files.rename(spark, source, target)
            done.append(f"completed load {name}")
        else:
            files.delete(spark, source)
            done.append(f"removed {'duplicate' if target else 'uncommitted'} load {name}")
    return tuple(done)


def load_events(
    spark: SparkSession,
    out: str,
    job: str,
    *,
    dsn: str | None = None,
    entity_type: str | None = None,
    slice_ranges: SliceRanges = 4,
    decode: bool = False,
    payload_schema: StructType | str | None = None,
    table: str = "event_journal",
    behind: float | None = None,
    portable: bool | None = None,
    fetch_size: int = DEFAULT_FETCH_SIZE,
    progress: ProgressCallback | None = None,
    serializers: SerializerRegistry | None = None,
) -> LoadResult:
    """Load the events committed since the last run of ``job`` into ``<out>/load=<n>`` (Parquet, by entity type).

    Running it again and again loads every event exactly once, however late its transaction commits
    (PostgreSQL: the journal's writer-lock horizon, see :mod:`pgjournal.core.horizon`) or as long as
    transactions commit within ``behind`` seconds (portable mode; default ``backtracking_behind_current_time``).
    On PostgreSQL ``behind`` only keeps the load further behind the clock. The role needs SELECT on the
    journal and SELECT, INSERT, DELETE on ``projection_timestamp_offset_store`` (``pgjournal_loader``);
    without them :class:`~pgjournal.errors.InsufficientPrivilege` is raised before Spark reads anything.
    A failed load leaves no output and moves no watermark. ``decode`` decodes with ``serializers`` (the journal's
    registry), see :func:`spark.read.decode_payloads`.
    """
    out = check_output(out)
    check_job_name(job)
    entity_type = check_entity_type(entity_type)
    ranges = resolve_slice_ranges(slice_ranges)
    if behind is not None and (isinstance(behind, bool) or not isinstance(behind, int | float)
                               or not 0 <= behind < 86_400):
        raise InvalidArgument(f"behind must be a number of seconds from 0 to 86400, got {behind!r}")
    started = time.perf_counter()
    target = jdbc_target(dsn, scram_plugin=scram.in_session(spark))
    with Journal.open(dsn, portable=portable, notify=False, pool_min_size=1, pool_max_size=1) as journal, \
            journal.connection() as conn:
        check_load_rights(conn)
        state = read_state(conn, job, entity_type)
        recovered = recover(spark, out, state)
        number = state.last_load + 1
        load_id = f"{number:06d}-{uuid.uuid4().hex[:8]}"
        horizon = final_bound(journal, conn, behind)
        frame = _new_rows(spark, state, ranges, horizon, target_frame=lambda where: jdbc_frame(
            spark, target, table, where, fetch_size=fetch_size), entity_type=entity_type)
        if decode:
            frame = decode_payloads(frame, payload_schema, serializers=serializers, stored=read_stored_format(conn))
        staging = files.join(out, INCOMING, load_id)
        committed = False
        try:
            observed, rows = counted(at_most_one_task_per_core(frame))
            tracked(spark, f"load {number}", lambda: observed.write.options(**PARQUET_OPTIONS)
                    .partitionBy("entity_type").parquet(staging), progress)
            written = spark.read.schema(frame.schema).parquet(staging)
            newest = tracked(spark, "watermarks", lambda: _newest_per_slice(written), progress)
            slices = [s for lo, hi in ranges for s in range(lo, hi + 1)]
            commit_load(conn, state, number, load_id, horizon, next_watermarks(state, slices, newest, horizon))
            committed = True
        finally:
            if not committed:  # nothing of this load counts: leave nothing of it behind
                files.delete(spark, staging)
                _drop_incoming_if_empty(spark, out)
    final = files.join(out, f"load={number:06d}")
    files.rename(spark, staging, final)
    _drop_incoming_if_empty(spark, out)
    return LoadResult(job, number, load_id, final, rows(), horizon, time.perf_counter() - started, recovered)


def final_bound(journal: Journal, conn: psycopg.Connection, behind: float | None) -> datetime:
    """The newest ``db_timestamp`` below which every event is committed, for this journal's role and server:
    the writer-lock horizon (waiting out writers whose start this role may not see, up to
    ``longest_transaction``), else the clock minus ``behind`` (portable mode). With ``behind``, one settled
    reading gives both the horizon and the clock it counts from."""
    tracker = journal.horizon_tracker()
    if behind is None:
        return tracker.final_bound(conn)
    horizon = tracker.settle(conn, timeout=journal.capabilities.longest_transaction)
    behind_clock = horizon.now - timedelta(seconds=behind)
    return min(horizon.safe, behind_clock) if journal.capabilities.writer_horizon else behind_clock


def check_load_rights(conn: psycopg.Connection) -> None:
    """Raise :class:`InsufficientPrivilege` naming what the role lacks for an incremental load."""
    missing = [f"{right} on {table}" for table, right in LOAD_RIGHTS
               if not catalog.has_table_privilege(table, right).one(conn)]
    if missing:
        role = catalog.current_user().one(conn)
        raise InsufficientPrivilege(
            f"role {role!r} cannot run an incremental load: it lacks {', '.join(missing)} (the load reads the "
            f"journal and keeps its watermarks in {OFFSET_TABLE}). Run it as the loader role "
            "that `pgjournal roles` creates (pgjournal_loader), or grant those rights")


def _drop_incoming_if_empty(spark: SparkSession, out: str) -> None:
    incoming = files.join(out, INCOMING)
    if files.exists(spark, incoming) and not files.list_names(spark, incoming):
        files.delete(spark, incoming)


def _new_rows(spark: SparkSession, state: LoadState, ranges: list[tuple[int, int]], horizon: datetime, *,
              target_frame: Callable[[list[str]], DataFrame], entity_type: str | None) -> DataFrame:
    """Rows below ``horizon`` at or after each slice's watermark, minus those already seen at it."""
    from pyspark.sql import functions as F

    lower = [state.lower_bound(lo, hi) for lo, hi in ranges]
    where = predicates(ranges, entity_type=entity_type, until=horizon, lower_bounds=lower)
    frame = target_frame(where)
    if state.watermarks:
        marks = spark.createDataFrame(
            [(s, _micros(m.timestamp)) for s, m in state.watermarks.items()], "slice INT, wm_micros BIGINT")
        frame = (frame.join(F.broadcast(marks), "slice", "left")
                 .where(F.col("wm_micros").isNull() | (F.unix_micros("db_timestamp") >= F.col("wm_micros")))
                 .drop("wm_micros"))
    seen = state.seen_rows()
    if seen:
        seen_frame = spark.createDataFrame(seen, "persistence_id STRING, seen_seq_nr BIGINT")
        frame = (frame.join(F.broadcast(seen_frame), "persistence_id", "left")
                 .where(F.col("seen_seq_nr").isNull() | (F.col("seq_nr") > F.col("seen_seq_nr")))
                 .drop("seen_seq_nr"))
    return frame


def _micros(ts: datetime) -> int:
    delta = ts.astimezone(UTC) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _from_micros(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def _newest_per_slice(written: DataFrame) -> dict[int, list[tuple[str, int, datetime]]]:
    """Per slice, the (pid, seq nr, timestamp) of the events at its newest timestamp."""
    from pyspark.sql import functions as F

    stamped = written.select("slice", "persistence_id", "seq_nr", F.unix_micros("db_timestamp").alias("micros"))
    per_slice = stamped.groupBy("slice").agg(F.max("micros").alias("micros"))
    out: dict[int, list[tuple[str, int, datetime]]] = {}
    for r in stamped.join(per_slice, ["slice", "micros"]).collect():
        out.setdefault(r["slice"], []).append((r["persistence_id"], r["seq_nr"], _from_micros(r["micros"])))
    return out
