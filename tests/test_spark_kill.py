"""Exactly once after ``kill -9`` of a Spark driver: a streaming query over ``format("pgjournal")`` into a
checkpointed Parquet sink and one through ``foreachBatch`` into a PostgreSQL read model, in a subprocess
(tests/spark_stream_app.py), killed with SIGKILL mid-stream (the Python driver, its JVM and the Python
workers at once) while writers append and hold transactions open, restarted from the checkpoints, killed
again, and drained: every event exactly once in both sinks."""

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
from eventually import eventually
from test_spark_source import ENTITY, Writers, fill, journal_keys, keys, spark  # noqa: F401

from pgjournal import Journal

pytestmark = pytest.mark.spark
pytest.importorskip("pyspark")

APP = Path(__file__).with_name("spark_stream_app.py")


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
    """tests/spark_stream_app.py in its own session; :meth:`kill` sends SIGKILL to it and everything it
    started (its JVM, the JVM's Python workers) at the same moment."""

    def __init__(self, dsn: str, out: Path, mode: str) -> None:
        self.path = out / f"driver-{mode}-{len(list(out.glob('driver-*')))}.log"
        self.log = open(self.path, "w")  # noqa: SIM115
        self.process = subprocess.Popen([sys.executable, str(APP), dsn, str(out), mode], stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        for pid in [self.process.pid, *descendants(self.process.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.log.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.log.close()


def model_rows(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT persistence_id, seq_nr FROM spark_read_model").fetchall()


def parquet_rows(spark: Any, out: Path) -> list[tuple[str, int]]:  # noqa: F811
    if not (out / "data" / "_spark_metadata").exists():
        return []
    return keys(spark.read.schema("persistence_id STRING, seq_nr BIGINT").parquet(str(out / "data")))


def test_stream_exactly_once_after_sigkill_of_the_driver_parquet_and_foreach_batch(
        spark: Any, journal: Journal, dsn: str, tmp_path: Path) -> None:  # noqa: F811
    with psycopg.connect(dsn, autocommit=True) as conn:  # no unique key: a duplicate must be countable
        conn.execute("CREATE TABLE spark_read_model (persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL)")
        conn.execute("CREATE TABLE spark_read_model_progress (query TEXT PRIMARY KEY, batch_id BIGINT NOT NULL)")
    fill(journal, pids=20, kinds=(ENTITY,))  # 60 events before the first start
    with Writers(journal, dsn, after=2, max_rounds=60, pids=4) as writers:  # rounds of 12, 3 held 1 s
        for _ in range(2):
            driver = Driver(dsn, tmp_path, "run")

            def mid_stream(driver: Driver = driver, floor: int = len(model_rows(dsn)) + 40) -> bool:
                """This run applied at least one more micro-batch, and the stream is behind the writers."""
                return driver.process.poll() is None and floor <= len(model_rows(dsn)) < len(journal_keys(dsn))

            eventually(mid_stream, what="the (re)started driver applies micro-batches", timeout=180, interval=0.2)
            driver.kill()
    assert writers.error is None and not writers.thread.is_alive()
    expected = journal_keys(dsn)
    assert len(expected) == 60 + writers.rounds * 12

    def drained() -> bool:
        drain = Driver(dsn, tmp_path, "drain")
        assert drain.wait(timeout=240) == 0, drain.path.read_text()[-3000:]
        return len(model_rows(dsn)) >= len(expected) and len(parquet_rows(spark, tmp_path)) >= len(expected)

    eventually(drained, what="a drain run delivers everything", timeout=300, interval=0)
    for rows in (parquet_rows(spark, tmp_path), model_rows(dsn)):
        assert len(rows) == len(set(rows)) == len(expected) and set(rows) == expected
