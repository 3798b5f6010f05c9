"""Torture: 8 writers (some holding their transaction open up to 2 s, so their events commit 'in the past'),
live consumers on slice_ranges(4) and on the full range, restarted from their last offset at random. Every
consumer must see every event of its range exactly once, in sequence order per persistence id. In portable mode
with a short behind_current_time a gap writer also makes, on purpose, the gap the by-slices fill exists for
(:func:`gap_writer`)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from support import FAST
from support.restarting import Consumer, consume, passed
from support.torture import ENTITY, fast_writer, run_for_at_least, slow_writer, written_rows

from pgjournal import EventEnvelope, Journal, slice_for_persistence_id, slice_ranges
from pgjournal.model.offsets import Offset
from pgjournal.runtime.live import LiveQuery

COUNT = "SELECT count(*) FROM event_journal WHERE entity_type = %s"

pytestmark = pytest.mark.timing


def by_seq_nr(envelope: EventEnvelope) -> tuple[str, int]:
    return envelope.persistence_id, envelope.seq_nr


def gap_writer(journal: Journal, stop: threading.Event, consumers: list[Consumer], pid: str, made: list[int]
               ) -> None:
    """The gap the by-slices fill exists for, made on purpose (portable mode, behind_current_time shorter than the
    transaction): an event of ``pid`` held open in a transaction until the consumers' main cursors passed it,
    then committed and followed at once by the next event, which they read before backtracking (far behind the
    clock) comes back for the first. ``made``: how many such gaps, the consumers' cursors seen past the event."""
    seq_nr = 0
    while not stop.is_set():
        try:
            with journal.transaction() as tx:
                (held,) = tx.append(pid, [{"w": "gap"}], expected_seq_nr=seq_nr)
                deadline = time.monotonic() + 2
                while not passed(consumers, pid, held.db_timestamp) and time.monotonic() < deadline:
                    time.sleep(0.01)
                gap = passed(consumers, pid, held.db_timestamp)
        except (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected):
            continue  # a SERIALIZABLE database (CI's portable pass) refused the commit: try it again, as callers do
        made[0] += gap
        journal.append(pid, [{"w": "gap"}], expected_seq_nr=seq_nr + 1)
        seq_nr += 2


def run_torture(dsn: str, seconds: float, **settings: object) -> list[Consumer]:
    restarts = settings.pop("restarts", True)
    gaps = settings.pop("gaps", False)
    grouped = settings.pop("grouped", False)
    made = [0]
    config = {**FAST, "buffer_size": 50, **settings}
    with Journal.open(dsn, **config) as journal:
        consumers = [Consumer(bool(restarts), lo, hi) for lo, hi in slice_ranges(4)]
        consumers.append(Consumer(bool(restarts)))
        stop_writers, stop_consumers = threading.Event(), threading.Event()
        def stream(c: Consumer) -> Callable[[Offset], LiveQuery[EventEnvelope]]:
            return lambda offset: journal.query.events_by_slices(ENTITY, c.min_slice, c.max_slice, offset)

        threads = [threading.Thread(target=consume, args=(stream(c), by_seq_nr, c, stop_consumers, random.Random(i)))
                   for i, c in enumerate(consumers)]
        shared_pids = [f"{ENTITY}|fast-{i}" for i in range(40)]
        threads += [threading.Thread(target=fast_writer, args=(journal, stop_writers, random.Random(100 + i),
                                                                shared_pids)) for i in range(6)]
        threads += [threading.Thread(target=slow_writer, args=(dsn, stop_writers, random.Random(200 + i),
                                                                [f"{ENTITY}|slow-{i}-{k}" for k in range(5)]))
                    for i in range(2)]
        if gaps:
            threads.append(threading.Thread(target=gap_writer, args=(journal, stop_writers, consumers,
                                                                     f"{ENTITY}|gap-0", made)))
        for t in threads:
            t.start()
        run_for_at_least(seconds, lambda: written_rows(dsn, COUNT, ENTITY) > 200 and (not gaps or made[0] >= 1),
                         "the writers wrote enough to prove anything")
        stop_writers.set()
        for t in threads[len(consumers):]:
            t.join(10)
        pipelines, sent = journal._pipeline.pipelines, journal._pipeline.sent
        with psycopg.connect(dsn) as conn:
            written = conn.execute("SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = %s",
                                   (ENTITY,)).fetchall()
        expected = [{(p, s) for p, s in written if c.min_slice <= slice_for_persistence_id(p) <= c.max_slice}
                    for c in consumers]
        deadline = time.time() + 30
        while time.time() < deadline and any(set(c.delivered) != e for c, e in zip(consumers, expected, strict=True)):
            time.sleep(0.2)
        stop_consumers.set()
        for t in threads[: len(consumers)]:
            t.join(10)
    assert len(written) > 200, "the writers wrote too little to prove anything"
    assert not grouped or 0 < pipelines < sent, f"{sent} appends in {pipelines} group commits"
    # One gap already fails the run when the fill is off; SERIALIZABLE commits refused leave fewer than otherwise.
    assert not gaps or made[0] >= 1, f"the gap writer made {made[0]} gaps"
    for consumer, wanted in zip(consumers, expected, strict=True):
        assert consumer.error is None, consumer.error
        label = f"consumer {consumer.min_slice}-{consumer.max_slice}"
        assert len(consumer.delivered) == len(set(consumer.delivered)), f"{label} got duplicates"
        missing = wanted - set(consumer.delivered)
        assert not missing, f"{label} missed {len(missing)} events, e.g. {sorted(missing)[:5]}"
        assert set(consumer.delivered) == wanted
        last: dict[str, int] = {}
        for pid, seq_nr in consumer.delivered:
            assert seq_nr == last.get(pid, 0) + 1, f"{label}: {pid} seq {seq_nr} after {last.get(pid, 0)}"
            last[pid] = seq_nr
        if consumer.restarts:
            assert consumer.restart_count >= 2
    return consumers


def test_torture_default_mode(dsn: str) -> None:
    """PostgreSQL: the visibility horizon keeps the main cursor behind every open transaction (shorter than
    backtracking_behind_current_time), so restarts from an offset are exact."""
    run_torture(dsn, 8, backtracking_behind_current_time=3.0)


@pytest.mark.postgres_only("group commit (READ COMMITTED PostgreSQL)")
def test_torture_group_commit(dsn: str) -> None:
    """The writers outnumber the pool's connections, so their appends ride in group commits (one transaction per
    group, each append stamped while its statement holds the write lock): the horizon rule holds for them."""
    run_torture(dsn, 8, backtracking_behind_current_time=3.0, pool_max_size=4, grouped=True)


def test_torture_portable_mode(dsn: str) -> None:
    """Portable: exact across restarts when behind_current_time exceeds the longest writing transaction."""
    run_torture(dsn, 8, portable=True, behind_current_time=2.5, backtracking_behind_current_time=3.0)


def test_torture_portable_backtracking(dsn: str) -> None:
    """Portable with a short behind_current_time: the main cursor passes open transactions and
    backtracking must find their events; the gate keeps per-pid order, and fills the gaps the gap writer
    makes. The consumers restart from their last offset meanwhile, often while a transaction whose event lies
    below that offset is still open: the offset says what it settled, and the restarted query delivers it."""
    run_torture(dsn, 8, portable=True, behind_current_time=0.05, backtracking_behind_current_time=2.5,
                gaps=True)


@pytest.mark.slow
@pytest.mark.parametrize("portable", [False, True])
def test_torture_long(dsn: str, portable: bool) -> None:
    settings: dict[str, object] = {"backtracking_behind_current_time": 3.0}
    if portable:
        settings.update(portable=True, behind_current_time=2.5)
    run_torture(dsn, 60, **settings)
