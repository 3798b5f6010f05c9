"""The native ``format("pgjournal")`` Spark source (spark/source.py, spark/stream.py) against a real PostgreSQL.

One local Spark for the file; skipped when PySpark or Java 17+ is missing. Data stays small (hundreds of
events): what is checked is exactness (every (pid, seq_nr) once), not speed.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import SECRET, role_dsn
from support.eventually import eventually

from pgjournal import Journal
from pgjournal.model.offsets import TimestampOffset
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.store.events import insert_sql

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")

ENTITY = "Cart"


def journal_keys(dsn: str, entity_type: str | None = ENTITY) -> set[tuple[str, int]]:
    where, params = ("entity_type = %s AND NOT deleted", (entity_type,)) if entity_type else ("NOT deleted", ())
    with psycopg.connect(dsn) as conn:
        return set(conn.execute(f"SELECT persistence_id, seq_nr FROM event_journal WHERE {where}", params).fetchall())


def keys(frame: Any) -> list[tuple[str, int]]:
    return [(r["persistence_id"], r["seq_nr"]) for r in frame.select("persistence_id", "seq_nr").collect()]


def fill(journal: Journal, pids: int = 60, per_pid: int = 3, kinds: tuple[str, ...] = ("Cart", "Order")) -> None:
    for i in range(pids):
        kind = kinds[i % len(kinds)]
        journal.append(f"{kind}|{i}", [{"item": f"sku-{i}", "qty": n} for n in range(per_pid)],
                       tags=["even"] if i % 2 == 0 else ())


def source(spark: Any, dsn: str, **options: Any) -> Any:
    reader = spark.read.format("pgjournal").option("dsn", dsn)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# -- batch ----------------------------------------------------------------------------------------------


def test_without_a_dsn_option_the_source_reads_the_drivers_pgjournal_dsn_as_of_register(
        spark: Any, journal: Journal, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The session's JVM (and so its Python workers) started before this test set PGJOURNAL_DSN: the registration
    # carries the driver's value to the workers, else they would read another database.
    from pgjournal.spark import register

    fill(journal, pids=4, per_pid=2, kinds=(ENTITY,))
    monkeypatch.setenv("PGJOURNAL_DSN", dsn)
    register(spark)
    assert sorted(keys(spark.read.format("pgjournal").option("entityType", ENTITY).load())) == \
        sorted(journal_keys(dsn))


@pytest.mark.floor
def test_batch_read_equals_the_journal_one_partition_per_range(spark: Any, journal: Journal, dsn: str) -> None:
    fill(journal)
    frame = source(spark, dsn, entityType=ENTITY, sliceRanges=8)
    assert frame.rdd.getNumPartitions() == 8
    rows = keys(frame)
    assert len(rows) == len(set(rows)) == len(journal_keys(dsn)) == 90
    assert set(rows) == journal_keys(dsn)
    assert source(spark, dsn, sliceRanges="0-511,512-1023").count() == 180  # every entity type


def test_batch_columns_types_tags_and_utc_timestamps(spark: Any, journal: Journal, dsn: str) -> None:
    fill(journal, pids=4)
    # text that CSV must quote, a newline inside a value, non-ASCII, and bytes that are not text
    journal.append('Cart|we,ird "id"\nline2', [b"\x00\xff,\n\"", {"é": "ü"}], tags=['a,b', 'q"uote', "é\x1f", "[]"])
    journal.append("Cart|big", [b"\x07" * (3 << 20)])  # one row larger than a parse block
    frame = source(spark, dsn, entityType=ENTITY)
    types = dict(frame.dtypes)
    assert types == {"slice": "int", "entity_type": "string", "persistence_id": "string", "seq_nr": "bigint",
                     "db_timestamp": "timestamp", "writer": "string", "tags": "array<string>",
                     "event_ser_id": "int", "event_ser_manifest": "string", "event_payload": "binary"}
    with psycopg.connect(dsn) as conn:
        expected = {(pid, seq): (slice_, ts, tags or [], bytes(payload)) for pid, seq, slice_, ts, tags, payload in
                    conn.execute("SELECT persistence_id, seq_nr, slice, db_timestamp, tags, event_payload "
                                 "FROM event_journal WHERE entity_type = %s", (ENTITY,)).fetchall()}
    got = frame.collect()
    assert len(got) == len(expected) == 9
    for row in got:
        slice_, ts, tags, payload = expected[(row["persistence_id"], row["seq_nr"])]
        assert row["slice"] == slice_ == slice_for_persistence_id(row["persistence_id"])
        # the session is UTC: Spark hands back naive datetimes in UTC
        assert row["db_timestamp"].replace(tzinfo=UTC) == ts
        assert row["tags"] == tags
        assert bytes(row["event_payload"]) == payload


def test_batch_decodes_json_payloads_by_schema_or_inferred(spark: Any, journal: Journal, dsn: str) -> None:
    fill(journal, pids=6)
    journal.append("Cart|bytes", [b"\x00\x01not json"])
    given = source(spark, dsn, entityType=ENTITY, payloadSchema="item STRING, qty INT")
    assert dict(given.dtypes)["event"] == "struct<item:string,qty:int>"
    events = {(r["persistence_id"], r["seq_nr"]): r["event"] for r in given.collect()}
    assert events[("Cart|2", 3)].asDict() == {"item": "sku-2", "qty": 2}
    assert events[("Cart|bytes", 1)] is None
    inferred = source(spark, dsn, entityType=ENTITY, decode="true")
    assert dict(inferred.dtypes)["event"] == "struct<item:string,qty:bigint>"
    assert inferred.where("event.qty = 2").count() == 3
    # a payload that does not fit the schema gives a null event, not a failed task
    assert source(spark, dsn, entityType=ENTITY, payloadSchema="item INT").where("event IS NOT NULL").count() == 0


def test_batch_stops_at_the_settled_horizon_an_open_writer_is_not_read(spark: Any, journal: Journal,
                                                                       dsn: str) -> None:
    fill(journal, pids=6)
    before = journal_keys(dsn)
    with psycopg.connect(dsn) as held:  # a writer that has inserted but not committed
        insert_in(held, "Cart|held", 0, count=2)
        frame = source(spark, dsn, entityType=ENTITY)
        assert set(keys(frame)) == before
        held.commit()
    assert set(keys(source(spark, dsn, entityType=ENTITY))) == before | {("Cart|held", 1), ("Cart|held", 2)}
    with psycopg.connect(dsn) as conn:
        (middle,) = conn.execute("SELECT db_timestamp FROM event_journal WHERE persistence_id = 'Cart|held'").fetchone()
    assert set(keys(source(spark, dsn, entityType=ENTITY, until=middle.isoformat()))) == before
    assert set(keys(source(spark, dsn, entityType=ENTITY, since=middle.isoformat()))) == {("Cart|held", 1),
                                                                                          ("Cart|held", 2)}


def test_filters_are_pushed_to_sql_and_prune_ranges(spark: Any, journal: Journal, dsn: str, secret_role: str) -> None:
    from pyspark.sql import functions as F

    fill(journal, pids=30, per_pid=4)
    frame = source(spark, role_dsn(dsn, secret_role, SECRET), sliceRanges=8)
    pid = "Cart|4"
    target = slice_for_persistence_id(pid)
    one = frame.where((F.col("persistence_id") == pid) & (F.col("seq_nr") >= 2))
    assert sorted(keys(one)) == [(pid, 2), (pid, 3), (pid, 4)]
    # pushed: Spark keeps only its own not-null checks above the scan
    plan = one._jdf.queryExecution().executedPlan().toString()
    assert "Cart|4" not in plan and "Filter (isnotnull(persistence_id" in plan, plan
    assert SECRET not in plan and SECRET not in one._jdf.queryExecution().toString()
    # not pushable (a prefix match): Spark filters after the scan, same answer
    prefixed = frame.where(F.col("persistence_id").startswith("Cart|1") & (F.col("seq_nr") == 1))
    assert set(keys(prefixed)) == {(p, 1) for p, _ in journal_keys(dsn) if p.startswith("Cart|1")}
    by_slice = frame.where(F.col("slice") == target)
    assert by_slice.rdd.getNumPartitions() == 1
    assert {p for p, _ in keys(by_slice)} == {p for p, _ in journal_keys(dsn, None)
                                               if slice_for_persistence_id(p) == target}
    middle = frame.where(F.col("entity_type").isin("Order")).agg(F.min("db_timestamp"), F.max("db_timestamp"))
    lo, hi = middle.collect()[0]
    window = frame.where((F.col("db_timestamp") > lo) & (F.col("db_timestamp") < hi)
                         & (F.col("entity_type") == "Order"))
    with psycopg.connect(dsn) as conn:
        expected = set(conn.execute(
            "SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = 'Order' AND db_timestamp > %s "
            "AND db_timestamp < %s", (lo.replace(tzinfo=UTC), hi.replace(tzinfo=UTC))).fetchall())
    assert 0 < len(expected) < 60 and set(keys(window)) == expected
    assert frame.where(F.col("slice").isin(target, (target + 1) % 1024) & (F.col("seq_nr") < 2)).count() == len(
        {p for p, _ in journal_keys(dsn, None) if slice_for_persistence_id(p) in (target, (target + 1) % 1024)})


# -- streaming: offsets, driven directly ----------------------------------------------------------------

RAW_INSERT = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id,
    event_ser_manifest, event_payload)
VALUES (%s, %s, %s, %s, %s, 'test', 4, '', '\\x00'::bytea)"""


def insert_shared_timestamps(dsn: str, base: datetime, stamps: int = 6, pids: int = 5, per_pid: int = 2,
                             name: str = "shared") -> None:
    """``stamps`` timestamps, at each of them ``per_pid`` events of each of ``pids`` persistence ids."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        rows = []
        for t in range(stamps):
            for p in range(pids):
                pid = f"{ENTITY}|{name}-{p}"
                for k in range(per_pid):
                    rows.append((slice_for_persistence_id(pid), ENTITY, pid, t * per_pid + k + 1,
                                 base + timedelta(microseconds=t)))
        cur.executemany(RAW_INSERT, rows)


def drain(reader: Any, start: dict[str, str], limit: Any) -> tuple[list[tuple[str, int]], dict[str, str], int]:
    """Micro-batches as Spark would run them (latestOffset, partitions, read) until nothing is new."""
    got: list[tuple[str, int]] = []
    batches = 0
    while True:
        end = reader.latestOffset(start, limit)
        if end == start:
            return got, start, batches
        batches += 1
        for partition in reader.partitions(start, end):
            for batch in reader.read(partition):
                got.extend(zip(batch.column("persistence_id").to_pylist(), batch.column("seq_nr").to_pylist(),
                               strict=True))
        start = json.loads(json.dumps(end))  # what a checkpoint stores
    return got, start, batches


def stream_reader(spark: Any, dsn: str, **options: Any) -> Any:
    from pgjournal.spark.source import SourceOptions
    from pgjournal.spark.stream import JournalStreamReader

    schema = source(spark, dsn, entityType=ENTITY).schema
    return JournalStreamReader(SourceOptions.parse({"dsn": dsn, "entityType": ENTITY, **options}), schema)


def test_stream_offsets_cut_between_events_sharing_a_timestamp(spark: Any, journal: Journal, dsn: str) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    base = datetime.now(UTC) - timedelta(minutes=5)
    insert_shared_timestamps(dsn, base)  # 6 timestamps x 5 pids x 2 events
    reader = stream_reader(spark, dsn, sliceRanges=4, maxEventsPerTrigger=7)
    assert reader.getDefaultReadLimit() == ReadMaxRows(7)
    start = reader.initialOffset()
    assert sorted(start) == ["0-255", "256-511", "512-767", "768-1023"]
    got, end, batches = drain(reader, start, ReadMaxRows(7))
    assert len(got) == len(set(got)) == 60 and set(got) == journal_keys(dsn)
    assert batches == 9  # ceil(60 / 7): every batch full but the last
    # more events at the end offset's own timestamp and later are read once, from the checkpointed offset
    assert TimestampOffset.parse(end["0-255"]).timestamp <= base + timedelta(microseconds=5)
    insert_shared_timestamps(dsn, base + timedelta(microseconds=5), stamps=3, pids=2, per_pid=1, name="late")
    more, _, _ = drain(reader, end, ReadAllAvailable())
    assert not set(more) & set(got) and set(got) | set(more) == journal_keys(dsn)
    reader.stop()


def test_stream_starting_offsets_latest_and_json(spark: Any, journal: Journal, dsn: str) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    fill(journal, pids=10, kinds=(ENTITY,))
    latest = stream_reader(spark, dsn, startingOffsets="latest")
    start = latest.initialOffset()
    assert drain(latest, start, ReadAllAvailable())[0] == []
    journal.append(f"{ENTITY}|new", ["a", "b"])

    def new_events_read() -> bool:  # once the horizon (a margin behind the clock) has passed them
        return sorted(drain(latest, start, ReadAllAvailable())[0]) == [(f"{ENTITY}|new", 1), (f"{ENTITY}|new", 2)]

    eventually(new_events_read, timeout=30)
    given = stream_reader(spark, dsn, startingOffsets=json.dumps(start))
    assert given.initialOffset() == start
    latest.stop()
    given.stop()


# -- streaming: Spark queries with a checkpointed Parquet sink -----------------------------------------


class Writers:
    """Appends in the background: plain appends, and every round a transaction that inserts, holds its write
    lock a second, then commits (so rows appear below timestamps a naive reader would have passed). Runs
    until told to finish, then ``after`` more rounds (at most ``max_rounds`` in all)."""

    def __init__(self, journal: Journal, dsn: str, after: int = 3, max_rounds: int = 40, pids: int = 12) -> None:
        self.journal, self.dsn, self.after, self.max_rounds, self.pids = journal, dsn, after, max_rounds, pids
        self.rounds = 0
        self.error: BaseException | None = None
        self.finish = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            remaining = self.after
            while self.rounds < self.max_rounds and remaining > 0:
                r = self.rounds
                for p in range(self.pids):
                    self.journal.append(f"{ENTITY}|w{p}", [{"item": f"r{r}", "qty": p}] * 2)
                with psycopg.connect(self.dsn) as held:  # inserted first, committed a second later
                    insert_in(held, f"{ENTITY}|held{r}", 0, count=3)
                    time.sleep(1.0)
                    held.commit()
                self.journal.append(f"{ENTITY}|late", [r])
                self.rounds += 1
                if self.finish.is_set():
                    remaining -= 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def __enter__(self) -> Writers:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.finish.set()
        self.thread.join(timeout=300)


def start_stream(spark: Any, dsn: str, out: Path, trigger: dict[str, Any], **options: Any) -> Any:
    reader = spark.readStream.format("pgjournal").option("dsn", dsn).option("entityType", ENTITY)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.format("parquet").option("path", str(out / "data"))
            .option("checkpointLocation", str(out / "checkpoint")).trigger(**trigger).start())


def delivered(spark: Any, out: Path) -> list[tuple[str, int]]:
    if not (out / "data" / "_spark_metadata").exists():
        return []
    return keys(spark.read.schema("persistence_id STRING, seq_nr BIGINT").parquet(str(out / "data")))


def test_stream_to_parquet_exactly_once_across_a_restart_with_writers_holding_transactions(
        spark: Any, journal: Journal, dsn: str, tmp_path: Path) -> None:
    fill(journal, pids=20, kinds=(ENTITY,))  # 60 events before the stream starts
    options = {"sliceRanges": 4, "maxEventsPerTrigger": 40, "payloadSchema": "item STRING, qty INT"}
    with Writers(journal, dsn) as writers:  # rounds of 24 + 3 (held 1 s) + 1 events
        first = start_stream(spark, dsn, tmp_path, {"processingTime": "300 milliseconds"}, **options)
        eventually(lambda: len(delivered(spark, tmp_path)) >= 80, timeout=180)
        first.stop()  # mid-stream: the writers go on until three rounds after the restart
        second = start_stream(spark, dsn, tmp_path, {"processingTime": "300 milliseconds"}, **options)
    assert writers.error is None and not writers.thread.is_alive()
    expected = journal_keys(dsn)
    assert len(expected) == 60 + writers.rounds * 28

    def all_delivered() -> bool:
        return len(delivered(spark, tmp_path)) >= len(expected)

    try:
        eventually(all_delivered, timeout=240, interval=0.5)
    finally:
        second.stop()
    got = delivered(spark, tmp_path)
    assert len(got) == len(set(got)) and set(got) == expected
    events = spark.read.parquet(str(tmp_path / "data")).where("persistence_id = 'Cart|w3'").select("event.*")
    assert {tuple(r) for r in events.collect()} == {(f"r{r}", 3) for r in range(writers.rounds)}


def test_stream_available_now_and_a_checkpoint_refuses_other_slice_ranges(spark: Any, journal: Journal, dsn: str,
                                                                           tmp_path: Path) -> None:
    fill(journal, pids=30, kinds=(ENTITY,))
    query = start_stream(spark, dsn, tmp_path, {"availableNow": True}, sliceRanges=8, maxEventsPerTrigger=25)
    query.awaitTermination(300)
    got = delivered(spark, tmp_path)
    assert len(got) == len(set(got)) == 90 and set(got) == journal_keys(dsn)
    assert len(query.recentProgress) >= 4  # 90 events, at most 25 per micro-batch
    again = start_stream(spark, dsn, tmp_path, {"availableNow": True}, sliceRanges=4)
    with pytest.raises(Exception, match=r"SliceRangesChanged.*slice ranges 8 \(0-127,.*sliceRanges gives 4 \(0-255,"):
        again.awaitTermination(300)


# -- bad options: a pgjournal error at load(), before any task ---------------------------------------------


def test_bad_options_fail_at_load_with_pgjournal_errors(spark: Any, journal: Journal, dsn: str) -> None:
    fill(journal, pids=3)
    with pytest.raises(Exception, match=r"ConfigurationError: entity type 'Nope' has no events.*'Cart', 'Order'"):
        source(spark, dsn, entityType="Nope")
    with pytest.raises(Exception, match=r"InvalidArgument: option sliceRanges='3': .*divisor of 1024.*got 3"):
        source(spark, dsn, sliceRanges=3)
    with pytest.raises(Exception, match=r"InvalidArgument: option sliceRanges='0-600,500-1023': .*overlap"):
        source(spark, dsn, sliceRanges="0-600,500-1023")
    with pytest.raises(Exception, match=r"InvalidArgument: unknown option\(s\) entitytyp\b"):
        source(spark, dsn, entityTyp="Cart")
    with pytest.raises(Exception, match=r"InvalidArgument: option table must be one of event_journal, "
                                        r"durable_state, got 'events'"):
        source(spark, dsn, table="events")
    with pytest.raises(Exception, match=r"ConfigurationError: entity type 'Cart' has no rows in durable_state .*"
                                        r"none \(durable_state is empty\)"):
        source(spark, dsn, table="durable_state", entityType="Cart")
    unreachable = "postgresql://alice:s3cret-pw@127.0.0.1:1/nowhere"
    with pytest.raises(Exception, match=r"DatabaseUnavailable: cannot connect to .*127\.0\.0\.1") as failed:
        source(spark, unreachable)
    assert "s3cret-pw" not in str(failed.value)
    with pytest.raises(Exception, match=r"ConfigurationError: entity type 'Nope'"):
        spark.readStream.format("pgjournal").option("dsn", dsn).option("entityType", "Nope").load()


# -- helpers --------------------------------------------------------------------------------------------


def insert_in(conn: psycopg.Connection, pid: str, after: int, count: int = 1, entity_type: str = ENTITY) -> None:
    """The write path's statement on the caller's (non-autocommit) connection: a writer holding its lock."""
    conn.execute(insert_sql("event_journal", after_latest=False, single=False), {
        "slice": slice_for_persistence_id(pid), "entity_type": entity_type, "pid": pid, "writer": "held",
        "tags": None, "expected": after, "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
        "ser_ids": [4] * count, "manifests": [""] * count, "payloads": [b'{"held":true}'] * count})


# -- column pruning: the schema is the projection ----------------------------------------------------------


def batch_reader(spark: Any, dsn: str, schema: Any = None, **options: Any) -> Any:
    """The batch reader Spark would build for these options, driven here in the test's process."""
    from pgjournal.spark.source import JournalBatchReader, SourceOptions

    frame = source(spark, dsn, **options)
    return JournalBatchReader(SourceOptions.parse({"dsn": dsn, **options}), schema or frame.schema)


def read_in_process(reader: Any) -> list[Any]:
    return [batch for partition in reader.partitions() for batch in reader.read(partition)]


def test_columns_without_the_payload_neither_read_nor_decode_it(spark: Any, journal: Journal, dsn: str) -> None:
    fill(journal, pids=20)
    journal.append("Cart|big", [b"\x07" * (1 << 20)] * 3)  # 3 MiB of payload in all
    pruned = batch_reader(spark, dsn, columns="persistence_id,seq_nr", entityType=ENTITY)
    statements = [p.query[0] for p in pruned.partitions()]
    assert statements and all(s.startswith("SELECT persistence_id, seq_nr FROM event_journal WHERE")
                              for s in statements), statements
    batches = read_in_process(pruned)
    assert {tuple(b.schema.names) for b in batches} == {("persistence_id", "seq_nr")}
    assert sum(b.num_rows for b in batches) == 33 and pruned.converter.decoded_rows == 0
    assert sum(b.nbytes for b in batches) < 2_000  # the payloads' 3 MiB never came
    # asking for the decoded event reads the payload's columns and decodes each row once, returning only event
    decoding = batch_reader(spark, dsn, columns="persistence_id,event", entityType=ENTITY,
                            payloadSchema="item STRING, qty INT")
    assert all("event_ser_id, event_ser_manifest, event_payload FROM" in p.query[0] for p in decoding.partitions())
    rows = {(r["persistence_id"], r["event"]["qty"] if r["event"] else None)
            for b in read_in_process(decoding) for r in b.to_pylist()}
    assert decoding.converter.decoded_rows == 33 and ("Cart|4", 2) in rows and ("Cart|big", None) in rows
    # through Spark: the same columns, the same rows as the journal
    frame = source(spark, dsn, columns="seq_nr,persistence_id", entityType=ENTITY)
    assert frame.columns == ["seq_nr", "persistence_id"]
    assert {(r["persistence_id"], r["seq_nr"]) for r in frame.collect()} == journal_keys(dsn)


def test_a_given_schema_is_the_projection_and_a_wrong_one_is_refused(spark: Any, journal: Journal, dsn: str) -> None:
    fill(journal, pids=10)
    given = spark.read.format("pgjournal").option("dsn", dsn).schema(
        "persistence_id STRING, db_timestamp TIMESTAMP, event STRUCT<qty: BIGINT>").load()
    assert given.columns == ["persistence_id", "db_timestamp", "event"]
    assert given.where("event.qty = 2").count() == 10
    with pytest.raises(Exception, match=r"ConfigurationError: format 'pgjournal' reads the columns .*got a schema "
                                        r"with seq_nr string"):
        spark.read.format("pgjournal").option("dsn", dsn).schema("seq_nr STRING").load().collect()
    with pytest.raises(Exception, match=r"InvalidArgument: option columns must name distinct columns of "
                                        r"event_journal .*got 'persistence_id,payload'"):
        source(spark, dsn, columns="persistence_id,payload")


def test_a_task_reuses_its_process_connection_and_replaces_a_stale_one(spark: Any, journal: Journal,
                                                                       dsn: str) -> None:
    fill(journal, pids=6)
    reader = batch_reader(spark, dsn, columns="persistence_id,seq_nr", sliceRanges=1)

    def copy_backends() -> list[int]:
        with psycopg.connect(dsn) as conn:
            return [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'COPY (%'")]

    assert sum(b.num_rows for b in read_in_process(reader)) == 18
    first = copy_backends()
    assert sum(b.num_rows for b in read_in_process(reader)) == 18
    assert copy_backends() == first and len(first) == 1  # the same session served both reads
    with psycopg.connect(dsn, autocommit=True) as conn:  # the server ends it (a restart, an idle timeout)
        conn.execute("SELECT pg_terminate_backend(%s)", (first[0],))
    eventually(lambda: first[0] not in copy_backends(), what="the kept session is gone")
    assert sum(b.num_rows for b in read_in_process(reader)) == 18
    assert len(copy_backends()) == 1 and copy_backends() != first


def test_copy_statements_quote_every_value_client_side(dsn: str) -> None:
    """A COPY takes no bound parameters: spark.arrow.bind quotes values as literals; hostile ones come back
    verbatim, and braces or percent signs in the statement's own text survive."""
    from pgjournal.spark.arrow import bind

    hostile = ["x'); DROP TABLE event_journal; --", "{f0} %(f0)s %% \\ \" ' é \U0001f600", ""]
    when = datetime(2026, 11, 1, 12, 0, 0, 123456, tzinfo=UTC)
    text = bind("SELECT %(a)s::text, %(b)s::text[], %(n)s::bigint, %(t)s::timestamptz, '{x}', 'a%%b', %(z)s::int",
                {"a": hostile[0], "b": hostile, "n": 2**40, "t": when, "z": None})
    assert "%(" not in text.replace("%(f0)s", "")
    with psycopg.connect(dsn) as conn:
        assert conn.execute(text).fetchone() == (hostile[0], hostile, 2**40, when, "{x}", "a%b", None)
        assert conn.execute("SELECT to_regclass('event_journal') IS NOT NULL").fetchone() == (True,)
    with pytest.raises(KeyError, match="no value for placeholder"):
        bind("SELECT %(missing)s", {})


def test_json_payloads_decode_in_arrow_as_they_would_one_at_a_time() -> None:
    """spark.decode (Arrow's JSON reader) gives what the serializer registry's path gives: rows it cannot take
    (another serializer id, not one line, not an object) go one at a time, a batch its reader refuses (a value
    that does not fit) or a type it reads otherwise (a timestamp field) goes one at a time altogether."""
    import cbor2
    import pyarrow as pa
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from pgjournal.spark.arrow import ArrowRows, Columns

    def convert(event: Any, rows: list[tuple[int, bytes]]) -> tuple[list[Any], list[Any], int]:
        schema = StructType([StructField("seq_nr", LongType()), StructField("event", event)])
        converter = ArrowRows(schema, Columns.of(["seq_nr", "event"], "event",
                                                 ("event_ser_id", "event_ser_manifest", "event_payload")))
        raw = pa.RecordBatch.from_arrays(
            [pa.array(range(len(rows)), pa.int64()), pa.array([r[0] for r in rows], pa.int32()),
             pa.array([""] * len(rows)), pa.array([r[1] for r in rows], pa.binary()), pa.array(["Cart|1"] * len(rows))],
            names=["seq_nr", "event_ser_id", "event_ser_manifest", "event_payload", "persistence_id"])
        assert converter.columns.read == tuple(raw.schema.names)
        fast = converter.convert(raw).column("event").to_pylist()
        schema_type = converter.arrow_schema.field("event").type
        slow, _ = converter.decoder._one_by_one([r[0] for r in rows], [""] * len(rows), [r[1] for r in rows],
                                                ["Cart|1"] * len(rows), schema_type)
        return fast, slow.to_pylist(), converter.fast_rows

    nested = StructType([StructField("item", StringType()), StructField("qty", IntegerType()),
                         StructField("tags", ArrayType(StringType())),
                         StructField("at", StructType([StructField("x", LongType())]))])
    plain = [(31, json.dumps(v).encode()) for v in (
        {"item": "a", "qty": 1, "tags": ["x", "y"], "at": {"x": 5}, "extra": [1]}, {"item": "é\n\"q\""},
        {}, {"qty": -3, "tags": [], "at": None})]
    fast, slow, used = convert(nested, plain)
    assert used == 4 and fast == slow and fast[0] == {"item": "a", "qty": 1, "tags": ["x", "y"], "at": {"x": 5}}
    for refused in [(31, b'{"qty": 3000000000}'), (31, b'{"item": 5}')]:  # Arrow's reader refuses the batch
        fast, slow, used = convert(nested, [*plain, refused])
        assert used == 0 and fast == slow, refused  # the whole batch went one payload at a time
    for odd in [(31, b"[1, 2]"), (31, b'{"item":\n"a"}'), (33, cbor2.dumps({"item": "cbor"})), (4, b"\x00\x01")]:
        fast, slow, used = convert(nested, [odd, *plain, odd])
        assert used == 4 and fast == slow, odd  # only the odd rows went one at a time, merged back in order
    shifted = [(31, b'{"item": "x"}\n{"item": "y"}'), (31, b"")]  # two lines in one payload, none in the next
    fast, slow, used = convert(nested, [*plain, *shifted])
    assert used == 4 and fast == slow and fast[-2:] == [None, None]
    stamped = StructType([StructField("when", TimestampType()), StructField("raw", BinaryType())])
    fast, slow, used = convert(stamped, [(31, b'{"when": "2026-11-01T00:00:00"}')])
    assert used == 0 and fast == slow == [None]


def tagged_keys(dsn: str, tag: str) -> set[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = %s "
                                "AND NOT deleted AND %s = ANY(tags)", (ENTITY, tag)).fetchall())


def test_option_tags_reads_only_tagged_rows_in_batch_and_stream(spark: Any, journal: Journal, dsn: str) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    fill(journal, pids=40, kinds=(ENTITY,))
    expected = tagged_keys(dsn, "even")
    assert 0 < len(expected) < len(journal_keys(dsn))
    frame = source(spark, dsn, entityType=ENTITY, tags="even, other")
    assert sorted(keys(frame)) == sorted(expected)
    assert all("even" in r["tags"] for r in frame.select("tags").collect())
    reader = stream_reader(spark, dsn, tags="even", maxEventsPerTrigger=7)
    got, end, _ = drain(reader, reader.initialOffset(), ReadMaxRows(7))
    assert sorted(got) == sorted(expected)
    # Untagged events after the stream's offset are not read; the next tagged one is, once.
    journal.append(f"{ENTITY}|plain", [{"item": "x", "qty": 1}] * 5)
    journal.append(f"{ENTITY}|0", [{"item": "y", "qty": 2}], tags=["even"])

    def the_new_tagged_event_read() -> bool:
        return drain(reader, end, ReadAllAvailable())[0] == [(f"{ENTITY}|0", 4)]

    eventually(the_new_tagged_event_read, timeout=30)
    reader.stop()
    with pytest.raises(Exception, match=r"InvalidArgument: option tags must be tags separated by commas, got "
                                        r"'red,,blue'"):
        source(spark, dsn, tags="red,,blue")
