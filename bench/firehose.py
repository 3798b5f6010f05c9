"""firehose: database queries of 16 live consumers of one slice range, shared through the firehose or not.

One writer appends ``rate`` events/s (1 event per append, 50 persistence ids) while 16 consumers follow
``events_by_slices`` of the whole range. Counted on the server: the database's committed transactions
(``pg_stat_database.xact_commit``; every statement of pgjournal's autocommit connections is one) over the
write window, minus the writer's appends, per second. Writers do not notify (the notification sender's
transactions would be counted too), so consumers poll every ``refresh_interval`` (0.5 s here), or at once
after a full page. Contenders: ours (16 consumers through one :class:`~pgjournal.query.firehose.Firehose`), 16
independent live queries, and a single live query (the figure the firehose should be close to). Every
consumer must receive every event; a miss fails the round.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from pgjournal import Journal
from pgjournal.query.firehose import Firehose

from .harness import Context, Scenario

CONSUMERS = 16
SETTINGS: dict[str, Any] = {"refresh_interval": 0.5, "notify": False}


def committed(dsn: str) -> int:
    """Committed transactions of the database so far, as the backends have reported them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    return int(row[0]) if row else 0


def measure(ctx: Context, mode: str) -> float:
    rate, seconds = (100, 6) if ctx.quick else (200, 20)
    entity = "Hose" + uuid.uuid4().hex[:8]
    consumers = 1 if mode == "one" else CONSUMERS
    received: list[set[tuple[str, int]]] = [set() for _ in range(consumers)]
    with Journal.open(ctx.dsn, **SETTINGS) as readers_journal, Journal.open(ctx.dsn, **SETTINGS) as writer, \
            Firehose(readers_journal) as firehose:
        if mode == "ours":
            streams: list[Any] = [firehose.events_by_slices(entity, 0, 1023) for _ in range(consumers)]
        else:
            streams = [readers_journal.query.events_by_slices(entity, 0, 1023) for _ in range(consumers)]

        def consume(i: int) -> None:
            for envelope in streams[i]:
                received[i].add((envelope.persistence_id, envelope.seq_nr))

        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(consumers)]
        for t in threads:
            t.start()
        writer.append(f"{entity}|warmup", [{"n": 0}])  # every consumer joins before the window opens
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(received):
            time.sleep(0.05)
        if mode == "ours":
            while time.monotonic() < deadline and not all(s.attached for s in streams):
                time.sleep(0.05)
        # A backend that goes idle reports its counts within PGSTAT_IDLE_INTERVAL (10 s): wait them out, so the
        # consumers' catch-up is not counted in the window. (At the end the connections close, which reports.)
        time.sleep(11)
        before = committed(ctx.dsn)
        started = time.monotonic()
        pids = [f"{entity}|{i}" for i in range(50)]
        highest = dict.fromkeys(pids, 0)
        appends = 0
        next_at = started
        while time.monotonic() - started < seconds:
            pid = pids[appends % len(pids)]
            writer.append(pid, [{"n": appends}], expected_seq_nr=highest[pid])
            highest[pid] += 1
            appends += 1
            next_at += 1 / rate
            time.sleep(max(0.0, next_at - time.monotonic()))
        elapsed = time.monotonic() - started
        wanted = {(p, s) for p in pids for s in range(1, highest[p] + 1)} | {(f"{entity}|warmup", 1)}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(r >= wanted for r in received):
            time.sleep(0.05)
        after_delivery = time.monotonic()
        for stream in streams:
            stream.close()
        for t in threads:
            t.join(10)
    time.sleep(1.0)
    transactions = committed(ctx.dsn) - before - appends - 1  # this committed() call's own connection
    missed = sum(len(wanted - r) for r in received)
    if missed:
        raise AssertionError(f"{mode}: {missed} deliveries missing")
    per_s = transactions / (after_delivery - started)
    ctx.note(f"{mode}: {consumers} consumer(s), {appends:,} appends in {elapsed:.1f} s, {transactions:,} reader "
             f"transactions = {per_s:,.1f}/s")
    return per_s


def contender(mode: str) -> Callable[[Context, Any], float]:
    return lambda ctx, _state: measure(ctx, mode)


SCENARIOS = [
    Scenario(
        name="firehose", metric="reader_transactions_per_s", lower_is_better=True,
        description=f"{CONSUMERS} live consumers of one entity type over slices 0-1023, one writer at 200 events/s "
                    "for 20 s (quick: 100/s for 6 s), refresh_interval 0.5 s, no notifications; committed "
                    "transactions of the database (pg_stat_database.xact_commit) minus the appends",
        setup=lambda _ctx: None,
        contenders={
            "ours": contender("ours"),
            "independent_16": contender("independent"),
            "one_consumer": contender("one"),
        },
    ),
]
