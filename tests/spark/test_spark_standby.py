"""The Spark source on a hot standby (option ``replica``): its tasks read the standby, below the primary's horizon
once the standby has replayed it. Pointed at the standby itself, a read takes the standby's horizon, which sees none
of the primary's writers: it reads past a writer still open there, whose event, committed later with an earlier
timestamp, an incremental load that resumes after the rows it read never reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import FAST
from support.standby import StandbyPair, standby_pair

from pgjournal import ConfigurationError, InvalidArgument, Journal

pytestmark = [pytest.mark.spark, pytest.mark.one_worker]  # one standby for the module
pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def pair() -> Iterator[StandbyPair]:
    with standby_pair() as built:
        yield built


def read(spark: Any, **options: str) -> list[tuple[str, int]]:
    frame = spark.read.format("pgjournal").option("entityType", "Open")
    for key, value in options.items():
        frame = frame.option(key, value)
    return sorted((r["persistence_id"], r["seq_nr"]) for r in frame.load().select("persistence_id", "seq_nr").collect())


def test_a_read_on_the_standby_stops_below_a_writer_open_on_the_primary(spark: Any, pair: StandbyPair) -> None:
    on_standby = {"dsn": pair.primary_dsn, "replica": pair.standby_dsn}
    with Journal.open(pair.primary_dsn, **FAST) as writer:
        writer.append("Open|first", [{"n": 1}])
        with writer.transaction() as tx:
            tx.append("Open|late", [{"n": 1}], expected_seq_nr=0)
            writer.append("Open|early", [{"n": 1}])
            pair.wait_replayed()  # the committed events are on the standby; the open one is not committed
            assert read(spark, **on_standby) == [("Open|first", 1)]
            # What the option prevents: the standby's own horizon passes the writer open on the primary.
            assert read(spark, dsn=pair.standby_dsn) == [("Open|early", 1), ("Open|first", 1)]
        pair.wait_replayed()
        assert read(spark, **on_standby) == [("Open|early", 1), ("Open|first", 1), ("Open|late", 1)]


@pytest.mark.parametrize("sharded", [False, True])
def test_its_tasks_read_the_standby(spark: Any, pair: StandbyPair, sharded: bool) -> None:
    """Option replica of one database, or a sharded journal's ``replica:RANGE=DSN`` (here one database's)."""
    from pgjournal.shards import ShardSettings, migrate_all
    from pgjournal.spark.source import JournalBatchReader, SourceOptions

    options = {"dsn": pair.primary_dsn, "replica": pair.standby_dsn, "entityType": "Tasks"}
    if sharded:
        shards = f"0-1023={pair.primary_dsn};replica:0-1023={pair.standby_dsn}"
        migrate_all(ShardSettings.parse(shards))  # the layout record, replayed on the standby too
        pair.wait_replayed()
        options = {"shards": shards, "entityType": "Tasks"}
    with Journal.open(pair.primary_dsn, **FAST) as writer:
        writer.append(f"Tasks|{sharded}", [{"n": 1}, {"n": 2}])
    pair.wait_replayed()
    frame = spark.read.format("pgjournal").options(**options).load()
    reader = JournalBatchReader(SourceOptions.parse(options), frame.schema)
    assert {partition.dsn for partition in reader.partitions()} == {pair.standby_dsn}
    assert {(f"Tasks|{sharded}", 1), (f"Tasks|{sharded}", 2)} <= {
        (r[0], r[1]) for r in frame.select("persistence_id", "seq_nr").collect()}


def test_a_replica_that_is_not_a_standby_of_the_database_or_given_with_shards_is_refused(
        spark: Any, pair: StandbyPair, dsn: str) -> None:
    from pgjournal.spark.source import SourceOptions

    with pytest.raises(Exception, match=r"is not a standby \(pg_is_in_recovery\(\) is false\)"):
        read(spark, dsn=pair.primary_dsn, replica=dsn)
    with pytest.raises(InvalidArgument, match="option replica is the standby of one database"):
        SourceOptions.parse({"shards": f"0-1023={pair.primary_dsn}", "replica": pair.standby_dsn})
    with pytest.raises(ConfigurationError, match="option replica: DSN must be a non-empty"):
        SourceOptions.parse({"dsn": pair.primary_dsn, "replica": " "})


def test_a_stream_on_the_standby_delivers_each_event_once_across_a_writer_open_on_the_primary(
        spark: Any, pair: StandbyPair, tmp_path: Path) -> None:
    """Two availableNow runs from one checkpoint: the first stops below the writer still open on the primary, the
    second delivers its event, committed later with an earlier timestamp than an event the first could see."""

    def run() -> list[tuple[str, int]]:
        query = (spark.readStream.format("pgjournal").option("dsn", pair.primary_dsn)
                 .option("replica", pair.standby_dsn).option("entityType", "Streamed").load()
                 .writeStream.format("parquet").option("path", str(tmp_path / "data"))
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        query.awaitTermination(120)
        frame = spark.read.schema("persistence_id STRING, seq_nr BIGINT").parquet(str(tmp_path / "data"))
        return sorted((r["persistence_id"], r["seq_nr"]) for r in frame.collect())

    with Journal.open(pair.primary_dsn, **FAST) as writer:
        writer.append("Streamed|first", [{"n": 1}])
        with writer.transaction() as tx:
            tx.append("Streamed|late", [{"n": 1}], expected_seq_nr=0)
            writer.append("Streamed|early", [{"n": 1}])
            pair.wait_replayed()
            assert run() == [("Streamed|first", 1)]
        pair.wait_replayed()
        assert run() == [("Streamed|early", 1), ("Streamed|first", 1), ("Streamed|late", 1)]
