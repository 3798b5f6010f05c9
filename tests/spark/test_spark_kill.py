"""Exactly once after ``kill -9`` of a Spark driver: a streaming query over ``format("pgjournal")`` into a
checkpointed Parquet sink and one through ``foreachBatch`` into a PostgreSQL read model, in a subprocess
(tests/support/spark_stream_app.py), killed with SIGKILL mid-stream (the Python driver, its JVM and the Python
workers at once) while writers append and hold transactions open, then restarted from the checkpoints while
the writers go on: every event exactly once in both sinks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.eventually import eventually
from test_spark_source import ENTITY, Writers, fill, journal_keys, keys

from pgjournal import Journal

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")

APP = Path(__file__).parents[1] / "support" / "spark_stream_app.py"


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


class Driver:
    """tests/support/spark_stream_app.py in its own session; :meth:`kill` sends SIGKILL to it and everything it
    started (its JVM, the JVM's Python workers) at the same moment."""

    def __init__(self, dsn: str, out: Path) -> None:
        self.path = out / f"driver-{len(list(out.glob('driver-*')))}.log"
        self.log = open(self.path, "w")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, str(APP), dsn, str(out)], stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.log.close()


def model_rows(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT persistence_id, seq_nr FROM spark_read_model").fetchall()


def parquet_rows(spark: Any, out: Path) -> list[tuple[str, int]]:
    if not (out / "data" / "_spark_metadata").exists():
        return []
    return keys(spark.read.schema("persistence_id STRING, seq_nr BIGINT").parquet(str(out / "data")))


def test_stream_exactly_once_after_sigkill_of_the_driver_parquet_and_foreach_batch(
        spark: Any, journal: Journal, dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:  # no unique key: a duplicate must be countable
        conn.execute("CREATE TABLE spark_read_model (persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL)")
        conn.execute("CREATE TABLE spark_read_model_progress (query TEXT PRIMARY KEY, batch_id BIGINT NOT NULL)")
    fill(journal, pids=20, kinds=(ENTITY,))  # 60 events before the first start

    def mid_stream(driver: Driver, floor: int) -> bool:
        """The driver applied micro-batches up to ``floor`` rows, and the stream is behind the writers."""
        return driver.process.poll() is None and floor <= len(model_rows(dsn)) < len(journal_keys(dsn))

    # Rounds of 12 events, 3 of them held 1 s, until the restarted driver is seen mid-stream (then 3 more): the
    # writers must outlast two driver starts however slow they are, or "mid-stream" could never be seen.
    with Writers(journal, dsn, after=3, max_rounds=1_000, pids=4) as writers:
        first = Driver(dsn, tmp_path)
        eventually(lambda: mid_stream(first, 40), what="the driver applies micro-batches", timeout=180,
                   interval=0.2)
        first.kill()
        floor = len(model_rows(dsn)) + 1
        second = Driver(dsn, tmp_path)  # restarted from the checkpoints while the writers go on
        eventually(lambda: mid_stream(second, floor), what="the restarted driver applies micro-batches",
                   timeout=180, interval=0.2)
    assert writers.error is None and not writers.thread.is_alive()
    expected = journal_keys(dsn)
    assert len(expected) == 60 + writers.rounds * 12
    try:
        eventually(lambda: len(model_rows(dsn)) >= len(expected) and len(parquet_rows(spark, tmp_path)) >= len(
            expected), what="the restarted driver delivers everything", timeout=180, interval=0.5)
    finally:
        second.kill()
    for rows in (parquet_rows(spark, tmp_path), model_rows(dsn)):
        assert len(rows) == len(set(rows)) == len(expected) and set(rows) == expected
    print(f"\nSPARK KILL: {writers.rounds} writer rounds over two driver starts, {len(expected)} events exactly once")
