"""spark-source: the journal to Parquet through the native ``format("pgjournal")`` source vs Spark's JDBC source.

Workload: 1,000,000 events (``--quick``: 100,000), the same rows as the ``spark`` scenario (20 events per
persistence id, ~100-byte JSON payloads, time order). Every contender writes the same plain Parquet
(no partitioning, payload as binary) from the same table in the same run:

* ours: the native source, 2 slice ranges (one task per core: its best configuration here, as for JDBC);
* ours_8 ranges: the native source, 8 slice ranges (more Python tasks, each with its fixed cost);
* JDBC 2 ranges: ``spark.read.read_events`` with 2 ranges, the JDBC reader's best measured configuration
  (DESIGN.md: 2 ranges beat 8 on this 2-core machine), and JDBC 8 ranges;
* psycopg COPY TO (parse): binary COPY parsed into Python rows, no Spark, no Parquet (a floor for what one
  Python process gets out of PostgreSQL).

``spark-source-latency``: append -> row in the sink of ``spark.readStream.format("pgjournal")`` (4 slice
ranges, 1 s processing-time trigger, a ``foreachBatch`` sink that stamps each micro-batch's rows when it
receives them), measured after a warm-up micro-batch has started the Python workers, while 4 writers
append 1,000 events/s for 60 s (quick: 10 s); goal p99 <= 3 s. Reference in the same run: live
``events_by_slices`` on 4 ranges (refresh 1 s) at the same rate (bench/latency.py).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.model.slices import slice_for_persistence_id

from .harness import Context, Scenario
from .latency import lag_p99, measure, wait_delivered, write_steadily
from .spark_load import _FILL, EVENTS_PER_PID, _copy


def setup(ctx: Context) -> dict[str, Any]:
    from pgjournal.spark.session import spark_session

    total = 100_000 if ctx.quick else 1_000_000
    pids = [f"{'Cart' if i % 2 else 'Order'}|{i:07d}" for i in range(total // EVENTS_PER_PID)]
    params = {"pids": len(pids), "pid_list": pids, "slices": [slice_for_persistence_id(p) for p in pids]}
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        for first in range(1, EVENTS_PER_PID + 1, 5):  # several transactions, each in time order
            conn.execute(_FILL, {**params, "first": first, "last": min(first + 4, EVENTS_PER_PID)})
        conn.execute("VACUUM ANALYZE event_journal")
    spark = spark_session("pgjournal-bench")
    state = {"spark": spark, "out": tempfile.mkdtemp(prefix="pgjournal-bench-source-"), "total": total}
    _native(ctx, state, 8)  # warm the JVM, the Python workers and the page cache, untimed
    _jdbc(ctx, state, 2)
    return state


def _timed_write(state: dict[str, Any], frame: Any, label: str) -> float:
    out = f"{state['out']}/{label}"
    started = time.perf_counter()
    frame.write.mode("overwrite").parquet(out)
    seconds = time.perf_counter() - started
    rows = state["spark"].read.parquet(out).count()
    if rows != state["total"]:
        raise AssertionError(f"{label}: wrote {rows} rows, expected {state['total']}")
    return rows / seconds


def _native(ctx: Context, state: dict[str, Any], ranges: int) -> float:
    frame = state["spark"].read.format("pgjournal").option("dsn", ctx.dsn).option("sliceRanges", ranges).load()
    return _timed_write(state, frame, f"native{ranges}")


def _jdbc(ctx: Context, state: dict[str, Any], ranges: int) -> float:
    from pgjournal.spark.read import read_events

    frame = read_events(state["spark"], ctx.dsn, slice_ranges=ranges, decode=False)
    return _timed_write(state, frame, f"jdbc{ranges}")


def teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["spark"].stop()
    shutil.rmtree(state["out"], ignore_errors=True)


#: Events/s and seconds of the streaming latency run (quick, full): the issue's 1k events/s in both.
LATENCY_LOAD = {True: (1000, 10.0), False: (1000, 60.0)}
#: Events delivered before the timed run (untimed).
WARM_UP = 50


def _stream_latency(ctx: Context, state: dict[str, Any]) -> float:
    rate, seconds = LATENCY_LOAD[ctx.quick]
    entity = "SparkLat" + uuid.uuid4().hex[:8]
    received: dict[tuple[str, int], float] = {}

    def on_batch(frame: Any, _batch_id: int) -> None:
        rows = frame.collect()
        now = time.monotonic()
        for pid, seq_nr in rows:
            received[(pid, seq_nr)] = now

    with Journal.open(ctx.dsn) as journal:
        journal.append(f"{entity}|start", ["known"])  # the source checks the entity type at load()
        query = (state["spark"].readStream.format("pgjournal").option("dsn", ctx.dsn).option("entityType", entity)
                 .option("sliceRanges", 4).option("startingOffsets", "latest")
                 .option("columns", "persistence_id,seq_nr").load()
                 .writeStream.foreachBatch(on_batch).trigger(processingTime="1 second").start())
        try:
            while not query.recentProgress:  # its start offset ("latest") is taken: what follows is read
                time.sleep(0.1)
            # steady state: the first micro-batch with rows starts the Python workers (seconds on a busy machine)
            journal.append(f"{entity}|warm-up", list(range(WARM_UP)))
            deadline = time.monotonic() + 300
            while len(received) < WARM_UP and query.exception() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            received.clear()
            committed = write_steadily(journal, entity, rate, seconds)
            wait_delivered(committed, received)
        finally:
            query.stop()
    return lag_p99(ctx, "format('pgjournal') stream, 1 s trigger", committed, received)


def _live_latency(ctx: Context, _state: dict[str, Any]) -> float:
    rate, seconds = LATENCY_LOAD[ctx.quick]
    return measure(ctx, {"refresh_interval": 1.0}, "live events_by_slices, refresh 1 s", rate, seconds)


def _session(_ctx: Context) -> dict[str, Any]:
    from pgjournal.spark.session import spark_session

    return {"spark": spark_session("pgjournal-bench")}


SCENARIOS = [
    Scenario(
        name="spark-source",
        metric="rows/s",
        description="journal -> Parquet: native format('pgjournal') source (ours: 2 slice ranges) vs Spark JDBC "
                    "and psycopg COPY, same rows, same run",
        setup=setup,
        contenders={
            "ours": lambda ctx, st: _native(ctx, st, 2),
            "ours_8 ranges": lambda ctx, st: _native(ctx, st, 8),
            "JDBC 2 ranges (best)": lambda ctx, st: _jdbc(ctx, st, 2),
            "JDBC 8 ranges": lambda ctx, st: _jdbc(ctx, st, 8),
            "psycopg COPY TO (parse)": _copy,
        },
        teardown=teardown,
    ),
    Scenario(
        name="spark-source-latency",
        metric="p99_ms",
        lower_is_better=True,
        description="append -> row in a foreachBatch sink of readStream.format('pgjournal') (1 s trigger) at "
                    "1,000 events/s for 60 s (quick: 10 s); goal p99 <= 3 s; reference: live events_by_slices",
        setup=_session,
        contenders={
            "ours": _stream_latency,
            "live events_by_slices": _live_latency,
        },
        teardown=lambda _ctx, st: st["spark"].stop(),
    ),
]
