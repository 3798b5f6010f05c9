"""Torture across databases: a journal sharded over 2 databases (on one server, and on two embedded servers),
writers appending to slices of both (some holding their transaction open up to 2 s, so their events commit 'in
the past'), live consumers per slice range, each reading its range's database and restarted from its last
offset at random. Every consumer sees every event of its range exactly once, in sequence order per persistence
id (the single-database torture is tests/end_to_end/test_torture_slices.py)."""

from __future__ import annotations

import hashlib
import random
import threading
import uuid
from collections.abc import Callable, Iterator

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql
from support import FAST
from support.database import own_embedded_server
from support.eventually import eventually
from support.restarting import Consumer, check_delivered, consume
from support.torture import ENTITY, fast_writer, run_for_at_least, slow_writer, written_rows

from pgjournal import EventEnvelope, slice_for_persistence_id, slice_ranges
from pgjournal.model.offsets import Offset
from pgjournal.runtime.live import LiveQuery
from pgjournal.server.embedded import EmbeddedServer
from pgjournal.shards import ShardedJournal

COUNT = "SELECT count(*) FROM event_journal WHERE entity_type = %s"

pytestmark = [pytest.mark.timing, pytest.mark.mode_independent]


def by_seq_nr(envelope: EventEnvelope) -> tuple[str, int]:
    return envelope.persistence_id, envelope.seq_nr


def hashed_pids(tag: str, count: int, lo: int = 0, hi: int = 1023) -> list[str]:
    """``count`` persistence ids with slices in ``lo..hi`` (hashed: ``x-1``, ``x-2``... share neighbouring
    slices)."""
    pids = (f"{ENTITY}|{hashlib.sha1(f'{tag}-{k}'.encode()).hexdigest()[:12]}" for k in range(100_000))
    return [pid for pid in pids if lo <= slice_for_persistence_id(pid) <= hi][:count]


def run_sharded_torture(dsns: list[str], seconds: float) -> None:
    config = {**FAST, "buffer_size": 50, "backtracking_behind_current_time": 3.0}
    with ShardedJournal.open(dsns, migrate=True, **config) as journal:
        # 4 ranges (2 in each database) and each database's whole range
        consumers = [Consumer(True, lo, hi) for lo, hi in (*slice_ranges(4), *journal.shards.ranges)]
        stop_writers, stop_consumers = threading.Event(), threading.Event()

        def stream(c: Consumer) -> Callable[[Offset], LiveQuery[EventEnvelope]]:
            return lambda offset: journal.query.events_by_slices(ENTITY, c.min_slice, c.max_slice, offset)

        readers = [threading.Thread(target=consume, args=(stream(c), by_seq_nr, c, stop_consumers, random.Random(i)))
                   for i, c in enumerate(consumers)]
        shared = hashed_pids("fast", 40)
        writers = [threading.Thread(target=fast_writer, args=(journal, stop_writers, random.Random(100 + i), shared))
                   for i in range(6)]
        # slow writers on each database's own connection, to persistence ids of its range
        writers += [threading.Thread(target=slow_writer, args=(dsn, stop_writers, random.Random(200 + 10 * d + i),
                                                               hashed_pids(f"slow-{d}-{i}", 5, lo, hi)))
                    for d, (dsn, (lo, hi)) in enumerate(zip(dsns, journal.shards.ranges, strict=True))
                    for i in range(2)]
        for t in readers + writers:
            t.start()
        run_for_at_least(seconds, lambda: all(written_rows(dsn, COUNT, ENTITY) > 100 for dsn in dsns),
                         "the writers wrote enough to each database to prove anything")
        stop_writers.set()
        for t in writers:
            t.join(10)
        written: list[set[tuple[str, int]]] = []
        for dsn in dsns:
            with psycopg.connect(dsn) as conn:
                written.append(set(conn.execute("SELECT persistence_id, seq_nr FROM event_journal "
                                                "WHERE entity_type = %s", (ENTITY,)).fetchall()))
        everything = written[0] | written[1]
        expected = [{(p, s) for p, s in everything if c.min_slice <= slice_for_persistence_id(p) <= c.max_slice}
                    for c in consumers]
        try:
            eventually(lambda: all(set(c.delivered) >= e or c.error for c, e in zip(consumers, expected, strict=True)),
                       "every consumer caught up", timeout=30, interval=0.2)
        except AssertionError:
            pass  # check_delivered below says what is missing
        finally:
            stop_consumers.set()
            for t in readers:
                t.join(10)
    for (lo, hi), rows in zip(((0, 511), (512, 1023)), written, strict=True):
        assert len(rows) > 100, f"the writers wrote too little to database {lo}-{hi} to prove anything"
        assert all(lo <= slice_for_persistence_id(p) <= hi for p, _ in rows), f"a row outside {lo}-{hi}"
    for consumer, wanted in zip(consumers, expected, strict=True):
        check_delivered(consumer, wanted)
        assert consumer.restart_count >= 2


def test_torture_across_two_databases(shard_databases: Callable[..., list[str]]) -> None:
    run_sharded_torture(shard_databases(2), 8)


@pytest.fixture(scope="module")
def second_server() -> Iterator[EmbeddedServer]:
    """A private embedded server of this module: the second database of a journal over two servers."""
    with own_embedded_server("pgjournal-shard-") as server:
        yield server


def test_torture_across_two_servers(shard_databases: Callable[..., list[str]], second_server: EmbeddedServer
                                    ) -> None:
    name = f"shard_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(second_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    run_sharded_torture([shard_databases(1)[0], psycopg.conninfo.make_conninfo(second_server.dsn, dbname=name)], 6)
