"""Where the time goes per append at 8 writers, ungrouped vs grouped in flight (bench/results/group-commit-blocking.md).

``python -m bench.group_costs PER_WRITER VARIANTS ROUNDS``: VARIANTS is a comma list of ``raw`` (raw INSERT, one
connection per thread), ``ours_off`` (``pipeline=False``), ``ours_pool4`` (a pool of 4), ``ours_dN``
(``pipeline_drains=N``, a pool of 12). One JSON line per variant and round: wall rate, client CPU
(``time.process_time``) and server CPU (the backends' ``/proc`` stat) per event, voluntary and involuntary context
switches per event (``getrusage``: thread wake-ups), p50/p99 latency, appends per pipeline, the share of appends
grouped and commits per event.
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
import uuid
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.server.dsn import resolve_dsn

from .append import EVENT, PAYLOAD, RAW_INSERT, RAW_TABLE
from .cpu import backend_cpu
from .harness import scratch_database

WRITERS = 8
WARM = 20


def run(dsn: str, variant: str, per_writer: int) -> dict[str, Any]:
    journal = None
    if variant.startswith("ours"):
        options: dict[str, Any] = {"pipeline": False} if variant == "ours_off" else {}
        if variant.startswith("ours_d"):
            options["pipeline_drains"] = int(variant[len("ours_d"):])
        journal = Journal.open(dsn, pool_max_size=4 if variant == "ours_pool4" else 12, **options)
    ready, go, done = (threading.Barrier(WRITERS + 1) for _ in range(3))
    release = threading.Event()
    latencies: list[float] = []

    def thread() -> None:
        pid = f"Bench|{uuid.uuid4().hex}"
        conn = None
        if journal is None:
            conn = psycopg.connect(dsn, autocommit=True)
            for seq in range(1, WARM + 1):
                conn.execute(RAW_INSERT, (1, "Bench", pid, seq, "raw", PAYLOAD))
        else:
            for i in range(WARM):
                journal.append(pid, [EVENT], expected_seq_nr=i)
        ready.wait()
        go.wait()
        mine = []
        clock = time.perf_counter
        for i in range(WARM, WARM + per_writer):
            started = clock()
            if conn is not None:
                conn.execute(RAW_INSERT, (1, "Bench", pid, i + 1, "raw", PAYLOAD))
            else:
                assert journal is not None
                journal.append(pid, [EVENT], expected_seq_nr=i)
            mine.append(clock() - started)
        latencies.extend(mine)
        done.wait()
        release.wait()
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=thread) for _ in range(WRITERS)]
    for t in threads:
        t.start()
    ready.wait()
    pipeline = getattr(journal, "_pipeline", None)
    sent, pipelines = (pipeline.sent, pipeline.pipelines) if pipeline else (0, 0)
    server0, usage0 = backend_cpu(dsn), resource.getrusage(resource.RUSAGE_SELF)
    client0, wall0 = time.process_time(), time.perf_counter()
    go.wait()
    done.wait()
    wall, client = time.perf_counter() - wall0, time.process_time() - client0
    usage, server1 = resource.getrusage(resource.RUSAGE_SELF), backend_cpu(dsn)
    release.set()
    for t in threads:
        t.join()
    n = WRITERS * per_writer
    latencies.sort()
    out: dict[str, Any] = {
        "variant": variant, "events_per_s": round(n / wall), "client_us": round(client * 1e6 / n, 1),
        "server_us": round(sum(cpu - server0.get(pid, 0.0) for pid, cpu in server1.items()) * 1e6 / n, 1),
        "vol_ctx_switches_per_event": round((usage.ru_nvcsw - usage0.ru_nvcsw) / n, 2),
        "invol_ctx_switches_per_event": round((usage.ru_nivcsw - usage0.ru_nivcsw) / n, 2),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }
    if pipeline is not None:
        grouped, groups = pipeline.sent - sent, pipeline.pipelines - pipelines
        out["appends_per_pipeline"] = round(grouped / max(1, groups), 2)
        out["grouped_share"] = round(grouped / n, 3)
        out["commits_per_event"] = round((n - grouped + groups) / n, 3)
    out["total_us"] = round(out["client_us"] + out["server_us"], 1)
    if journal is not None:
        journal.close()
    return out


def main(argv: list[str]) -> None:
    per_writer = int(argv[0]) if argv else 1000
    variants = argv[1].split(",") if len(argv) > 1 else ["raw", "ours_off", "ours_d2", "ours_d4"]
    rounds = int(argv[2]) if len(argv) > 2 else 2
    with scratch_database(resolve_dsn(None)) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {RAW_TABLE} (LIKE event_journal INCLUDING DEFAULTS INCLUDING INDEXES)")
        for _round in range(rounds):
            for variant in variants:
                print(json.dumps(run(dsn, variant, per_writer)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
