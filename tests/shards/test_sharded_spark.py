"""The Spark readers over a sharded journal: the native ``format("pgjournal")`` source (option ``shards``) and
the JDBC reader (``read_events(shards=...)``) read each database's slice ranges as their own partitions, from
that database; the layout must agree; the stream reads each database below its own horizon, exactly once."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.held_writes import insert_in

from pgjournal.errors import ConfigurationError, InvalidArgument, ShardLayoutMismatch
from pgjournal.model.slices import slice_for_persistence_id
from pgjournal.shards import ShardedJournal
from pgjournal.spark.source import SourceOptions, source_schema

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")


@pytest.fixture
def sharded(shard_databases: Callable[..., list[str]]) -> list[str]:
    """2 databases of a sharded journal holding 60 entities of Cart and Order, 3 events each."""
    dsns = shard_databases(2)
    with ShardedJournal.open(dsns, migrate=True, **FAST) as journal:
        for i in range(60):
            # hashed ids: "Cart|0", "Cart|2", ... land in neighbouring slices, all in one database
            entity = hashlib.sha1(str(i).encode()).hexdigest()[:12]
            journal.append(f"{('Cart', 'Order')[i % 2]}|{entity}", [{"item": f"sku-{i}", "qty": n} for n in range(3)])
    return dsns


def rows(dsn: str, entity_type: str) -> set[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = %s",
                                (entity_type,)).fetchall())


def by_partition(frame: Any) -> dict[int, list[tuple[int, str, int]]]:
    from pyspark.sql import functions as F

    found: dict[int, list[tuple[int, str, int]]] = {}
    for r in frame.select(F.spark_partition_id().alias("p"), "slice", "persistence_id", "seq_nr").collect():
        found.setdefault(r["p"], []).append((r["slice"], r["persistence_id"], r["seq_nr"]))
    return found


def check_read(frame: Any, dsns: list[str], partitions: int) -> None:
    """Every Cart event of both databases once; each partition's rows from one database's range."""
    assert frame.rdd.getNumPartitions() == partitions
    found = by_partition(frame)
    keys = [(pid, seq) for part in found.values() for _, pid, seq in part]
    assert len(keys) == len(set(keys))
    first, second = rows(dsns[0], "Cart"), rows(dsns[1], "Cart")
    assert first and second  # both databases hold some
    assert set(keys) == first | second
    for part in found.values():
        assert len({s // 512 for s, _, _ in part}) == 1, "a partition read two databases' slices"


def test_the_native_source_reads_each_databases_ranges_from_that_database(spark: Any, sharded: list[str]) -> None:
    shards = f"0-511={sharded[0]};512-1023={sharded[1]}"
    def reader() -> Any:  # a DataFrameReader keeps the options given to it: one per read
        return spark.read.format("pgjournal").option("shards", shards).option("entityType", "Cart")

    # 4 ranges, 2 in each database
    check_read(reader().option("columns", "slice,persistence_id,seq_nr").load(), sharded, 4)
    # one range over both databases is cut at their boundary: one partition per database
    decoded = reader().option("sliceRanges", "0-1023").option("decode", "true").load()
    check_read(decoded, sharded, 2)
    assert {r["event"]["item"] for r in decoded.select("event").collect()} == {f"sku-{i}" for i in range(0, 60, 2)}


def test_the_jdbc_reader_reads_each_databases_ranges_from_that_database(spark: Any, sharded: list[str]) -> None:
    from pgjournal.spark.read import read_events

    check_read(read_events(spark, entity_type="Cart", slice_ranges=4, shards=sharded, decode=False), sharded, 4)
    decoded = read_events(spark, entity_type="Cart", slice_ranges=1, shards={"0-511": sharded[0],
                                                                            "512-1023": sharded[1]})
    check_read(decoded, sharded, 2)
    assert {r["event"]["qty"] for r in decoded.select("event").collect()} == {0, 1, 2}


def test_a_sharded_read_checks_the_recorded_layout_and_its_options(sharded: list[str]) -> None:
    swapped = f"0-511={sharded[1]};512-1023={sharded[0]}"
    with pytest.raises(ShardLayoutMismatch, match="DSNs swapped or wrong"):
        source_schema(SourceOptions.parse({"shards": swapped, "entityType": "Cart"}))
    with pytest.raises(InvalidArgument, match="option shards: give a dsn"):
        SourceOptions.parse({"shards": swapped, "dsn": sharded[0]})
    with pytest.raises(ConfigurationError, match=r"option shards: shard ranges 0-600 and 512-1023 overlap"):
        SourceOptions.parse({"shards": f"0-600={sharded[0]};512-1023={sharded[1]}"})
    options = SourceOptions.parse({"shards": f"0-511={sharded[0]};512-1023={sharded[1]}", "entityType": "Nothing"})
    with pytest.raises(ConfigurationError, match="in none of the 2 databases"):
        source_schema(options)


def test_a_stream_of_a_sharded_journal_delivers_each_event_once_across_runs(
        spark: Any, sharded: list[str], tmp_path: Path) -> None:
    """readStream over two databases: the ranges cut at their boundary, each read from its database below its own
    horizon; micro-batches of at most 7 events taken across both; a second run from the checkpoint delivers only
    the events appended since, and a transaction held open in one database holds back only that database."""
    shards = f"0-511={sharded[0]};512-1023={sharded[1]}"

    def run() -> Any:
        query = (spark.readStream.format("pgjournal").option("shards", shards).option("entityType", "Cart")
                 .option("sliceRanges", "0-1023").option("maxEventsPerTrigger", 7).load()
                 .select("persistence_id", "seq_nr").writeStream.format("parquet")
                 .option("path", str(tmp_path / "data")).option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination(300)
        return query

    def delivered() -> list[tuple[str, int]]:
        frame = spark.read.schema("persistence_id STRING, seq_nr BIGINT").parquet(str(tmp_path / "data"))
        return [(r["persistence_id"], r["seq_nr"]) for r in frame.collect()]

    first = run()
    got = delivered()
    assert len(got) == len(set(got)) and set(got) == rows(sharded[0], "Cart") | rows(sharded[1], "Cart")
    assert len(first.recentProgress) >= 90 // 7  # 90 events, at most 7 per micro-batch over both databases

    low = next(p for p in (f"Cart|low{i}" for i in range(1000)) if slice_for_persistence_id(p) < 512)
    high = next(p for p in (f"Cart|high{i}" for i in range(1000)) if slice_for_persistence_id(p) >= 512)
    late = next(p for p in (f"Cart|late{i}" for i in range(1000)) if slice_for_persistence_id(p) < 512)
    with ShardedJournal.open(sharded, **FAST) as journal, psycopg.connect(sharded[0]) as held:
        insert_in(held, late, 0)  # an append held open in the first database
        journal.append(low, ["a", "b"])
        journal.append(high, ["c"])
        eventually(lambda: (run(), (high, 1) in set(delivered()))[1], "the second database's new event",
                   timeout=120, interval=0.5)
        assert (low, 1) not in set(delivered()), "the held transaction bounds its own database"
        held.commit()
    run()
    got = delivered()
    assert len(got) == len(set(got)) and set(got) == rows(sharded[0], "Cart") | rows(sharded[1], "Cart")
    assert {(low, 1), (low, 2), (high, 1), (late, 1)} <= set(got)
