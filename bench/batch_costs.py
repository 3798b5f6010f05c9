"""Where the time of a batch append goes, beside a binary COPY of the same rows (the ``append-batch`` scenario's
reference): ``python -m bench.batch_costs --dsn DSN [--events N]``.

Prints, per event: client and server CPU with 8 writers (:mod:`bench.cpu`); the client's CPU split into the
write path's stages with one writer (thread CPU time: planning and serialization, the statement's round trip in
psycopg, envelopes and counting); the statement's server time, plan time and WAL bytes (``pg_stat_statements``,
when the server preloads it) and the WAL the database wrote (``pg_current_wal_lsn``, meaningful on a server of
your own); one ``EXPLAIN (ANALYZE, WAL)`` of the statement. The write-up: bench/results/batches-where-time-goes.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.write.event_writer import EventWriter

from .append import EVENT, PAYLOAD, RAW_TABLE, _cpu_threads
from .cpu import measure as measure_cpu
from .harness import scratch_database

BATCH = 10
COLUMNS = "slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id, event_ser_manifest, " \
          "event_payload"
TYPES = ["int4", "varchar", "varchar", "int8", "timestamptz", "varchar", "int4", "varchar", "bytea"]


def copy_batch(conn: psycopg.Connection, pid: str, first: int) -> None:
    with conn.cursor().copy(f"COPY {RAW_TABLE} ({COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(TYPES)
        now = datetime.now(UTC)
        for seq in range(first, first + BATCH):
            copy.write_row((1, "Bench", pid, seq, now, "copy", 31, "", PAYLOAD))


def cpu_split(dsn: str, journal: Journal, events: int) -> dict[str, Any]:
    """Client and server CPU µs per event, 8 writers, ours and the COPY reference."""
    writers, per_writer = 8, events // 8
    batch = [EVENT] * BATCH

    def ours_prepare(_w: int) -> str:
        pid = f"Bench|{uuid.uuid4().hex}"
        for i in range(3):
            journal.append(pid, batch, expected_seq_nr=i * BATCH)
        return pid

    def ours_work(_w: int, pid: str) -> None:
        for i in range(3, 3 + per_writer // BATCH):
            journal.append(pid, batch, expected_seq_nr=i * BATCH)

    def copy_prepare(_w: int) -> tuple[psycopg.Connection, str]:
        conn = psycopg.connect(dsn, autocommit=True)
        pid = f"Bench|{uuid.uuid4().hex}"
        for first in range(1, 31, BATCH):
            copy_batch(conn, pid, first)
        return conn, pid

    def copy_work(_w: int, state: tuple[psycopg.Connection, str]) -> None:
        conn, pid = state
        for first in range(31, 31 + per_writer, BATCH):
            copy_batch(conn, pid, first)

    out = {}
    for name, prepare, work, cleanup in (
            ("ours", ours_prepare, ours_work, lambda _s: None),
            ("binary_copy", copy_prepare, copy_work, lambda s: s[0].close())):
        result = measure_cpu(dsn, per_writer * writers, _cpu_threads(writers, prepare, work, cleanup))
        out[name] = {"client_us": round(result.client_us, 1), "server_us": round(result.server_us, 1),
                     "events_per_s": round(per_writer * writers / result.wall_s)}
    return out


def stages(journal: Journal, events: int) -> dict[str, float]:
    """Thread CPU µs per event of each stage of our batch append, and of the COPY reference, one writer."""
    writer: EventWriter = journal._writer
    batch = [EVENT] * BATCH
    pid = f"Bench|{uuid.uuid4().hex}"
    clock = time.thread_time
    plan_s = run_s = done_s = 0.0
    with journal.connection() as conn:
        for i in range(events // BATCH):
            t0 = clock()
            plan = writer.plan(pid, batch, i * BATCH, (), None)
            assert plan is not None
            t1 = clock()
            rows = EventWriter._run(conn, plan.sql, plan.params)
            t2 = clock()
            writer.committed(plan, rows, 0.0)
            t3 = clock()
            plan_s, run_s, done_s = plan_s + t1 - t0, run_s + t2 - t1, done_s + t3 - t2
    pid = f"Bench|{uuid.uuid4().hex}"
    with psycopg.connect(journal.dsn, autocommit=True) as conn:
        t0 = clock()
        for first in range(1, events + 1, BATCH):
            copy_batch(conn, pid, first)
        copy_s = clock() - t0
    per = 1e6 / events
    return {"plan_and_serialize": round(plan_s * per, 1), "statement_in_psycopg": round(run_s * per, 1),
            "envelopes_and_count": round(done_s * per, 1), "ours_total": round((plan_s + run_s + done_s) * per, 1),
            "binary_copy_total": round(copy_s * per, 1)}


def profile(journal: Journal, events: int) -> str:
    """The top of a cProfile of one writer's batch appends (cumulative time)."""
    batch = [EVENT] * BATCH
    pid = f"Bench|{uuid.uuid4().hex}"
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(events // BATCH):
        journal.append(pid, batch, expected_seq_nr=i * BATCH)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def statements(dsn: str, journal: Journal, events: int) -> dict[str, Any]:
    """Server time, plan time and WAL per event from pg_stat_statements (one writer each), and the database's WAL
    per event from pg_current_wal_lsn."""
    batch = [EVENT] * BATCH
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as admin:
        try:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            admin.execute("SELECT pg_stat_statements_reset()")
            tracked = True
        except psycopg.Error:
            tracked = False
        for name in ("ours", "binary_copy"):
            pid = f"Bench|{uuid.uuid4().hex}"
            if tracked:
                admin.execute("SELECT pg_stat_statements_reset()")
            lsn = admin.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
            if name == "ours":
                for i in range(events // BATCH):
                    journal.append(pid, batch, expected_seq_nr=i * BATCH)
            else:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for first in range(1, events + 1, BATCH):
                        copy_batch(conn, pid, first)
            wal = admin.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn", (lsn,)).fetchone()[0]  # type: ignore[index]
            figures: dict[str, Any] = {"wal_bytes_per_event_database": round(float(wal) / events, 1)}
            if tracked:
                row = admin.execute(
                    "SELECT calls, total_exec_time, total_plan_time, plans, wal_bytes, wal_records, rows, query "
                    "FROM pg_stat_statements WHERE query ILIKE 'insert into%%' OR query ILIKE 'copy%%' "
                    "ORDER BY total_exec_time DESC LIMIT 1").fetchone()
                if row is not None:
                    calls, exec_ms, plan_ms, plans, wal_bytes, wal_records, rows, query = row
                    figures.update(calls=calls, exec_us_per_event=round(exec_ms * 1000 / events, 2),
                                   plan_us_per_event=round(plan_ms * 1000 / events, 2), plans=plans,
                                   wal_bytes_per_event_statement=round(float(wal_bytes) / events, 1),
                                   wal_records_per_event=round(wal_records / events, 2), rows=rows,
                                   query=" ".join(query.split())[:300])
            out[name] = figures
    return out


def explain(journal: Journal) -> str:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of one batch append's statement (rolled back)."""
    writer: EventWriter = journal._writer
    pid = f"Bench|{uuid.uuid4().hex}"
    journal.append(pid, [EVENT] * BATCH, expected_seq_nr=0)
    plan = writer.plan(pid, [EVENT] * BATCH, BATCH, (), None)
    assert plan is not None
    with psycopg.connect(journal.dsn) as conn:
        rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, VERBOSE) " + plan.sql, plan.params).fetchall()
        conn.rollback()
    return "\n".join(row[0] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_costs")
    parser.add_argument("--dsn", required=True, help="a server of your own (WAL and pg_stat_statements are global)")
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--cpu-only", action="store_true", help="only the 8 writers' CPU per event")
    args = parser.parse_args()
    with scratch_database(args.dsn) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {RAW_TABLE} (LIKE event_journal INCLUDING DEFAULTS INCLUDING INDEXES)")
        with Journal.open(dsn, pool_max_size=12) as journal:
            print("cpu, 8 writers:", cpu_split(dsn, journal, args.events))
            if args.cpu_only:
                return
            print("client stages, 1 writer:", stages(journal, args.events // 4))
            print("statements, 1 writer:", statements(dsn, journal, args.events // 4))
            print(explain(journal))
            print(profile(journal, args.events // 4))


if __name__ == "__main__":
    main()
