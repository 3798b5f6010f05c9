"""Spark readers and jobs against a real PostgreSQL, with one local Spark for the whole file.

Skipped only with ``PGJOURNAL_SKIP_SPARK=1``. Otherwise a missing PySpark, Java 17+ or PostgreSQL JDBC jar
fails them with what to do: ``make setup`` installs all three (see spark/system.py).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support import FAST, create_login_role

from pgjournal import Journal
from pgjournal.errors import ConfigurationError, InvalidArgument, JournalError
from pgjournal.model.slices import entity_type_of, slice_for_persistence_id
from pgjournal.spark import files
from pgjournal.spark import jobs as spark_jobs
from pgjournal.spark.jdbc import jdbc_target
from pgjournal.spark.session import JAR_ENV, find_java, find_jdbc_jar
from pgjournal.spark.system import SKIP_ENV, spark_skipped

pytestmark = pytest.mark.spark
if spark_skipped():
    pytest.skip(f"{SKIP_ENV} is set", allow_module_level=True)

AKKA_DDL = """
CREATE SCHEMA akka;
CREATE TABLE akka.event_journal(
  slice INT NOT NULL, entity_type VARCHAR(255) NOT NULL, persistence_id VARCHAR(255) NOT NULL,
  seq_nr BIGINT NOT NULL, db_timestamp timestamp with time zone NOT NULL,
  event_ser_id INTEGER NOT NULL, event_ser_manifest VARCHAR(255) NOT NULL, event_payload BYTEA NOT NULL,
  deleted BOOLEAN DEFAULT FALSE NOT NULL, writer VARCHAR(255) NOT NULL, adapter_manifest VARCHAR(255),
  tags TEXT ARRAY, meta_ser_id INTEGER, meta_ser_manifest VARCHAR(255), meta_payload BYTEA,
  PRIMARY KEY(persistence_id, seq_nr));
CREATE INDEX event_journal_slice_idx ON akka.event_journal(slice, entity_type, db_timestamp, seq_nr);
"""


def journal_rows(dsn: str, where: str = "NOT deleted") -> set[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute(f"SELECT persistence_id, seq_nr FROM event_journal WHERE {where}").fetchall())


def frame_rows(frame: Any) -> list[tuple[str, int]]:
    return [(r["persistence_id"], r["seq_nr"]) for r in frame.select("persistence_id", "seq_nr").collect()]


def fill(journal: Journal, pids: int = 40, per_pid: int = 3) -> None:
    for i in range(pids):
        kind = "Cart" if i % 3 else "Order"
        journal.append(f"{kind}|{i}", [{"item": f"sku-{i}", "qty": n} for n in range(per_pid)],
                       tags=["even"] if i % 2 == 0 else ())


# -- DSN to JDBC ---------------------------------------------------------------------------------------


def test_jdbc_target_from_url_keeps_the_password_out_of_url_and_repr() -> None:
    target = jdbc_target("postgresql://alice:s3cret@db.example:6543/shop?sslmode=require&application_name=etl")
    assert target.url == "jdbc:postgresql://db.example:6543/shop"
    assert target.properties["user"] == "alice"
    assert target.properties["password"] == "s3cret"
    assert target.properties["sslmode"] == "require"
    assert target.properties["ApplicationName"] == "etl"
    # bounded like every pgjournal connection: connect timeout (connect_timeout, 10 s) and keepalives
    assert (target.properties["connectTimeout"], target.properties["tcpKeepAlive"]) == ("10", "true")
    assert "s3cret" not in repr(target) and "s3cret" not in target.url


def test_jdbc_target_from_key_value_form_and_several_hosts() -> None:
    target = jdbc_target("host=a,b port=5433,5434 dbname=x user=u password='p w'")
    assert target.url == "jdbc:postgresql://a:5433,b:5434/x"
    assert target.properties["password"] == "p w"


@pytest.mark.parametrize(("dsn", "message"), [
    ("host=/var/run/postgresql dbname=x", "Unix socket"),
    ("host=a,b port=1,2,3 dbname=x", "2 hosts but 3 ports"),
    ("postgresql://u:hidden@h:5432/db?krbsrvname=x", "no JDBC equivalent"),
    ("postgresql://u:hidden@h:5432/db?bogus=1", "malformed DSN"),
    ("postgresql://u:hidden@h:99999/db", "port"),
])
def test_jdbc_target_rejects_what_jdbc_cannot_use(dsn: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as info:
        jdbc_target(dsn)
    assert "hidden" not in str(info.value)


# -- environment checks ------------------------------------------------------------------------------


def test_missing_jar_and_java_give_install_instructions(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(JAR_ENV, str(tmp_path / "nope.jar"))
    with pytest.raises(ConfigurationError, match="libpostgresql-jdbc-java"):
        find_jdbc_jar()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ConfigurationError, match="openjdk-17-jre-headless"):
        find_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigurationError, match="no java was found"):
        find_java()


def test_configured_jar_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = tmp_path / "postgresql-42.jar"
    jar.write_bytes(b"PK")
    monkeypatch.setenv(JAR_ENV, str(jar))
    assert find_jdbc_jar().path == str(jar)


# -- reader ----------------------------------------------------------------------------------------


def test_read_events_equals_the_journal_one_partition_per_range(spark: Any, journal: Journal, dsn: str) -> None:
    from pgjournal.spark.read import read_events

    fill(journal)
    journal.append("Raw|1", [b"\x00\xff"])
    journal.delete_events("Cart|1", 2)
    for ranges in (1, 4, 8):
        frame = read_events(spark, dsn, slice_ranges=ranges)
        assert frame.rdd.getNumPartitions() == ranges
        rows = frame_rows(frame)
        assert len(rows) == len(set(rows))
        assert set(rows) == journal_rows(dsn)
    assert ("Cart|1", 1) not in set(rows) and ("Cart|1", 3) in set(rows)


def test_columns_types_timestamps_tags_and_decoded_payload(spark: Any, journal: Journal, dsn: str) -> None:
    from pgjournal.spark.read import read_events

    written = journal.append("Cart|7", [{"item": "apple", "qty": 2}], tags=["fruit", "sale"])
    journal.append("Cart|8", [{"item": "pear", "qty": 1, "gift": True}])
    journal.append("Raw|1", [b"\x00\x01"])
    frame = read_events(spark, dsn, slice_ranges=2)
    types = dict(frame.dtypes)
    assert types["db_timestamp"] == "timestamp" and types["tags"] == "array<string>"
    assert types["event"] == "struct<gift:boolean,item:string,qty:bigint>"
    by_pid = {r["persistence_id"]: r for r in frame.collect()}
    apple = by_pid["Cart|7"]
    assert apple["tags"] == ["fruit", "sale"] and by_pid["Cart|8"]["tags"] == []
    assert apple["event"]["item"] == "apple" and apple["event"]["qty"] == 2
    assert by_pid["Raw|1"]["event"] is None and bytes(by_pid["Raw|1"]["event_payload"]) == b"\x00\x01"
    assert apple["slice"] == slice_for_persistence_id("Cart|7") and apple["entity_type"] == "Cart"
    # The session time zone is UTC: the timestamp text is the journal's instant in UTC.
    text = frame.where("persistence_id = 'Cart|7'").selectExpr("CAST(db_timestamp AS STRING)").first()[0]
    assert text == written[0].db_timestamp.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f").rstrip("0").rstrip(".")
    given = read_events(spark, dsn, payload_schema="item STRING, qty INT", slice_ranges=2)
    assert dict(given.dtypes)["event"] == "struct<item:string,qty:int>"


def test_filters_entity_type_and_time_window(spark: Any, journal: Journal, dsn: str) -> None:
    from pgjournal.spark.read import read_events

    fill(journal, pids=10, per_pid=1)
    time.sleep(0.01)
    middle = journal.append("Cart|mid", [{"x": 1}])[0].db_timestamp
    time.sleep(0.01)
    fill(journal, pids=10, per_pid=1)  # second events of the same pids, later
    carts = frame_rows(read_events(spark, dsn, entity_type="Cart", decode=False))
    assert set(carts) == journal_rows(dsn, "entity_type = 'Cart'")
    window = frame_rows(read_events(spark, dsn, since=middle, until=middle + timedelta(microseconds=1),
                                    decode=False))
    assert window == [("Cart|mid", 1)]
    before = frame_rows(read_events(spark, dsn, until=middle.isoformat(), decode=False))
    assert set(before) == {(f"{'Cart' if i % 3 else 'Order'}|{i}", 1) for i in range(10)}


def test_reads_an_akka_r2dbc_table(spark: Any, dsn: str) -> None:
    from pgjournal.spark.read import read_events

    with psycopg.connect(dsn) as conn:
        conn.execute(AKKA_DDL)
        for pid, seq in [("ShoppingCart|a", 1), ("ShoppingCart|a", 2), ("Account|b", 1)]:
            conn.execute(
                "INSERT INTO akka.event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
                "event_ser_id, event_ser_manifest, event_payload, writer, tags) "
                "VALUES (%s, %s, %s, %s, now(), 31, 'com.example.ItemAdded', %s, 'akka', NULL)",
                (slice_for_persistence_id(pid), entity_type_of(pid), pid, seq, b'{"itemId":"x","quantity":%d}' % seq))
    frame = read_events(spark, dsn, table="akka.event_journal", entity_type="ShoppingCart")
    rows = sorted((r["persistence_id"], r["seq_nr"], r["event"]["quantity"], tuple(r["tags"])) for r in frame.collect())
    assert rows == [("ShoppingCart|a", 1, 1, ()), ("ShoppingCart|a", 2, 2, ())]


def insert_payload(conn: psycopg.Connection, pid: str, seq_nr: int, ser_id: int, payload: bytes) -> None:
    conn.execute(
        "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
        "event_ser_manifest, event_payload, writer) VALUES (%s, %s, %s, %s, now(), %s, '', %s, 'sql')",
        (slice_for_persistence_id(pid), entity_type_of(pid), pid, seq_nr, ser_id, payload))


def test_decodes_json_31_and_legacy_json_33_where_the_marker_says_so(spark: Any, empty_dsn: str, tmp_path: Path
                                                                     ) -> None:
    """Id 31 is JSON; 33 is JSON only in a database migrated with pgjournal's old JSON-33 rows, and only where
    the payload is JSON (a CBOR map never starts with '{'); CBOR is decoded as CBOR."""
    import cbor2
    from alembic import command

    from pgjournal.admin.migrate import alembic_config
    from pgjournal.spark.read import read_events

    command.upgrade(alembic_config(empty_dsn), "0003")
    with psycopg.connect(empty_dsn) as conn:
        insert_payload(conn, "Cart|old", 1, 33, b'{"item":"old","qty":1}')
    command.upgrade(alembic_config(empty_dsn), "head")
    with psycopg.connect(empty_dsn) as conn:
        insert_payload(conn, "Cart|new", 1, 31, b'{"item":"new","qty":2}')
        insert_payload(conn, "Cart|cbor", 1, 33, cbor2.dumps({"item": "cbor", "qty": 3}))
    events = {r["persistence_id"]: r["event"] for r in read_events(spark, empty_dsn, slice_ranges=2).collect()}
    assert events["Cart|old"]["item"] == "old" and events["Cart|new"]["qty"] == 2
    assert events["Cart|cbor"].asDict() == {"item": "cbor", "qty": 3}
    out = str(tmp_path / "load")
    spark_jobs.load_events(spark, out, "legacy", dsn=empty_dsn, decode=True, behind=0.0)
    loaded_events = {r["persistence_id"]: r["event"] for r in spark.read.parquet(out).collect()}
    assert loaded_events["Cart|old"]["item"] == "old" and loaded_events["Cart|cbor"]["qty"] == 3


def test_json_under_33_is_cbor_in_a_fresh_database(spark: Any, dsn: str) -> None:
    from pgjournal.spark.read import read_events

    with psycopg.connect(dsn) as conn:
        insert_payload(conn, "Cart|a", 1, 31, b'{"item":"a"}')
        insert_payload(conn, "Cart|b", 1, 33, b'{"item":"b"}')
    events = {r["persistence_id"]: r["event"] for r in read_events(spark, dsn, slice_ranges=1).collect()}
    assert events["Cart|a"]["item"] == "a" and events["Cart|b"] is None


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"slice_ranges": 3}, InvalidArgument, "divisor of 1024"),
    ({"slice_ranges": [(0, 600), (500, 1023)]}, InvalidArgument, "overlap"),
    ({"slice_ranges": [(0, 1024)]}, InvalidArgument, "max_slice"),
    ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, InvalidArgument, "earlier than"),
    ({"since": datetime(2026, 1, 1)}, InvalidArgument, "timezone-aware"),
    ({"until": "yesterday"}, InvalidArgument, "ISO 8601"),
    ({"entity_type": ""}, InvalidArgument, "entity_type"),
    ({"table": "x; DROP TABLE y"}, ConfigurationError, 'relation "x; DROP TABLE y" does not exist'),  # quoted
    ({"table": "a.b.c"}, InvalidArgument, "table must be"),
    ({"table": "no_such_table"}, ConfigurationError, 'relation "no_such_table" does not exist'),
    ({"payload_schema": "item STRNG,"}, InvalidArgument, "DDL"),
    ({"fetch_size": 0}, InvalidArgument, "fetch_size"),
])
def test_bad_read_options_fail_clearly(spark: Any, dsn: str, kwargs: dict[str, Any], error: type, message: str) -> None:
    from pgjournal.spark.read import read_events

    with pytest.raises(error, match=message):
        read_events(spark, dsn, **kwargs)


# -- export ----------------------------------------------------------------------------------------


def test_export_partitions_by_entity_type_and_slice_range(spark: Any, journal: Journal, dsn: str,
                                                          tmp_path: Path) -> None:
    fill(journal)
    seen = []
    out = str(tmp_path / "export")
    result = spark_jobs.export_events(spark, out, dsn=dsn, slice_ranges=4, progress=seen.append)
    assert result.rows == len(journal_rows(dsn))
    assert seen[-1].done == seen[-1].total > 0
    back = spark.read.parquet(out)
    assert set(frame_rows(back)) == journal_rows(dsn) and back.count() == result.rows
    for r in back.select("entity_type", "slice_range", "slice").collect():
        lo, hi = (int(x) for x in r["slice_range"].split("-"))
        assert lo <= r["slice"] <= hi and hi - lo == 255
    assert sorted(n for n in os.listdir(out) if not n.startswith((".", "_"))) == [
        "entity_type=Cart", "entity_type=Order"]
    # Re-exporting one entity type replaces only its directory.
    journal.append("Order|new", [{"item": "n"}])
    again = spark_jobs.export_events(spark, out, dsn=dsn, entity_type="Order", slice_ranges=4)
    assert again.rows == len(journal_rows(dsn, "entity_type = 'Order'"))
    assert set(frame_rows(spark.read.parquet(out))) == journal_rows(dsn)


# -- incremental load ------------------------------------------------------------------------------


def loaded(spark: Any, out: str) -> list[tuple[str, int]]:
    if not any(name.startswith("load=") for name in files.list_names(spark, out)):
        return []
    return frame_rows(spark.read.parquet(out))


def test_running_the_load_again_adds_only_new_events(spark: Any, journal: Journal, dsn: str, tmp_path: Path) -> None:
    out = str(tmp_path / "load")
    fill(journal, pids=20, per_pid=2)
    time.sleep(0.2)
    first = spark_jobs.load_events(spark, out, "daily", dsn=dsn, slice_ranges=4)
    assert first.load_number == 1 and first.rows == 40
    again = spark_jobs.load_events(spark, out, "daily", dsn=dsn, slice_ranges=8)  # re-sliced: still per slice
    assert again.rows == 0
    fill(journal, pids=5, per_pid=1)  # same pids: seq nr 3, same timestamp rules
    time.sleep(0.2)
    third = spark_jobs.load_events(spark, out, "daily", dsn=dsn, slice_ranges=2)
    assert third.rows == 5
    rows = loaded(spark, out)
    assert len(rows) == len(set(rows)) and set(rows) == journal_rows(dsn)
    with pytest.raises(ConfigurationError, match="loads entity type"):
        spark_jobs.load_events(spark, out, "daily", dsn=dsn, entity_type="Cart")


def insert_late(conn: psycopg.Connection, pid: str, seq_nr: int) -> None:
    """Insert one event stamped with this transaction's start time (as the write path does), uncommitted."""
    conn.execute(
        "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
        "event_ser_manifest, event_payload, writer) VALUES (%s, %s, %s, %s, CURRENT_TIMESTAMP, 31, '', %s, 'late')",
        (slice_for_persistence_id(pid), entity_type_of(pid), pid, seq_nr, b'{"late":true}'))


def test_load_under_concurrent_writers_and_late_commits_is_exactly_once(spark: Any, journal: Journal, dsn: str,
                                                                        tmp_path: Path) -> None:
    out = str(tmp_path / "load")
    fill(journal, pids=10, per_pid=2)
    late = psycopg.connect(dsn)  # a transaction that stays open across a load, then commits old timestamps
    insert_late(late, "Cart|late", 1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        n = 0
        try:
            while not stop.is_set():
                journal.append(f"Order|w{n % 7}", [{"n": n}, {"n": n + 1}])
                n += 1
                time.sleep(0.005)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        time.sleep(0.3)
        first = spark_jobs.load_events(spark, out, "live", dsn=dsn)
        assert first.horizon <= late.execute("SELECT CURRENT_TIMESTAMP").fetchone()[0]  # type: ignore[index]
        assert ("Cart|late", 1) not in loaded(spark, out)
        late.commit()  # commits an event older than events already loaded
        spark_jobs.load_events(spark, out, "live", dsn=dsn, slice_ranges=8)
        spark_jobs.load_events(spark, out, "live", dsn=dsn, slice_ranges=2)
    finally:
        stop.set()
        thread.join()
        late.close()
    assert not errors
    time.sleep(0.3)
    last = spark_jobs.load_events(spark, out, "live", dsn=dsn)
    rows = loaded(spark, out)
    assert ("Cart|late", 1) in rows
    assert len(rows) == len(set(rows)), "an event was loaded twice"
    assert set(rows) == journal_rows(dsn), "an event was missed"
    assert spark_jobs.load_events(spark, out, "live", dsn=dsn).rows == 0
    assert last.load_number == 4


def test_crash_before_commit_is_redone_and_after_commit_is_completed(
        spark: Any, journal: Journal, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path / "load")
    fill(journal, pids=6, per_pid=1)
    time.sleep(0.2)

    def crash(*_args: Any, **_kwargs: Any) -> None:
        raise RuntimeError("crash")

    with monkeypatch.context() as patch:
        patch.setattr(spark_jobs, "commit_load", crash)
        with pytest.raises(RuntimeError):
            spark_jobs.load_events(spark, out, "crashy", dsn=dsn)
    assert files.list_names(spark, out) == [] and loaded(spark, out) == []  # a failed load leaves nothing
    fill(journal, pids=3, per_pid=1)
    time.sleep(0.2)
    with monkeypatch.context() as patch:
        patch.setattr(files, "rename", crash)
        with pytest.raises(RuntimeError):
            spark_jobs.load_events(spark, out, "crashy", dsn=dsn)  # committed, not renamed
    result = spark_jobs.load_events(spark, out, "crashy", dsn=dsn)
    assert result.load_number == 2 and result.rows == 0
    assert len(result.recovered) == 1 and result.recovered[0].startswith("completed load 000001-")
    rows = loaded(spark, out)
    assert len(rows) == len(set(rows)) and set(rows) == journal_rows(dsn)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"job": "no spaces"}, ConfigurationError, "job name"),
    ({"job": "ok", "behind": -1}, InvalidArgument, "behind"),
    ({"job": "ok", "out": " "}, InvalidArgument, "output path"),
    ({"job": "ok", "slice_ranges": 0}, InvalidArgument, "divisor"),
])
def test_bad_load_options_fail_clearly(spark: Any, dsn: str, tmp_path: Path, kwargs: dict[str, Any],
                                       error: type, message: str) -> None:
    kwargs = {"out": str(tmp_path / "o"), **kwargs}
    with pytest.raises(error, match=message):
        spark_jobs.load_events(spark, kwargs.pop("out"), kwargs.pop("job"), dsn=dsn, **kwargs)
    assert issubclass(error, JournalError)


@pytest.mark.parametrize("portable", [False, True])
def test_load_bound_with_behind_comes_from_one_horizon_reading(dsn: str, portable: bool,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit ``behind`` counts from the clock of the same reading that gives the horizon."""
    with Journal.open(dsn, portable=portable, notify=False) as journal, journal.connection() as conn:
        tracker = journal.horizon_tracker()
        readings = []
        read_step = tracker.read_step

        def counted() -> Any:
            horizon = yield from read_step()
            readings.append(horizon)
            return horizon

        monkeypatch.setattr(tracker, "read_step", counted)
        monkeypatch.setattr(journal, "horizon_tracker", lambda *_: tracker)
        before = conn.execute("SELECT CURRENT_TIMESTAMP").fetchone()[0]  # type: ignore[index]
        bound = spark_jobs.final_bound(journal, conn, 5.0)
        assert len(readings) == 1
        assert bound == readings[0].now - timedelta(seconds=5) and bound >= before - timedelta(seconds=5)


def test_portable_load_uses_the_clock_and_is_exactly_once(spark: Any, journal: Journal, dsn: str,
                                                          tmp_path: Path) -> None:
    out = str(tmp_path / "load")
    fill(journal, pids=8, per_pid=2)
    time.sleep(0.3)
    first = spark_jobs.load_events(spark, out, "portable", dsn=dsn, portable=True, behind=0.2)
    assert first.rows == 16
    fill(journal, pids=4, per_pid=1)
    time.sleep(0.3)
    assert spark_jobs.load_events(spark, out, "portable", dsn=dsn, portable=True, behind=0.2).rows == 4
    rows = loaded(spark, out)
    assert len(rows) == len(set(rows)) and set(rows) == journal_rows(dsn)
    assert files.list_names(spark, out) == ["load=000001", "load=000002"]


def test_cli_export_load_and_watermarks(spark: Any, journal: Journal, dsn: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pgjournal.cli.commands import app

    fill(journal, pids=6, per_pid=1)
    time.sleep(0.2)
    runner = CliRunner()
    exported = runner.invoke(app, ["spark", "export", str(tmp_path / "e"), "--dsn", dsn, "-n", "2", "--decode"])
    assert exported.exit_code == 0, exported.output
    assert "exported 6 events" in exported.output
    loaded_ = runner.invoke(app, ["spark", "load", str(tmp_path / "l"), "--job", "cli", "--dsn", dsn])
    assert loaded_.exit_code == 0, loaded_.output
    assert "load 1 of job 'cli': 6 new events" in loaded_.output
    shown = runner.invoke(app, ["spark", "watermarks", "cli", "--dsn", dsn, "-n", "2"])
    assert shown.exit_code == 0 and "000001-" in shown.output, shown.output
    bad = runner.invoke(app, ["spark", "load", str(tmp_path / "l"), "--job", "cli", "--dsn", dsn, "-n", "3"])
    assert bad.exit_code == 1 and "divisor of 1024" in " ".join(bad.output.split())
    assert not spark.sparkContext._jsc.sc().isStopped()  # the shared session survived the commands


# -- incremental loads as least-privileged roles (writers on another login role) --------------------------


def stall_inserts(dsn: str, pattern: str) -> None:
    """Appends to persistence ids LIKE ``pattern`` sleep 0-0.6 s inside their insert: stamped, then committed
    late, so commits land out of db_timestamp order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"""CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.persistence_id LIKE '{pattern}' THEN PERFORM pg_sleep(random() * 0.6); END IF;
            RETURN NEW; END $$""")
        for (partition,) in conn.execute("SELECT inhrelid::regclass::text FROM pg_inherits "
                                         "WHERE inhparent = 'event_journal'::regclass").fetchall():
            conn.execute(f"CREATE TRIGGER stall BEFORE INSERT ON {partition} FOR EACH ROW EXECUTE FUNCTION stall()")


def pids_outside(lo: int, hi: int, prefix: str, count: int) -> list[str]:
    """``count`` persistence ids none of whose slices is in lo..hi (that slice range stays empty)."""
    out, i = [], 0
    while len(out) < count:
        pid = f"{prefix}{i}"
        if not lo <= slice_for_persistence_id(pid) <= hi:
            out.append(pid)
        i += 1
    return out


@pytest.mark.parametrize("loader", ["loader", "loader with pg_read_all_stats",
                                    pytest.param("owner", marks=pytest.mark.slow)])  # the owner: as other tests
def test_incremental_load_as_a_least_privileged_role_loses_and_repeats_nothing(
        spark: Any, dsn: str, roles: Any, tmp_path: Path, loader: str) -> None:
    from support.eventually import eventually

    stall_inserts(dsn, "Order|stall%")
    if loader == "loader with pg_read_all_stats":
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'GRANT pg_read_all_stats TO "{roles.loader}"')
    loader_dsn = roles.dsn(dsn, roles.owner if loader == "owner" else roles.loader)
    out = str(tmp_path / "load")
    pids = pids_outside(0, 127, "Order|stall", 4) + pids_outside(0, 127, "Order|plain", 4)
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(journal: Journal, pid: str) -> None:
        # A pause between appends: the stalled writers commit out of order all the same, and unthrottled the
        # plain ones wrote 100,000-350,000 events for the loads and checks to read, loading every other test
        # of the run.
        try:
            while not stop.is_set():
                journal.append(pid, [{"pid": pid}] * 2)
                stop.wait(0.01)
        except BaseException as exc:
            errors.append(exc)

    loads = []
    with Journal.open(roles.dsn(dsn, roles.writer), **FAST) as writer:
        threads = [threading.Thread(target=write, args=(writer, pid)) for pid in pids]
        for thread in threads:
            thread.start()
        try:
            eventually(lambda: len(journal_rows(dsn)) > 20)
            for n in range(4):  # loads while writers commit out of order (ranges change between loads)
                loads.append(spark_jobs.load_events(spark, out, "roles", dsn=loader_dsn, slice_ranges=(8, 4)[n % 2]))
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert not errors, errors
    loads.append(spark_jobs.load_events(spark, out, "roles", dsn=loader_dsn, slice_ranges=8))
    rows = loaded(spark, out)
    expected = journal_rows(dsn)
    missing, twice = expected - set(rows), len(rows) - len(set(rows))
    print(f"{loader}: {len(loads)} loads, {len(expected)} events, {len(missing)} missing, {twice} duplicated")
    assert not missing and not twice
    assert not any(slice_for_persistence_id(pid) <= 127 for pid, _ in rows)  # slice range 0-127 stayed empty
    assert spark_jobs.load_events(spark, out, "roles", dsn=loader_dsn).rows == 0
    assert files.list_names(spark, out) == [f"load={n:06d}" for n in range(1, 7)]


def test_load_as_a_role_without_the_rights_fails_before_reading_and_leaves_nothing(
        spark: Any, dsn: str, server_dsn: str, roles: Any, tmp_path: Path) -> None:
    from pgjournal import InsufficientPrivilege

    out = str(tmp_path / "load")
    with Journal.open(dsn) as journal:
        fill(journal, pids=4, per_pid=1)
    with pytest.raises(InsufficientPrivilege, match=r"lacks INSERT on projection_timestamp_offset_store.*"
                                                    r"pgjournal_loader"):
        spark_jobs.load_events(spark, out, "reader", dsn=roles.dsn(dsn, roles.reader))
    stranger = f"pgj_stranger_{uuid.uuid4().hex[:8]}"
    create_login_role(server_dsn, stranger)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'GRANT CONNECT ON DATABASE "{conn.info.dbname}" TO "{stranger}"')
        with pytest.raises(InsufficientPrivilege, match="may not read pgjournal's tables"):
            spark_jobs.load_events(spark, out, "stranger", dsn=roles.dsn(dsn, stranger))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{stranger}"')
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            conn.execute(f'DROP ROLE "{stranger}"')
    assert files.list_names(spark, out) == []
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM projection_timestamp_offset_store").fetchone() == (0,)


class _ConnectLikeSession:
    """A session without a JVM gateway, as Spark Connect's: its ``sparkContext`` raises."""

    @property
    def sparkContext(self) -> Any:
        raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext is not supported in Spark Connect")


@pytest.mark.parametrize("gateway", ["jvm", "none"])
def test_output_directories_are_handled_with_and_without_a_jvm_gateway(spark: Any, tmp_path: Path,
                                                                      gateway: str) -> None:
    """The load's directory steps through Hadoop's FileSystem (PySpark's private JVM gateway), and the same
    steps by Python where a session has no gateway; a remote scheme without one is refused by name."""
    session = spark if gateway == "jvm" else _ConnectLikeSession()
    base = str(tmp_path / "out")
    assert files.list_names(session, base) == [] and not files.exists(session, base)
    (tmp_path / "out" / "incoming" / "a").mkdir(parents=True)
    (tmp_path / "out" / "incoming" / "a" / "part-0").write_text("x")
    assert files.list_names(session, files.join(base, "incoming")) == ["a"]
    files.rename(session, files.join(base, "incoming", "a"), files.join(base, "loads", "load=000001"))
    assert files.list_names(session, files.join(base, "loads")) == ["load=000001"]
    assert (tmp_path / "out" / "loads" / "load=000001" / "part-0").read_text() == "x"
    files.delete(session, files.join(base, "loads"))
    assert not files.exists(session, files.join(base, "loads"))
    if gateway == "none":
        with pytest.raises(ConfigurationError, match=r"'hdfs://nn/x' needs Hadoop's FileSystem"):
            files.exists(session, "hdfs://nn/x")
