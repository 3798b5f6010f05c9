"""Where a tag-append contender's time goes: ``python -m bench.tag_waits [--quick] [--rounds N] [--writers N]``.

Runs the contenders of ``tags-append`` (bench.tags) in interleaved rounds and, for each round, samples
``pg_stat_activity`` of the benchmark's database every ~10 ms from a connection of its own (state, wait event
type and event of each client backend: "CPU" is an active backend waiting on nothing, "client" an idle one
waiting for its next statement), reads ``pg_stat_statements`` (when the server preloads it: calls, server time,
buffers, WAL per statement), ``pg_stat_wal``, the backends' CPU (``/proc``) and this process's CPU. Prints one
JSON line per round and a table of the medians; the load average is read before each round.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

import psycopg
import psycopg.conninfo

from pgjournal.server.dsn import resolve_dsn

from .cpu import backend_cpu
from .harness import Context, scratch_database
from .tags import _append_setup, _teardown, append_with, tag_rows_floor

_SAMPLE = """SELECT pid, state, wait_event_type, wait_event FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"""
_STATEMENTS = """SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 70), calls, total_exec_time, total_plan_time,
                        shared_blks_hit, shared_blks_read, shared_blks_dirtied, wal_records, wal_bytes, wal_fpi
                 FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
                 ORDER BY total_exec_time DESC LIMIT 8"""


class Sampler:
    """``pg_stat_activity`` of one database every ``period`` seconds, counted by (state, wait event)."""

    def __init__(self, dsn: str, period: float = 0.01) -> None:
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._period = period
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-wait-sampler")

    def _loop(self) -> None:
        cur = self._conn.cursor()
        while not self._stop.is_set():
            for _pid, state, kind, event in cur.execute(_SAMPLE, prepare=True).fetchall():
                if state == "idle":
                    key = "client (idle)"
                elif state == "idle in transaction":
                    key = "client (idle in transaction)"
                elif kind is None:
                    key = "CPU (active, no wait)"
                else:
                    key = f"{kind}:{event}"
                self.counts[key] += 1
            self.samples += 1
            self._stop.wait(self._period)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


def _wal(conn: psycopg.Connection) -> int:
    """The WAL insert position in bytes (pg_stat_wal's counters are flushed lazily)."""
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()
    assert row is not None
    return int(row[0])


def measure_round(ctx: Context, state: dict[str, Any], name: str, contender: Any, dsn: str, events: int
                  ) -> dict[str, Any]:
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    # The server's own database: the scratch databases do not have the extension's view.
    with psycopg.connect(ctx.server_dsn, autocommit=True) as admin:
        statements = bool(admin.execute(
            "SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone())
        if statements:
            admin.execute("SELECT pg_stat_statements_reset()")
        wal_before = _wal(admin)
        load = os.getloadavg()[0]
        cpu_before = sum(backend_cpu(dsn).values())
        client_before = time.process_time()
        with Sampler(dsn) as sampler:
            rate = contender(ctx, state)
        client = time.process_time() - client_before
        server = sum(backend_cpu(dsn).values()) - cpu_before  # backends that ended meanwhile are missed
        wal_after = _wal(admin)
        top = admin.execute(_STATEMENTS, (dbname,)).fetchall() if statements else []
    total = sum(sampler.counts.values()) or 1
    return {
        "contender": name, "events_per_s": round(rate, 1), "load_average": round(load, 2),
        "client_cpu_us_per_event": round(client / events * 1e6, 1),
        "server_cpu_us_per_event": round(server / events * 1e6, 1),
        "wal_bytes_per_event": round((wal_after - wal_before) / events, 1),
        "samples": sampler.samples,
        "waits": {k: round(v / total, 3) for k, v in sampler.counts.most_common()},
        "statements": [{"query": q, "calls": c, "exec_ms_per_call": round(t / c, 3) if c else 0,
                        "plan_ms_total": round(p, 1), "blks_hit_per_call": round(h / c, 1) if c else 0,
                        "blks_read": r, "blks_dirtied_per_call": round(d / c, 2) if c else 0,
                        "wal_bytes_per_call": round(float(w) / c, 1) if c else 0, "wal_fpi": fpi}
                       for q, c, t, p, h, r, d, _wr, w, fpi in top],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tag_waits", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--total", type=int, default=20_000)
    parser.add_argument("--contenders", default="ours,untagged,in_statement,tag_rows_floor")
    args = parser.parse_args(argv)
    server = resolve_dsn(None)
    events = args.total // 10 if args.quick else args.total
    contenders = {
        "ours": append_with(("bench",), args.writers, args.total),
        "untagged": append_with((), args.writers, args.total),
        "in_statement": append_with(("bench",), args.writers, args.total, journal_key="in_statement"),
        "tag_rows_floor": tag_rows_floor(args.writers, args.total),
    }
    chosen = args.contenders.split(",")
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in chosen}
    with scratch_database(server) as dsn:
        ctx = Context(dsn, args.quick, server_dsn=server)
        state = _append_setup(ctx)
        try:
            for _round in range(args.rounds):
                for name in chosen:
                    # The in-statement contender writes on a database of its own (see bench.tags._append_setup).
                    where = state["in_statement_dsn"] if name == "in_statement" else dsn
                    result = measure_round(ctx, state, name, contenders[name], where, events)
                    results[name].append(result)
                    sys.stdout.write(json.dumps(result) + "\n")
                    sys.stdout.flush()
        finally:
            _teardown(ctx, state)
    for name, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in
               ("events_per_s", "client_cpu_us_per_event", "server_cpu_us_per_event", "wal_bytes_per_event",
                "load_average")}
        sys.stderr.write(f"{name:15} {json.dumps(med)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
