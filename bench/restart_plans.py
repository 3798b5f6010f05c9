"""Plans of the statements a projection restart runs, on a generated journal:
``python -m bench.restart_plans EVENTS [--dsn DSN]`` (a scratch database, dropped afterwards).

Events: one per second up to now, over ``EVENTS / 100`` pids (spread over slices 0..1022), plus one idle pid alone in
slice 1023 written 30 days ago; an offset store as a range 0-1023 leaves it (latest row per slice, per-pid rows
of the last 5 minutes, markers). Prints the key lines of ``EXPLAIN (ANALYZE, BUFFERS)`` of each statement.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import psycopg

from pgjournal.dialects import get_dialect
from pgjournal.model.envelope import EVENT_COLUMNS
from pgjournal.server.dsn import resolve_dsn
from pgjournal.store.events import PAGE, PREDECESSORS
from pgjournal.store.timestamp_offsets import offsets

from .harness import scratch_database

GENERATE = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id,
                           event_ser_manifest, event_payload)
SELECT ((i %% %(pids)s) * 10) %% 1023, 'Cart', 'Cart|p' || (i %% %(pids)s), i / %(pids)s + 1,
       now() - (%(events)s - i) * interval '1 second', 'gen', 31, '', '{"n": 1}'::bytea
FROM generate_series(0, %(events)s - 1) AS i"""
IDLE = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, writer, event_ser_id,
                           event_ser_manifest, event_payload)
VALUES (1023, 'Cart', 'Cart|idle', 1, now() - interval '30 days', 'gen', 31, '', '{"n": 1}'::bytea)"""
# What a range 0-1023 that processed everything up to 10 s ago leaves: per slice the latest event, per pid
# the rows of the last 5 minutes (the time window), and markers at newest - 130 s (the lookback).
OFFSETS = """
INSERT INTO projection_timestamp_offset_store
SELECT DISTINCT ON (slice) 'p', '0-1023', slice, persistence_id, seq_nr, db_timestamp, now()
FROM event_journal WHERE db_timestamp <= now() - interval '10 seconds' ORDER BY slice, db_timestamp DESC;
INSERT INTO projection_timestamp_offset_store
SELECT 'p', '0-1023', slice, persistence_id, seq_nr, db_timestamp, now() FROM event_journal
WHERE db_timestamp BETWEEN now() - interval '310 seconds' AND now() - interval '10 seconds'
ON CONFLICT DO NOTHING;
INSERT INTO projection_timestamp_offset_store
SELECT 'p', '0-1023', s, '', 0, now() - interval '140 seconds', now() FROM generate_series(0, 1022) AS s
ON CONFLICT DO NOTHING"""
KEY = re.compile(r"(Scan|Loop|Join|Append|Limit|Sort|Aggregate|Buffers|Execution Time|Planning Time|rows=|"
                 r"Index Cond|Filter|Subplans|never executed)")


def explain(conn: psycopg.Connection, title: str, sql: str, params: dict[str, Any], *, generic: bool = False) -> None:
    print(f"\n== {title}{' (generic plan)' if generic else ''}")
    if generic:
        conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params, prepare=generic).fetchall()
    finally:
        conn.execute("RESET plan_cache_mode")
    for (line,) in rows:
        if KEY.search(line) and "Planning:" not in line:
            print("  " + line.rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.restart_plans", description=__doc__)
    parser.add_argument("events", type=int)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    with scratch_database(resolve_dsn(args.dsn)) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        started = time.monotonic()
        pids = max(1, args.events // 100)
        conn.execute(GENERATE, {"events": args.events, "pids": pids})
        conn.execute(IDLE)
        for statement in OFFSETS.split(";"):
            conn.execute(statement)
        conn.execute("ANALYZE")
        print(f"{args.events:,} events over {pids:,} pids + 1 idle pid, generated in "
              f"{time.monotonic() - started:.1f}s")
        latest = offsets().latest("p", 0, 1023)
        explain(conn, "LATEST_SQL (offset store, per slice)", latest.sql, latest.params)
        highest = offsets().highest_per_pid("p", {row.slice: row.latest for row in latest.all(conn)})
        explain(conn, "PIDS_SQL", highest.sql, highest.params)
        start = conn.execute("SELECT now() - interval '150 seconds'").fetchone()[0]
        old_start = conn.execute("SELECT now() - interval '30 days' - interval '130 seconds'").fetchone()[0]
        page = PAGE.format(columns=EVENT_COLUMNS, slices="slice BETWEEN %(min_slice)s AND %(max_slice)s", tagged="")
        params = {"entity_type": "Cart", "min_slice": 0, "max_slice": 1023, "from_ts": start,
                  "until": conn.execute("SELECT now()").fetchone()[0], "last_seq": 0, "last_pid": "",
                  "seen_pids": [], "seen_seqs": [], "limit": 1000}
        explain(conn, "first page from the new start (newest - lookback)", page, params)
        total_new = conn.execute("SELECT count(*) FROM event_journal WHERE db_timestamp >= %s", (start,)).fetchone()
        total_old = conn.execute("SELECT count(*) FROM event_journal WHERE db_timestamp >= %s",
                                 (old_start,)).fetchone()
        print(f"  rows from the new start to the tail: {total_new[0]:,}; from the old start (the idle slice's "
              f"offset - lookback): {total_old[0]:,}")
        rows = conn.execute(page, params).fetchall()
        first: dict[str, tuple[int, int]] = {}
        for r in rows:
            if r[3] > 1:
                first.setdefault(r[2], (r[0], r[3]))
        pred = {"pids": list(first), "slices": [s for s, _ in first.values()],
                "seqs": [q for _, q in first.values()]}
        print(f"\n   predecessors of {len(first)} pids met on the first page")
        explain(conn, "PREDECESSORS (LATERAL, one primary-key probe per pid)", PREDECESSORS, pred)
        explain(conn, "PREDECESSORS (LATERAL, one primary-key probe per pid)", PREDECESSORS, pred, generic=True)
        old = """
SELECT e.persistence_id, e.seq_nr, e.db_timestamp FROM event_journal AS e
JOIN unnest(%(pids)s::text[], %(slices)s::int[], %(seqs)s::bigint[]) AS u(pid, slice, seq)
  ON e.persistence_id = u.pid AND e.slice = u.slice AND e.seq_nr = u.seq - 1
WHERE NOT e.deleted"""
        explain(conn, "PREDECESSORS before (join over unnest)", old, pred)
        pid, (_, seq) = next(iter(first.items()))
        events = get_dialect("postgres").event_store()
        explain(conn, "EventStore.previous (one pid, its partition)", *events.previous(pid, seq, start))
        explain(conn, "EventStore.first_event (rowless slice 1023: cleared; its event is 30 days old)",
                *events.first_event("Cart", [1023], start))
        conn.execute("DELETE FROM event_journal WHERE persistence_id = 'Cart|idle'")
        explain(conn, "EventStore.first_event worst case (rowless slice without any event)",
                *events.first_event("Cart", [1023], start))


if __name__ == "__main__":
    main()
