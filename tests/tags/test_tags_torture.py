"""Torture on the tag path: 6 writers on shared persistence ids, 2 writers holding each tagged append's
transaction open up to 2 s (their events commit 'in the past'), live events_by_tag consumers, some restarted
from their last offset at random. Every consumer must see every tagged event exactly once, in tag sequence
order per persistence id."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any

import psycopg
import psycopg.errors
import pytest
from support.restarting import Consumer, consume
from support.tags import TAGS
from support.torture import run_for_at_least, written_rows

from pgjournal import ConcurrencyConflict, Journal, RetriesExhausted, slice_for_persistence_id
from pgjournal.model.offsets import Offset
from pgjournal.model.slices import entity_type_of
from pgjournal.runtime.live import LiveQuery
from pgjournal.tags.statement_writer import prepare

pytestmark = pytest.mark.timing

TAG = "torture"


def by_tag_seq_nr(envelope: Any) -> tuple[str, int]:
    return envelope.persistence_id, envelope.tag_pid_sequence_nr


def fast_writer(journal: Journal, stop: threading.Event, rng: random.Random, pids: list[str]) -> None:
    while not stop.is_set():
        tags = [TAG] if rng.random() < 0.8 else [TAG, "other"]
        # Under SERIALIZABLE a held transaction may keep conflicts and a full lock table past the retry bound:
        # such an append failed with nothing written, which the consumers' expectations read from the database.
        with contextlib.suppress(ConcurrencyConflict, RetriesExhausted):
            journal.append(rng.choice(pids), [{"w": "fast"}] * rng.randint(1, 3), tags=tags)
        time.sleep(rng.uniform(0, 0.01))


def slow_writer(journal: Journal, stop: threading.Event, rng: random.Random, pids: list[str]) -> None:
    """Own persistence ids; each tagged append runs in a transaction held open 0-2 s before it commits."""
    highest = dict.fromkeys(pids, 0)
    with psycopg.connect(journal.dsn) as conn:
        while not stop.is_set():
            pid = rng.choice(pids)
            count = rng.randint(1, 3)
            conn.execute("SELECT 1")  # the transaction starts now
            time.sleep(rng.uniform(0, 2.0))
            params: dict[str, Any] = {
                "slice": slice_for_persistence_id(pid), "entity_type": entity_type_of(pid), "pid": pid,
                "writer": "slow", "tags": [TAG], "expected": highest[pid], "meta_ser_id": None,
                "meta_manifest": None, "meta_payload": None, "ser_ids": [31] * count, "manifests": [""] * count,
                "payloads": [b'{"w":"slow"}'] * count}
            if count == 1:
                params.update(ser_id=31, manifest="", payload=b'{"w":"slow"}')
            sql = prepare(journal, params, (TAG,), count, after_latest=False)
            try:
                conn.execute(sql, params)
                conn.commit()
            except (psycopg.errors.SerializationFailure, psycopg.errors.OutOfMemory):
                conn.rollback()  # SERIALIZABLE: the caller's own transaction is the caller's to run again
                continue
            highest[pid] += count


def run_torture(dsn: str, seconds: float, *, restarts: bool = True, **settings: Any) -> None:
    config = {**TAGS, "buffer_size": 50, "tag_gap_timeout": 6.0, **settings}
    with Journal.open(dsn, **config) as journal:
        consumers = [Consumer(restarts), Consumer(restarts), Consumer(False)]
        stop_writers, stop_consumers = threading.Event(), threading.Event()
        def stream(offset: Offset) -> LiveQuery[Any]:
            return journal.query.events_by_tag(TAG, offset)

        threads = [threading.Thread(target=consume, args=(stream, by_tag_seq_nr, c, stop_consumers, random.Random(i)))
                   for i, c in enumerate(consumers)]
        shared = [f"Torture|fast-{i}" for i in range(30)]
        threads += [threading.Thread(target=fast_writer, args=(journal, stop_writers, random.Random(100 + i), shared))
                    for i in range(6)]
        threads += [threading.Thread(target=slow_writer, args=(journal, stop_writers, random.Random(200 + i),
                                                               [f"Torture|slow-{i}-{k}" for k in range(4)]))
                    for i in range(2)]
        for t in threads:
            t.start()
        run_for_at_least(seconds, lambda: written_rows(dsn, "SELECT count(*) FROM tag_views WHERE tag_name = %s", TAG)
                         > 200, "the writers wrote enough to prove anything")
        stop_writers.set()
        for t in threads[len(consumers):]:
            t.join(10)
        with psycopg.connect(dsn) as conn:
            written = set(conn.execute("SELECT persistence_id, tag_pid_sequence_nr FROM tag_views "
                                       "WHERE tag_name = %s", (TAG,)).fetchall())
        deadline = time.time() + 30
        while time.time() < deadline and any(set(c.delivered) != written for c in consumers):
            time.sleep(0.2)
        stop_consumers.set()
        for t in threads[: len(consumers)]:
            t.join(10)
    assert len(written) > 200, "the writers wrote too little to prove anything"
    assert any(pid.startswith("Torture|slow") for pid, _ in written)
    for i, consumer in enumerate(consumers):
        assert consumer.error is None, consumer.error
        label = f"consumer {i} ({'restarted' if consumer.restarts else 'not restarted'})"
        assert len(consumer.delivered) == len(set(consumer.delivered)), f"{label} got duplicates"
        missing = written - set(consumer.delivered)
        assert not missing, f"{label} missed {len(missing)} events, e.g. {sorted(missing)[:5]}"
        last: dict[str, int] = {}
        for pid, tag_seq in consumer.delivered:
            assert tag_seq == last.get(pid, 0) + 1, f"{label}: {pid} tag seq {tag_seq} after {last.get(pid, 0)}"
            last[pid] = tag_seq
        if consumer.restarts:
            assert consumer.restart_count >= 2


def test_tag_torture_default_mode(dsn: str) -> None:
    """PostgreSQL: the visibility horizon keeps the cursor behind open transactions: restarts are exact."""
    run_torture(dsn, 8)


def test_tag_torture_portable_mode(dsn: str) -> None:
    """Portable: exact across restarts when the eventual consistency delay exceeds the longest transaction."""
    run_torture(dsn, 8, portable=True, tag_eventual_consistency_delay=2.5)


def test_tag_torture_portable_back_tracking(dsn: str) -> None:
    """Portable with a 50 ms delay: the cursor passes open transactions; back tracking and the gap search
    must deliver their events, in order. (No restarts: like Cassandra, a restarted query treats what lies
    before its offset as consumed.)"""
    run_torture(dsn, 8, restarts=False, portable=True, tag_back_track_period=4.0)


@pytest.mark.slow
@pytest.mark.parametrize("portable", [False, True])
def test_tag_torture_long(dsn: str, portable: bool) -> None:
    run_torture(dsn, 60, **({"portable": True, "tag_eventual_consistency_delay": 2.5} if portable else {}))
