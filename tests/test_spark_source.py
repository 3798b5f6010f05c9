"""The native ``format("pgjournal")`` Spark source (spark/source.py, spark/stream.py) against a real PostgreSQL.

One local Spark for the file; skipped when PySpark or Java 17+ is missing. Data stays small (hundreds of
events): what is checked is exactness (every (pid, seq_nr) once), not speed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import FAST, eventually

from pgjournal import Journal
from pgjournal.slices import slice_for_persistence_id
from pgjournal.write import insert_sql
from spark.session import check_spark_available

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")

ENTITY = "Cart"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark for every test here (shared with test_spark.py when both run)."""
    try:
        check_spark_available()
    except Exception as exc:  # ConfigurationError: no Java, no jar
        pytest.skip(f"Spark unavailable: {exc}")
    from spark.session import spark_session

    session = spark_session("pgjournal-tests")
    yield session
    session.stop()


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
    assert len(got) == len(expected) == 6
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


def test_filters_are_pushed_to_sql_and_prune_ranges(spark: Any, journal: Journal, dsn: str) -> None:
    from pyspark.sql import functions as F

    fill(journal, pids=30, per_pid=4)
    frame = source(spark, dsn, sliceRanges=8)
    pid = "Cart|4"
    target = slice_for_persistence_id(pid)
    one = frame.where((F.col("persistence_id") == pid) & (F.col("seq_nr") >= 2))
    assert sorted(keys(one)) == [(pid, 2), (pid, 3), (pid, 4)]
    # pushed: Spark keeps only its own not-null checks above the scan
    plan = one._jdf.queryExecution().executedPlan().toString()
    assert "Cart|4" not in plan and "Filter (isnotnull(persistence_id" in plan, plan
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


# -- helpers --------------------------------------------------------------------------------------------


def insert_in(conn: psycopg.Connection, pid: str, after: int, count: int = 1, entity_type: str = ENTITY) -> None:
    """The write path's statement on the caller's (non-autocommit) connection: a writer holding its lock."""
    conn.execute(insert_sql("event_journal", after_latest=False, single=False), {
        "slice": slice_for_persistence_id(pid), "entity_type": entity_type, "pid": pid, "writer": "held",
        "tags": None, "expected": after, "meta_ser_id": None, "meta_manifest": None, "meta_payload": None,
        "ser_ids": [4] * count, "manifests": [""] * count, "payloads": [b'{"held":true}'] * count})


_unused = (json, threading, time, timedelta, datetime, Path, FAST, eventually)
