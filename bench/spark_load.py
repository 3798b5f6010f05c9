"""spark: the journal to Parquet through Spark's JDBC source, by number of slice-range partitions.

Workload: 1,000,000 events (``--quick``: 50,000) of 20 events per persistence id, ~100-byte JSON payloads,
written in time order (as a live journal is). "ours" exports with 8 slice ranges; references: 4, 2 and 1
range (single-partition JDBC), 8 ranges over an unpartitioned copy of the table, and psycopg
``COPY (SELECT ...) TO STDOUT`` parsed into Python rows (no Parquet). Setup also reports what
``EXPLAIN (ANALYZE, BUFFERS)`` says 8 range queries touch, on the partitioned and the unpartitioned table.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from typing import Any

import psycopg

from pgjournal.model.slices import slice_for_persistence_id, slice_ranges

from .harness import Context, Scenario

EVENTS_PER_PID = 20
COLUMNS = ("slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, tags, event_ser_id, "
           "event_ser_manifest, event_payload")
FLAT = "bench_flat_journal"

_FILL = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id,
    event_ser_manifest, event_payload, tags)
SELECT p.slice, split_part(p.pid, '|', 1), p.pid, s.seq,
       TIMESTAMPTZ '2026-11-01 00:00:00+00' + ((s.seq - 1) * %(pids)s + p.idx) * INTERVAL '1 microsecond',
       'bench', 31, '',
       convert_to(json_build_object('item', 'sku-' || p.idx, 'qty', s.seq, 'note', repeat('x', 40))::text, 'UTF8'),
       CASE WHEN p.idx %% 10 = 0 THEN ARRAY['promo'] END
FROM unnest(%(pid_list)s::text[], %(slices)s::int[]) WITH ORDINALITY AS p(pid, slice, idx)
CROSS JOIN generate_series(%(first)s::bigint, %(last)s::bigint) AS s(seq)
ORDER BY s.seq, p.idx
"""


def _buffers(conn: psycopg.Connection, table: str, where: str) -> tuple[int, float]:
    """Shared buffers (hit + read) and milliseconds that reading ``table`` under ``where`` takes."""
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT {COLUMNS} FROM {table} WHERE {where}"
                       ).fetchone()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]
    top = plan["Plan"]
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0), plan["Execution Time"]


def _layout_note(ctx: Context, conn: psycopg.Connection) -> None:
    ranges = slice_ranges(8)
    for table, label in (("event_journal", "partitioned by slice range"), (FLAT, "unpartitioned, time order")):
        whole, whole_ms = _buffers(conn, table, "NOT deleted")
        parts = [_buffers(conn, table, f"slice BETWEEN {lo} AND {hi} AND NOT deleted") for lo, hi in ranges]
        pages = sum(p for p, _ in parts)
        ctx.note(f"EXPLAIN (ANALYZE, BUFFERS) {table} ({label}): whole table {whole:,} buffers {whole_ms:,.0f} ms; "
                 f"8 slice ranges {pages:,} buffers ({pages / whole:.2f}x the table) "
                 f"{sum(ms for _, ms in parts):,.0f} ms")


def setup(ctx: Context) -> dict[str, Any]:
    from pgjournal.spark.session import spark_session

    total = 50_000 if ctx.quick else 1_000_000
    pids = [f"{'Cart' if i % 2 else 'Order'}|{i:07d}" for i in range(total // EVENTS_PER_PID)]
    params = {"pids": len(pids), "pid_list": pids, "slices": [slice_for_persistence_id(p) for p in pids]}
    with psycopg.connect(ctx.dsn, autocommit=True) as conn:
        for first in range(1, EVENTS_PER_PID + 1, 5):  # several transactions, each in time order
            conn.execute(_FILL, {**params, "first": first, "last": min(first + 4, EVENTS_PER_PID)})
        conn.execute(f"CREATE TABLE {FLAT} AS SELECT * FROM event_journal ORDER BY db_timestamp")
        conn.execute(f"CREATE INDEX ON {FLAT} (slice, entity_type, db_timestamp)")
        conn.execute("VACUUM ANALYZE event_journal")
        conn.execute(f"VACUUM ANALYZE {FLAT}")
        _layout_note(ctx, conn)
    spark = spark_session("pgjournal-bench")
    out = tempfile.mkdtemp(prefix="pgjournal-bench-spark-")
    state = {"spark": spark, "out": out, "total": total}
    _export(ctx, state, 8)  # warm the JVM and the page cache, untimed
    return state


def _export(ctx: Context, state: dict[str, Any], ranges: int, table: str = "event_journal") -> float:
    from pgjournal.spark.jobs import export_events

    result = export_events(state["spark"], f"{state['out']}/r{ranges}", dsn=ctx.dsn, slice_ranges=ranges,
                           table=table)
    if result.rows != state["total"]:
        raise AssertionError(f"exported {result.rows} rows, expected {state['total']}")
    return result.rows / result.seconds


def _copy(ctx: Context, state: dict[str, Any]) -> float:
    started = time.perf_counter()
    n = 0
    statement = f"COPY (SELECT {COLUMNS} FROM event_journal WHERE NOT deleted) TO STDOUT (FORMAT BINARY)"
    with psycopg.connect(ctx.dsn) as conn, conn.cursor() as cur, cur.copy(statement) as copy:
        copy.set_types(["int4", "varchar", "varchar", "int8", "timestamptz", "varchar", "text[]", "int4",
                        "varchar", "bytea"])
        for _row in copy.rows():
            n += 1
    if n != state["total"]:
        raise AssertionError(f"COPY returned {n} rows, expected {state['total']}")
    return n / (time.perf_counter() - started)


def teardown(_ctx: Context, state: dict[str, Any]) -> None:
    state["spark"].stop()
    shutil.rmtree(state["out"], ignore_errors=True)


SCENARIOS = [
    Scenario(
        name="spark",
        metric="rows/s",
        description="journal -> Parquet via Spark JDBC, one partition per slice range (ours: 8); "
                    "target 1M events >= 440k rows/s",
        setup=setup,
        contenders={
            "ours": lambda ctx, st: _export(ctx, st, 8),
            "4 ranges": lambda ctx, st: _export(ctx, st, 4),
            "2 ranges": lambda ctx, st: _export(ctx, st, 2),
            "1 range (single JDBC)": lambda ctx, st: _export(ctx, st, 1),
            "8 ranges, unpartitioned": lambda ctx, st: _export(ctx, st, 8, FLAT),
            "psycopg COPY TO (parse)": _copy,
        },
        teardown=teardown,
    ),
]
