"""latency: commit-to-delivery time of live events_by_slices at a steady write rate.

4 writers share ``rate`` events/s for ``seconds``; 4 live consumers on slice_ranges(4) record when each
event arrives. Per event: delivery time minus the moment its append returned (the commit). Contenders:
ours (PostgreSQL: writers' signals + visibility horizon), the same without signals (polling only), and
portable mode (no PostgreSQL-only feature). Misses are counted and must be zero.

``latency-readers``: the same with three sessions that read the journal and stay in their transaction for
the whole run (idle in transaction, a REPEATABLE READ report, a Spark-like cursor fetched slowly), beside
the same run without them. Only journal writers may hold the visibility horizon back, so the two match.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from pgjournal import Journal, slice_ranges

from .harness import Context, Scenario


@contextlib.contextmanager
def open_readers(dsn: str) -> Iterator[None]:
    """Three sessions that read the journal and keep their transaction open until the block ends."""
    with contextlib.ExitStack() as stack:
        idle = stack.enter_context(psycopg.connect(dsn))
        idle.execute("SELECT count(*) FROM event_journal")
        report = stack.enter_context(psycopg.connect(dsn))
        report.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM event_journal")
        spark_like = stack.enter_context(psycopg.connect(dsn))
        cursor = stack.enter_context(spark_like.cursor(name="spark_like"))
        cursor.execute("SELECT * FROM event_journal")
        cursor.fetchmany(10)
        yield


def run(ctx: Context, settings: dict[str, Any], label: str, readers: bool = False) -> float:
    with open_readers(ctx.dsn) if readers else contextlib.nullcontext():
        return measure(ctx, settings, label)


def measure(ctx: Context, settings: dict[str, Any], label: str, rate: int | None = None,
            seconds: float | None = None) -> float:
    """p99 in ms of live events_by_slices delivery on 4 ranges (rate and seconds: the mode's unless given)."""
    default_rate, default_seconds = (300, 8) if ctx.quick else (1000, 60)
    received: dict[tuple[str, int], float] = {}
    entity = "Lat" + uuid.uuid4().hex[:8]
    with Journal.open(ctx.dsn, **settings) as journal:
        lives = [journal.query.events_by_slices(entity, lo, hi) for lo, hi in slice_ranges(4)]

        def consume(live: Any) -> None:
            for env in live:
                received[(env.persistence_id, env.seq_nr)] = time.monotonic()

        consumers = [threading.Thread(target=consume, args=(live,), daemon=True) for live in lives]
        for t in consumers:
            t.start()
        time.sleep(0.5)
        committed = write_steadily(journal, entity, rate or default_rate, seconds or default_seconds)
        wait_delivered(committed, received)
        for live in lives:
            live.close()
    return lag_p99(ctx, label, committed, received)


def write_steadily(journal: Journal, entity: str, rate: int, seconds: float) -> dict[tuple[str, int], float]:
    """4 writer threads append ``rate`` events/s in all for ``seconds`` to 50 persistence ids each of
    ``entity``; returns when each (pid, seq_nr) committed (``time.monotonic()`` when its append returned)."""
    committed: dict[tuple[str, int], float] = {}
    stop_at = time.monotonic() + seconds

    def write(w: int) -> None:
        interval = 4 / rate
        next_at = time.monotonic()
        seq = 0
        pids = [f"{entity}|{w}-{i}" for i in range(50)]
        highest = dict.fromkeys(pids, 0)
        while time.monotonic() < stop_at:
            pid = pids[seq % len(pids)]
            journal.append(pid, [{"n": seq}], expected_seq_nr=highest[pid])
            highest[pid] += 1
            committed[(pid, highest[pid])] = time.monotonic()
            seq += 1
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))

    writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    return committed


def wait_delivered(committed: dict[tuple[str, int], float], received: dict[tuple[str, int], float],
                   timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(received) < len(committed):
        time.sleep(0.05)


def lag_p99(ctx: Context, label: str, committed: dict[tuple[str, int], float],
            received: dict[tuple[str, int], float]) -> float:
    """Notes p50/p95/p99 of delivery minus commit (ms) and returns p99; fails when an event was missed."""
    missed = len(set(committed) - set(received))
    lags = sorted(max(0.0, received[k] - committed[k]) * 1000 for k in committed if k in received)
    q = statistics.quantiles(lags, n=100)
    ctx.note(f"{label}: {len(committed):,} events, missed {missed}, p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, "
             f"p99 {q[98]:.1f} ms")
    if missed:
        raise AssertionError(f"{label}: {missed} events were never delivered")
    return q[98]


def contender(label: str, readers: bool = False, **settings: Any) -> Callable[[Context, Any], float]:
    return lambda ctx, _state: run(ctx, {"refresh_interval": 1.0, **settings}, label, readers)


SCENARIOS = [
    Scenario(
        name="latency", metric="p99_ms", lower_is_better=True,
        description="1,000 events/s for 60 s from 4 writers (quick: 300/s for 8 s), 4 live consumers; "
                    "refresh_interval 1 s, behind_current_time 0.1 s",
        setup=lambda _ctx: None,
        contenders={
            "ours": contender("signals + horizon"),
            "without_signals": contender("polling only", notify=False),
            "portable": contender("portable", portable=True),
        },
    ),
    Scenario(
        name="latency-readers", metric="p99_ms", lower_is_better=True,
        description="as latency, with an idle-in-transaction session, a REPEATABLE READ report and a Spark-like "
                    "cursor open for the whole run, beside the same run without them",
        setup=lambda _ctx: None,
        contenders={
            "ours": contender("with readers open", readers=True),
            "without_readers": contender("without readers"),
        },
    ),
]
