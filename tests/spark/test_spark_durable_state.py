"""Durable state read by Spark: ``format("pgjournal").option("table", "durable_state")``, batch and stream,
against a real PostgreSQL (issue 20: durable state must be Spark readable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgjournal import Journal

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")


def states(spark: Any, dsn: str, **options: Any) -> Any:
    reader = spark.read.format("pgjournal").option("dsn", dsn).option("table", "durable_state")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def table_rows(dsn: str) -> set[tuple[str, int, bool]]:
    with psycopg.connect(dsn) as conn:
        return set(conn.execute("SELECT persistence_id, revision, state_ser_id = 0 FROM durable_state").fetchall())


def write_states(journal: Journal, n: int = 24) -> None:
    store = journal.durable_state
    for i in range(n):
        kind = "Account" if i % 3 else "Profile"
        pid = f"{kind}|{i}"
        for revision in range(1, i % 4 + 2):
            store.upsert(pid, revision, {"owner": f"o{i}", "balance": revision * 10}, tag="t" if i % 2 else None)
        if i % 5 == 0:
            store.delete(pid, i % 4 + 2)


def test_durable_state_batch_equals_the_table_with_types_decoding_and_pushdown(
        spark: Any, journal: Journal, dsn: str) -> None:
    from pyspark.sql import functions as F

    write_states(journal)
    frame = states(spark, dsn, sliceRanges=8)
    assert frame.rdd.getNumPartitions() == 8
    assert dict(frame.dtypes) == {"slice": "int", "entity_type": "string", "persistence_id": "string",
                                  "revision": "bigint", "db_timestamp": "timestamp", "tags": "array<string>",
                                  "state_ser_id": "int", "state_ser_manifest": "string", "state_payload": "binary",
                                  "deleted": "boolean"}
    got = [(r["persistence_id"], r["revision"], r["deleted"]) for r in frame.collect()]
    assert len(got) == len(set(got)) == 24 and set(got) == table_rows(dsn)
    accounts = states(spark, dsn, entityType="Account", payloadSchema="owner STRING, balance INT")
    live = {r["persistence_id"]: r["state"].asDict() for r in accounts.where("NOT deleted").collect()}
    assert live["Account|7"] == {"owner": "o7", "balance": 40}  # revision 4, its latest
    assert all(pid.startswith("Account|") for pid in live) and len(live) == 16 - 3  # 16 accounts, 3 deleted
    assert [r["state"] for r in accounts.where("deleted").collect()] == [None] * 3
    # revision and persistence id filters are pushed to SQL, the rest stays Spark's
    pushed = states(spark, dsn).where((F.col("revision") >= 3) & (F.col("persistence_id") != "Profile|3"))
    assert sorted((r["persistence_id"], r["revision"]) for r in pushed.collect()) == sorted(
        (p, r) for p, r, _ in table_rows(dsn) if r >= 3 and p != "Profile|3")
    plan = pushed._jdf.queryExecution().executedPlan().toString()
    assert ">= 3" not in plan and "NOT (persistence_id" in plan, plan  # the comparison went to SQL, NOT did not
    pruned = states(spark, dsn, columns="persistence_id,revision,deleted")
    assert {tuple(r) for r in pruned.collect()} == table_rows(dsn)


def test_durable_state_batch_stops_at_an_open_state_writer(spark: Any, journal: Journal, dsn: str) -> None:
    write_states(journal, n=6)
    before = table_rows(dsn)
    sql, params = journal.durable_state.sql.write("Account|held", 1, 4, "", b"{}", None)
    with psycopg.connect(dsn) as held:  # a state writer that has inserted but not committed
        held.execute(sql, params)
        assert {(r["persistence_id"], r["revision"], r["deleted"]) for r in states(spark, dsn).collect()} == before
        held.commit()
    assert ("Account|held", 1, False) in {tuple(r) for r in states(spark, dsn, columns="persistence_id,revision,"
                                                                           "deleted").collect()}


def test_durable_state_stream_delivers_the_latest_revisions_across_restarts(
        spark: Any, journal: Journal, dsn: str, tmp_path: Path) -> None:
    write_states(journal, n=12)

    def run() -> list[tuple[str, int]]:
        query = (spark.readStream.format("pgjournal").option("dsn", dsn).option("table", "durable_state")
                 .option("columns", "persistence_id,revision,deleted").option("maxEventsPerTrigger", 5).load()
                 .writeStream.format("parquet").option("path", str(tmp_path / "data"))
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None
        frame = spark.read.schema("persistence_id STRING, revision BIGINT").parquet(str(tmp_path / "data"))
        return [(r["persistence_id"], r["revision"]) for r in frame.collect()]

    first = run()
    assert len(first) == len(set(first)) and set(first) == {(p, r) for p, r, _ in table_rows(dsn)}
    journal.durable_state.upsert("Account|1", 3, {"owner": "new", "balance": 1})
    journal.durable_state.upsert("Account|100", 1, {"owner": "new", "balance": 1})
    journal.durable_state.delete("Account|2", 4)

    def caught_up() -> bool:
        return set(run()) - set(first) == {("Account|1", 3), ("Account|100", 1), ("Account|2", 4)}

    from support.eventually import eventually

    eventually(caught_up, what="the stream delivers the three new revisions", timeout=60)
    again = run()
    assert len(again) == len(set(again)) == len(first) + 3


def test_cli_exports_durable_state_to_parquet(spark: Any, journal: Journal, dsn: str,
                                              tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pgjournal.cli.commands import app

    write_states(journal, n=9)
    runner = CliRunner()
    done = runner.invoke(app, ["spark", "states", str(tmp_path / "s"), "--dsn", dsn, "-n", "2", "--decode"])
    assert done.exit_code == 0, done.output
    assert "exported 9 durable states" in done.output
    assert sorted(p.name for p in (tmp_path / "s").glob("entity_type=*")) == ["entity_type=Account",
                                                                                "entity_type=Profile"]
    exported = spark.read.parquet(str(tmp_path / "s"))
    assert {(r["persistence_id"], r["revision"], r["deleted"]) for r in exported.collect()} == table_rows(dsn)
    assert exported.where("persistence_id = 'Account|2'").select("state.balance").first()[0] == 30
    bad = runner.invoke(app, ["spark", "states", str(tmp_path / "b"), "--dsn", dsn, "-n", "3"])
    assert bad.exit_code == 1 and "divisor of 1024" in " ".join(bad.output.split())
    unknown = runner.invoke(app, ["spark", "states", str(tmp_path / "b"), "--dsn", dsn, "-e", "Nope"])
    assert unknown.exit_code == 1 and "entity type 'Nope' has no rows in durable_state" in " ".join(
        unknown.output.split())
    assert not spark.sparkContext._jsc.sc().isStopped()  # the shared session survived the command
